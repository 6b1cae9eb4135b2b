"""Multi-turn environments with tools, and token-exact trajectories for RL and evaluation.

- `base`: the `Environment` interface (``reset(example) -> messages``, ``step(text) -> StepResult``)
  and who is at fault for what (outcome classes);
- `tools`: tools as typed Python functions, their JSON schemas, the ``<tool_call>`` syntax;
  `tool_env.ToolEnv`: call tools until a final answer;
- `runner`: G episodes per example, one batched model turn at a time, ids appended verbatim;
- `trajectory`: episodes, samples with a per-token loss mask, conversion to `Rollouts`;
- `session`: what the RL loop and `posttrain eval` call; `config`: the ``env`` section, the registry;
- embedded environments: `calculator`, `code_repair`; an adapter for SkyRL-gym: `skyrl`.

See docs/envs.md.
"""

from posttrain.envs.base import Environment, EnvInfraError, EnvTaskError, StepResult
from posttrain.envs.runner import EpisodeLimits, EpisodeRunner, run_episodes
from posttrain.envs.tool_env import ToolEnv
from posttrain.envs.tools import MalformedCall, Tool, ToolCall, parse_tool_calls, tool
from posttrain.envs.trajectory import Episode, Segment, episode_metrics, episodes_to_rollouts

__all__ = ["Environment", "EnvInfraError", "EnvTaskError", "Episode", "EpisodeLimits", "EpisodeRunner",
           "MalformedCall", "Segment", "StepResult", "Tool", "ToolCall", "ToolEnv", "episode_metrics",
           "episodes_to_rollouts", "parse_tool_calls", "run_episodes", "tool"]
