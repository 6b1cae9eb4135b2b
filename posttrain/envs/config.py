"""`EnvConfig` (the ``env`` section of `posttrain rl`, and of an ``env`` benchmark of `posttrain
eval`) and the environment registry.

``name`` picks the environment:

- ``calculator``, ``code_repair``, ``repo``: the embedded ones (`posttrain.envs.calculator`,
  `posttrain.envs.code_repair`, `posttrain.envs.repo`);
- ``swe``: SWE-bench-format tasks on local repositories (`posttrain.envs.swe`);
- ``openenv``: an OpenEnv server (``options.url`` or ``options.launch``; `posttrain.envs.openenv`);
- ``skyrl:<id>``: a SkyRL-gym environment, e.g. ``skyrl:gsm8k_multi_turn`` (`posttrain.envs.skyrl`);
- ``verifiers:<taskset id>``: a Prime Intellect verifiers v1 environment, run in ``.venv-verifiers``
  (`posttrain.envs.vf_env`);
- ``agent``: your own agent, unchanged, calling the model through a per-episode OpenAI-compatible
  endpoint (``agent`` or ``agent_cmd``; `posttrain.envs.agent`);
- ``package.module:factory``: your own — a class or function called with ``options`` as keyword
  arguments that returns an `Environment`.

Each episode gets a fresh environment from the factory.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from posttrain.config import ConfigValueError
from posttrain.envs.base import EnvInfraError, Environment
from posttrain.envs.runner import EpisodeLimits
from posttrain.envs.tool_env import MALFORMED_POLICIES, ToolEnv
from posttrain.envs.tools import TOOLS_STYLES
from posttrain.errors import UserError

EMBEDDED = {"calculator": "posttrain.envs.calculator:CalculatorEnv",
            "code_repair": "posttrain.envs.code_repair:CodeRepairEnv",
            "repo": "posttrain.envs.repo:RepoEnv",
            "swe": "posttrain.envs.swe:SweEnv",
            "openenv": "posttrain.envs.openenv:OpenEnvEnv"}


@dataclasses.dataclass(kw_only=True)
class EnvConfig:
    name: str = ""
    """Multi-turn environment: calculator, code_repair, repo, swe, openenv, skyrl:<id>, verifiers:<taskset>,
    agent (your agent: env.agent or env.agent_cmd) or package.module:factory;
    empty = single-turn prompts judged by the verifier (docs/envs.md)."""
    max_turns: int = 4
    """Most model turns per episode (the environment may stop sooner)."""
    max_total_tokens: int = 512
    """Most tokens in an episode's sample: prompt, model turns and environment replies. Each turn
    generates at most rollout.max_new_tokens."""
    step_timeout_s: float = 30.0
    """Wall-clock limit of one reset or step of the environment, its time on the sandbox pool left
    out; past it the episode is INFRA_FAIL."""
    episode_timeout_s: float = 0.0
    """Wall-clock limit of a whole episode, the model's turns included (0 = none); past it the
    episode ends as INFRA_FAIL (episode_timeout, masked), so a straggler never holds its group."""
    tools_style: str = ""
    """How a tool environment offers its tools when the chat template has no tool format: json
    (schemas in a system message), compact (one line per tool) or none; empty = the environment's default."""
    on_malformed_tool_call: str = "continue"
    """continue (show the model the error and go on) or end (MODEL_FAIL malformed_tool_call)."""
    split_on_prefix_break: bool = True
    """Where the chat template re-renders the history, start a new sample from its rendering
    (false: the episode ends there as INFRA_FAIL)."""
    agent: str = ""
    """name=agent: package.module:function called per episode in a thread as
    run(task, base_url, api_key) -> reward or {reward: ...} (docs/agents.md)."""
    agent_cmd: str = ""
    """name=agent: a command run per episode with OPENAI_BASE_URL / POSTTRAIN_BASE_URL / OPENAI_API_KEY
    set and the task as JSON on stdin; the last line of its stdout is the reward as JSON."""
    agent_timeout_s: float = 300.0
    """name=agent: deadline of one agent run, its model calls included; past it the episode is
    INFRA_FAIL (agent_timeout, masked) and a command is killed."""
    agent_max_calls: int = 64
    """name=agent: most model calls one episode's endpoint answers (more get HTTP 429 and end the
    episode as MODEL_FAIL max_turns); env.max_turns bounds the answered ones too."""
    agent_max_request_bytes: int = 8388608
    """name=agent: largest request body the endpoint reads (more get HTTP 413)."""
    agent_host: str = "127.0.0.1"
    """name=agent: the address the endpoint listens on; loopback unless an agent runs elsewhere
    (each episode's path and key are its own either way)."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the environment's constructor (e.g. {max_turns: 3} or a SkyRL env_config)."""

    def __post_init__(self):
        if self.max_turns < 1:
            raise ConfigValueError("max_turns", "must be >= 1")
        if self.max_total_tokens < 2:
            raise ConfigValueError("max_total_tokens", "must be >= 2")
        if self.step_timeout_s <= 0:
            raise ConfigValueError("step_timeout_s", "must be > 0")
        if self.episode_timeout_s < 0:
            raise ConfigValueError("episode_timeout_s", "must be >= 0 (0 = no limit)")
        if self.tools_style and self.tools_style not in TOOLS_STYLES:
            raise ConfigValueError("tools_style", f"must be one of {', '.join(TOOLS_STYLES)} (or empty)")
        if self.on_malformed_tool_call not in MALFORMED_POLICIES:
            raise ConfigValueError("on_malformed_tool_call", f"must be one of {', '.join(MALFORMED_POLICIES)}")
        if self.name in ("skyrl:", "verifiers:"):
            raise ConfigValueError("name", f"{self.name}<id> needs an id after the colon")
        if self.name and not (self.name in EMBEDDED or self.name == "agent" or ":" in self.name):
            raise ConfigValueError("name", f"must be {', '.join(EMBEDDED)}, skyrl:<id>, verifiers:<taskset>, agent "
                                           "or package.module:factory")
        self._check_agent()

    def _check_agent(self) -> None:
        if self.name != "agent":
            for key in ("agent", "agent_cmd"):
                if getattr(self, key):
                    raise ConfigValueError(key, "is read only with env.name=agent")
            return
        if bool(self.agent) == bool(self.agent_cmd):
            raise ConfigValueError("agent", "env.name=agent needs one of env.agent (package.module:function) "
                                            "or env.agent_cmd (a command)")
        if self.agent_timeout_s <= 0:
            raise ConfigValueError("agent_timeout_s", "must be > 0")
        if self.agent_max_calls < 1:
            raise ConfigValueError("agent_max_calls", "must be >= 1")
        if self.agent_max_request_bytes < 1:
            raise ConfigValueError("agent_max_request_bytes", "must be >= 1")

    @property
    def limits(self) -> EpisodeLimits:
        return EpisodeLimits(max_turns=self.max_turns, max_total_tokens=self.max_total_tokens,
                             step_timeout_s=self.step_timeout_s, episode_timeout_s=self.episode_timeout_s,
                             split_on_prefix_break=self.split_on_prefix_break)


