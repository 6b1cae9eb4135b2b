"""`EnvSession`: what a training or evaluation loop needs from environments, in two calls.

``generate(engine, examples, n, sampling) -> (rollouts, outcomes, episode_of_row)`` runs ``n``
episodes of each example and returns them in the shape of a single-turn generation — `Rollouts`
rows (``loss_mask`` marking the model's tokens), one `Outcome` per episode and the episode of
each row — so the RL loop's learn step (batching, advantages, importance weights, update) is the
same code for both. ``metrics()`` are the episodes' ``env/*`` figures of the last call.

An episode is one row, unless the chat template rewrote its history (a prefix break,
`posttrain.envs.trajectory`): then each of its segments is a row, every one trained, with the
episode's outcome and advantage; the loss counts the episode once as a sequence
(`posttrain.rl.batch`). ``env/segments_mean`` counts the rows per episode.
"""

from __future__ import annotations

from posttrain.envs.config import EnvConfig, env_factory
from posttrain.envs.runner import EpisodeRunner, drive
from posttrain.envs.trajectory import Episode, episode_metrics, episodes_to_rollouts
from posttrain.outcome import Outcome, OutcomeClass, ungraded_fracs, ungraded_metrics
from posttrain.rollout.types import Rollouts, SamplingParams


class EnvSession:
    def __init__(self, cfg: EnvConfig, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.make_env = env_factory(cfg)
        self.last: list[Episode] = []

    def runner(self, engine=None) -> EpisodeRunner:
        return EpisodeRunner(engine, self.tokenizer, self.make_env, self.cfg.limits)

    def episodes(self, engine, examples: list[dict], n: int, sampling: SamplingParams) -> list[Episode]:
        self.last = self.runner(engine).run(examples, n, sampling)
        return self.last

    def generate(self, engine, examples: list[dict], n: int,
                 sampling: SamplingParams) -> tuple[Rollouts, list[Outcome], list[int]]:
        ro, outcomes, episode_of_row, self.last = drive(self.requests(examples, n, sampling), engine)
        return ro, outcomes, episode_of_row

    def requests(self, examples: list[dict], n: int, sampling: SamplingParams):
        """`generate` as a generator of engine calls (`EpisodeRunner.steps`); it returns
        ``(rollouts, outcomes, episode_of_row, episodes)``. Async RL drives it turn by turn."""
        episodes = yield from self.runner().steps(examples, n, sampling)
        ro, episode_of_row = episodes_to_rollouts(episodes, sampling, segments="all", tokenizer=self.tokenizer)
        return ro, [e.outcome for e in episodes], episode_of_row, episodes

    def metrics(self) -> dict:
        return episode_metrics(self.last) if self.last else {}

    def evaluate(self, engine, examples: list[dict], sampling: SamplingParams, bench: str = "heldout") -> dict:
        """Greedy pass@1 of one episode per example, and its ``env/*`` figures, as
        ``eval/<bench>/greedy/...`` metrics (what the RL loop logs at eval steps)."""
        episodes = self.episodes(engine, examples, 1, sampling)
        head = f"eval/{bench}/greedy"
        passed = sum(e.outcome.cls is OutcomeClass.PASS for e in episodes) / max(len(episodes), 1)
        env = {f"{head}/{k}": v for k, v in episode_metrics(episodes).items()
               if not k.endswith("pass_frac") and not k.startswith("time/")}
        return {f"{head}/pass@1": passed, f"{head}/mean_length": sum(e.model_tokens for e in episodes) / max(len(episodes), 1),
                **env, **ungraded_metrics(ungraded_fracs([e.outcome for e in episodes]), head)}
