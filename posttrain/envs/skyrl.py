"""Adapter: SkyRL-gym environments (``skyrl_gym``, the optional ``envs`` extra) as posttrain
environments.

SkyRL-gym's text environments (`skyrl_gym.envs.base_text_env.BaseTextEnv`) are made per episode
with ``skyrl_gym.make(id, env_config=..., extras=...)``, opened with ``init(prompt_messages)``
and driven with ``step(action_text) -> {observations, reward, done, metadata}``. That is our
``reset`` / ``step`` with other names, so the adapter is thin:

- ``reset(example)``: the example's ``prompt`` (a string or messages) becomes the chat prompt;
  ``extras`` are ``{"reward_spec": {"method": "rule", "ground_truth": example["answer"]},
  "extra_info": example.get("extra_info", {}), "max_turns": max_turns}`` merged with the
  example's own ``extras`` when it has them (SkyRL's dataset rows carry them);
- ``step(text)``: observations (messages) go back to the model; the episode's verdict when done
  is PASS when the last turn's reward reaches ``pass_threshold``, else MODEL_FAIL with that
  reward. An exception inside the package is INFRA_FAIL, as for any environment.

Tested offline with ``gsm8k`` and ``gsm8k_multi_turn`` (rule-based rewards, no network).
"""

from __future__ import annotations

from posttrain.envs.base import Environment, EnvTaskError, StepResult
from posttrain.outcome import Outcome


def _import_skyrl():
    try:
        import skyrl_gym
    except ImportError:
        raise ImportError("SkyRL-gym environments need the skyrl-gym package: bash scripts/setup.sh envs (from a checkout: pip install -e '.[envs]')") from None
    return skyrl_gym


class SkyRLEnv(Environment):
    def __init__(self, env_id: str, *, env_config: dict | None = None, max_turns: int = 5,
                 pass_threshold: float = 1.0):
        _import_skyrl()
        self.env_id, self.env_config = env_id, dict(env_config or {})
        self.max_turns, self.pass_threshold = max_turns, pass_threshold
        self.env = None

    def reset(self, example: dict) -> list[dict]:
        skyrl_gym = _import_skyrl()
        if example.get("answer") is None and "extras" not in example:
            raise EnvTaskError("the example has no 'answer' (ground truth) and no 'extras'")
        extras = {"reward_spec": {"method": "rule", "ground_truth": str(example.get("answer"))},
                  "extra_info": dict(example.get("extra_info") or {}), "max_turns": self.max_turns}
        extras |= example.get("extras") or {}
        self.env = skyrl_gym.make(self.env_id, env_config=self.env_config, extras=extras)
        prompt = example["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        observation, _info = self.env.init(messages)
        return list(observation)

    def step(self, text: str) -> StepResult:
        out = self.env.step(text)
        reward, done = float(out["reward"]), bool(out["done"])
        outcome = None
        if done:
            outcome = Outcome.passed(reward) if reward >= self.pass_threshold else \
                Outcome.model_fail("wrong_answer", reward=reward)
        return StepResult(observation=list(out.get("observations") or []), reward=reward, done=done,
                          outcome=outcome, info=dict(out.get("metadata") or {}))

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