def _resolve(spec: str) -> Callable[..., Environment]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise UserError(f"env.name={spec!r}: cannot import module {module_name!r} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"env.name={spec!r}: module {module_name!r} has no callable {attr!r}")
    return factory


def env_factory(cfg: EnvConfig) -> Callable[[], Environment]:
    """A function making a fresh environment per episode; checks one can be made (UserError if not)."""
    options = dict(cfg.options)
    if cfg.name.startswith("skyrl:"):
        from posttrain.envs.skyrl import SkyRLEnv

        factory, options = SkyRLEnv, {"env_id": cfg.name.partition(":")[2], **options}
        if "max_turns" not in options:
            options["max_turns"] = cfg.max_turns
    elif cfg.name.startswith("verifiers:"):
        from posttrain.envs.vf_env import VerifiersEnv

        factory, options = VerifiersEnv, {"taskset": cfg.name.partition(":")[2], **options}
        if cfg.tools_style:
            options.setdefault("tools_style", cfg.tools_style)
    elif cfg.name == "agent":
        from posttrain.envs.agent import AgentEnv

        factory = AgentEnv
        options = {"agent": cfg.agent, "agent_cmd": cfg.agent_cmd, "timeout_s": cfg.agent_timeout_s,
                   "max_calls": cfg.agent_max_calls, "max_request_bytes": cfg.agent_max_request_bytes,
                   "host": cfg.agent_host, **({"tools_style": cfg.tools_style} if cfg.tools_style else {}), **options}
    else:
        factory = _resolve(EMBEDDED.get(cfg.name, cfg.name))

    def make() -> Environment:
        env = factory(**options)
        if isinstance(env, ToolEnv):
            env.on_malformed = cfg.on_malformed_tool_call
            env.tools_style = cfg.tools_style or env.tools_style
        return env

    try:
        probe = make()
    except (TypeError, ValueError, ImportError, EnvInfraError) as e:
        raise UserError(f"env.name={cfg.name!r}: cannot make the environment with options {options} ({e})") from None
    if not isinstance(probe, Environment):
        raise UserError(f"env.name={cfg.name!r}: the factory returned {type(probe).__name__}, not an Environment")
    return make
