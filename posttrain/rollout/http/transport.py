"""How a client reaches rollout servers: the bearer token, the readiness check every server must
pass before a run starts, and the routes of ``posttrain serve`` (`PosttrainDialect`; vLLM's and
SGLang's are `posttrain.rollout.vllm` and `posttrain.rollout.sglang`)."""

from __future__ import annotations

import os

import httpx


class ServerUnreachable(RuntimeError):
    """A rollout server did not answer its health check: an outage, not bad input (exit 1)."""


def base_url(url: str) -> str:
    return url.rstrip("/")


class PosttrainDialect:
    """The routes and fields of ``posttrain serve`` (see `posttrain.rollout.vllm` for vLLM's)."""

    name = "posttrain"
    check_timeout_s = 10.0

    def check_server(self, client: httpx.Client, url: str, probe_prompt: list[int]) -> int:
        """Its weight version, once ``GET /health`` answers ``{"status": "ok"}``."""
        r = client.get(f"{url}/health")
        body = r.json() if r.status_code == 200 else None
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise RuntimeError(f"GET /health answered {answer(r)}")
        return int(body.get("version", 0))

    def body(self, body: dict) -> dict:
        return {**body, "return_token_ids": True}

    @staticmethod
    def truncated_logprobs(choice: dict) -> list[float] | None:
        truncated = choice.get("truncated_logprobs")
        return None if truncated is None else [float(x) for x in truncated]

    def push(self, client: httpx.Client, url: str, folder: str, version: int, checksum: str, probe,
             dtype: str | None = None) -> str:
        """'' when the server confirmed the version and checksum it loaded (and the ``dtype`` it was
        asked to hold them in), else what it answered."""
        body = {"model_path": folder, "version": version, "checksum": checksum}
        if dtype is not None:
            body["dtype"] = dtype
        r = client.post(f"{url}/update_weights_from_disk", json=body)
        try:
            got = r.json()
        except ValueError:
            return f"HTTP {r.status_code} {one_line(r.text)}"
        confirmed = (r.status_code == 200 and isinstance(got, dict) and got.get("success") is True
                     and got.get("version") == version and got.get("checksum") == checksum
                     and (dtype is None or got.get("dtype") == dtype))
        return "" if confirmed else f"HTTP {r.status_code} {one_line(got)}"


PROBE_PROMPT = [1, 2, 3, 4]
"""Token ids a server is asked about when it starts (any model has them)."""


API_KEY_ENV = "POSTTRAIN_API_KEY"
"""The environment variable a client takes its servers' API key from (never a config file, which
runs write out)."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def check_servers(urls: list[str], timeout_s: float | None = None, dialect=None,
                  api_key: str | None = None) -> list[int]:
    """Every server's readiness (health, and what the dialect needs) and weight version, or
    `ServerUnreachable` naming the first server that is not ready. ``timeout_s`` per request;
    default: the dialect's ``check_timeout_s``. ``api_key``: default ``$POSTTRAIN_API_KEY``."""
    if not urls:
        raise ServerUnreachable("no rollout server given (set rollout.urls=[http://host:port, ...])")
    dialect = dialect or PosttrainDialect()
    versions = []
    with httpx.Client(timeout=timeout_s or dialect.check_timeout_s, headers=auth_headers(api_key)) as client:
        for url in urls:
            try:
                versions.append(dialect.check_server(client, base_url(url), PROBE_PROMPT))
            except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as e:
                raise ServerUnreachable(f"rollout server {url} is unreachable: {one_line(e)}") from None
            except RuntimeError as e:
                raise ServerUnreachable(f"rollout server {url} is not ready: {one_line(e)}") from None
    return versions


def answer(r: httpx.Response) -> str:
    """An HTTP answer in one line: the status and, when the server said why, its message; never
    the body of an HTML page (a proxy's or another program's 404 page)."""
    status = f"{r.status_code} {r.reason_phrase}".strip()
    try:
        body = r.json()
    except ValueError:
        text = r.text.lstrip()
        return status if not text or text.startswith("<") else f"{status}: {one_line(text)[:200]}"
    if isinstance(body, dict):
        error = body.get("error")
        said = error.get("message") if isinstance(error, dict) else error or body.get("detail") or body.get("message")
        if said:
            return f"{status}: {one_line(said)[:200]}"
    return f"{status}: {one_line(body)[:200]}"


def one_line(x) -> str:
    text = " ".join(str(x).split()) or type(x).__name__
    return text if len(text) <= 300 else text[:297] + "..."
