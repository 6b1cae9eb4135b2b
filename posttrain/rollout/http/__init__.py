"""`HTTPEngine`, the client of OpenAI-compatible rollout servers (``posttrain serve``, vLLM,
SGLang): `posttrain.rollout.http.engine` says how it works, and the modules beside it hold its parts.
"""

from posttrain.rollout.http.completions import model_eos_ids
from posttrain.rollout.http.engine import HTTPEngine
from posttrain.rollout.http.pool import ServersDown
from posttrain.rollout.http.transport import (
    API_KEY_ENV,
    PROBE_PROMPT,
    PosttrainDialect,
    ServerUnreachable,
    auth_headers,
    check_servers,
)

__all__ = [
    "API_KEY_ENV",
    "HTTPEngine",
    "PROBE_PROMPT",
    "PosttrainDialect",
    "ServerUnreachable",
    "ServersDown",
    "auth_headers",
    "check_servers",
    "model_eos_ids",
]
