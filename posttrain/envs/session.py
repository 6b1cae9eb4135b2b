"""`EnvSession`: what a training or evaluation loop needs from environments, in two calls.

``generate(engine, examples, n, sampling) -> (rollouts, outcomes)`` runs ``n`` episodes of each
example and returns them in the shape of a single-turn generation — one `Rollouts` row per
episode (``loss_mask`` marking the model's tokens) and one `Outcome` per row — so the RL loop's
learn step (batching, advantages, importance weights, update) is the same code for both.
``metrics()`` are the episodes' ``env/*`` figures of the last call.

An episode split at a prefix break (`posttrain.envs.trajectory`) trains on its last segment
only in RL (the loop's groups are G rows): the earlier segments are dropped and counted
(``env/prefix_break_frac``). Evaluation uses every episode whole.
"""

from __future__ import annotations

from posttrain.envs.config import EnvConfig, env_factory
from posttrain.envs.runner import EpisodeRunner
from posttrain.envs.trajectory import Episode, episode_metrics, episodes_to_rollouts
from posttrain.outcome import Outcome, OutcomeClass
from posttrain.rollout.types import Rollouts, SamplingParams


class EnvSession:
    def __init__(self, cfg: EnvConfig, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.make_env = env_factory(cfg)
        self.last: list[Episode] = []

    def episodes(self, engine, examples: list[dict], n: int, sampling: SamplingParams) -> list[Episode]:
        self.last = EpisodeRunner(engine, self.tokenizer, self.make_env, self.cfg.limits).run(examples, n, sampling)
        return self.last

    def generate(self, engine, examples: list[dict], n: int, sampling: SamplingParams) -> tuple[Rollouts, list[Outcome]]:
        episodes = self.episodes(engine, examples, n, sampling)
        ro, _ = episodes_to_rollouts(episodes, sampling, segments="last", tokenizer=self.tokenizer)
        return ro, [e.outcome for e in episodes]

    def metrics(self) -> dict:
        return episode_metrics(self.last) if self.last else {}

    def evaluate(self, engine, examples: list[dict], sampling: SamplingParams, bench: str = "heldout") -> dict:
        """Greedy pass@1 of one episode per example, and its ``env/*`` figures, as
        ``eval/<bench>/greedy/...`` metrics (what the RL loop logs at eval steps)."""
        episodes = self.episodes(engine, examples, 1, sampling)
        head = f"eval/{bench}/greedy"
        passed = sum(e.outcome.cls is OutcomeClass.PASS for e in episodes) / max(len(episodes), 1)
        env = {f"{head}/{k}": v for k, v in episode_metrics(episodes).items() if not k.endswith("pass_frac")}
        return {f"{head}/pass@1": passed, f"{head}/mean_length": sum(e.model_tokens for e in episodes) / max(len(episodes), 1),
                **env}
