"""The episode runner: G episodes per example, one model turn at a time, token-exact.

Each round the engine generates one turn for every live episode in a single batched
``generate`` call (the prompts are the episodes' current histories, as ids). Then every live
environment's ``step`` runs, in parallel threads under a wall-clock limit, and the runner
appends the environment's reply:

1. the history is never re-tokenised: the next prompt is the previous prompt's ids, the ids the
   model sampled, then the ids of the environment's reply;
2. the reply's ids are the tokenisation of the *text the chat template adds* after the model's
   turn: the template renders the whole conversation (with the new messages and the generation
   prompt) and the runner takes what follows the text the model has seen plus the model's own
   raw text. For ChatML that is ``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n``
   (with ``<|im_end|>`` first when the turn ended on a stop string or a length limit);
3. when the rendering does not start with that text (the template rewrote the history, e.g.
   dropped an earlier ``<think>`` block; or the model ended its turn with a token the template
   does not write there), the prefix property is broken: the segment is closed and a new one
   starts from the template's rendering (`posttrain.envs.trajectory`).

Limits: ``max_turns`` model turns (the environment's own cap too), ``max_total_tokens`` per
segment (prompt included; each turn may generate up to the sampling's ``max_new_tokens`` and no
more than the room left), ``step_timeout_s`` per ``reset`` / ``step`` (its time on the sandbox
pool left out: the pool bounds that itself). A limit ends the episode with the environment's
``on_limit`` verdict (MODEL_FAIL by default). An environment that raises or times out ends its
episode as INFRA_FAIL (TASK_FAIL for `EnvTaskError`); the others go on.
Every verdict passes `posttrain.outcome.checked` here, so a NaN or infinite reward from any
environment or adapter is INFRA_FAIL (verifier_error).
A timed-out step's thread cannot be killed: it is abandoned, and its environment never reused.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Callable

from posttrain.data.chat import stop_token_ids
from posttrain.envs.base import Environment, EnvInfraError, EnvTaskError, StepResult, default_outcome
from posttrain.envs.tools import template_takes_tools, with_tools_message
from posttrain.envs.trajectory import Episode, Segment
from posttrain.outcome import Outcome, checked
from posttrain.rollout.types import SamplingParams
from posttrain.sandbox.clock import PoolClock, charged_to


@dataclasses.dataclass(kw_only=True)
class EpisodeLimits:
    max_turns: int = 4
    """Most model turns per episode."""
    max_total_tokens: int = 1024
    """Most tokens in a sample (prompt + model turns + environment replies)."""
    step_timeout_s: float = 30.0
    """Wall-clock limit of one reset or step, its time on the sandbox pool (queued or running, bounded
    by the pool's own limits) left out; past it the episode is INFRA_FAIL (env_timeout)."""
    episode_timeout_s: float = 0.0
    """Wall-clock limit of a whole episode, its model turns included (0 = none); past it the
    episode ends as INFRA_FAIL (episode_timeout): a straggler never holds its group forever."""
    split_on_prefix_break: bool = True
    """Close the sample and start a new one where the template re-renders the history differently;
    False: end the episode there as INFRA_FAIL (prefix_break) instead."""


class _Live:
    """One episode in progress."""

    def __init__(self, episode: Episode, env: Environment):
        self.episode, self.env = episode, env
        self.text = ""        # the current segment's context as text: what the model has seen
        self.abandoned = False

    @property
    def seg(self) -> Segment:
        return self.episode.segments[-1]

    @property
    def context_ids(self) -> list[int]:
        return self.seg.prompt_ids + self.seg.completion_ids

    def finish(self, outcome: Outcome) -> None:
        self.episode.outcome = checked(outcome)


def _outcome_of_error(e: BaseException) -> Outcome:
    if isinstance(e, cf.TimeoutError):
        return Outcome.infra_fail("env_timeout", "the environment did not answer in time")
    if isinstance(e, EnvTaskError):
        return Outcome.task_fail(e.reason or "env_task_error", f"{type(e).__name__}: {e}")
    kind = (e.reason or "env_infra_error") if isinstance(e, EnvInfraError) else "env_error"
    return Outcome.infra_fail(kind, f"{type(e).__name__}: {e}")


class EpisodeRunner:
    """Runs episodes of the environments made by ``make_env`` with ``engine`` (see module docstring)."""

    def __init__(self, engine, tokenizer, make_env: Callable[[], Environment], limits: EpisodeLimits):
        self.engine, self.tokenizer, self.make_env, self.limits = engine, tokenizer, make_env, limits
        self.end_ids = set(stop_token_ids(tokenizer, True))

    # ------------------------------------------------------------------------------- rendering
    def render(self, env: Environment, messages: list[dict], add_generation_prompt: bool) -> str:
        tools = list(getattr(env, "tools", None) or [])
        kwargs = {}
        if tools and template_takes_tools(self.tokenizer):
            kwargs["tools"] = [t.schema for t in tools]
        else:
            messages = with_tools_message(messages, tools, getattr(env, "tools_style", "json"))
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------------------------ calls
    def _call_all(self, fns: list[Callable[[], object]], until: float = float("inf")) -> list[object]:
        """Run ``fns`` in parallel daemon threads; each result is its value, the exception it
        raised, or `concurrent.futures.TimeoutError` when it overran the limit or the monotonic
        time ``until`` (its thread is left behind: a daemon, so a hung environment cannot keep the
        process alive). The limit leaves out each call's time on the sandbox pool
        (`posttrain.sandbox.clock`): queued behind other episodes' programs, or running its own
        under the sandbox's limits, a call is not hanging."""
        out: list[object] = [cf.TimeoutError()] * len(fns)
        clocks = [PoolClock() for _ in fns]

        def work(i: int) -> None:
            try:
                with charged_to(clocks[i]):
                    out[i] = fns[i]()
            except BaseException as e:  # noqa: BLE001 - every failure of an environment is a verdict
                out[i] = e

        threads = [threading.Thread(target=work, args=(i,), daemon=True, name="env-step") for i in range(len(fns))]
        for t in threads:
            t.start()
        start = time.monotonic()
        for t, clock in zip(threads, clocks):
            while t.is_alive():  # read at each wake: the deadline moves on while the call is on the pool
                left = min(start + self.limits.step_timeout_s + clock.seconds(), until) - time.monotonic()
                if left <= 0:
                    break
                t.join(left)
        return [cf.TimeoutError() if t.is_alive() else r for t, r in zip(threads, out)]

    # -------------------------------------------------------------------------------- episodes
    def run(self, examples: list[dict], n: int, sampling: SamplingParams) -> list[Episode]:
        """``n`` episodes of each example, episodes of example i at i*n .. i*n+n-1."""
        return drive(self.steps(examples, n, sampling), self.engine)

    def steps(self, examples: list[dict], n: int, sampling: SamplingParams):
        """`run` as a generator of engine calls: it yields ``(prompts, n, sampling)`` for each model
        turn, is sent the `Rollouts` the engine answers, and returns the episodes. Whoever holds the
        engine drives it: `drive` with a blocking ``generate``, or async RL's controller with
        ``submit`` and ``poll`` while the trainer trains (`posttrain.rl.async_.controller`)."""
        lives = [self._make(i) for i in range(len(examples)) for _ in range(n)]
        limit = self.limits.episode_timeout_s
        until = time.monotonic() + limit if limit > 0 else float("inf")
        opened = self._call_all([lambda lv=lv: self._reset(lv, examples[lv.episode.example_idx]) for lv in lives], until)
        for lv, messages in zip(lives, opened):
            self._open(lv, messages)
        turn = 0
        try:
            while live := self._in_time([lv for lv in lives if lv.episode.outcome is None], until):
                yield from self._model_turn(live, n if turn == 0 and len(live) == len(lives) else 1, sampling, turn)
                stepping = [lv for lv in live if lv.episode.outcome is None]
                results = self._call_all([lambda lv=lv: lv.env.step(lv.episode.turn_texts[-1]) for lv in stepping],
                                         until)
                for lv, res in zip(stepping, results):
                    self._after_step(lv, res)
                self._in_time(stepping, until)
                turn += 1
        finally:
            for lv in lives:
                if not lv.abandoned:
                    try:
                        lv.env.close()
                    except Exception:  # closing is best effort; the verdict stands
                        pass
        return [lv.episode for lv in lives]

    def _make(self, example_idx: int) -> _Live:
        t0 = time.perf_counter()
        env = self.make_env()
        lv = _Live(Episode(example_idx=example_idx, segments=[], proxied=bool(getattr(env, "proxied", False))), env)
        lv.episode.reset_s = time.perf_counter() - t0
        return lv

    @staticmethod
    def _reset(lv: _Live, example: dict):
        t0 = time.perf_counter()
        try:
            return lv.env.reset(example)
        finally:
            lv.episode.reset_s += time.perf_counter() - t0

    def _in_time(self, live: list[_Live], until: float) -> list[_Live]:
        """``live`` once the episodes past ``episode_timeout_s`` have ended (INFRA_FAIL, masked)."""
        if time.monotonic() < until:
            return live
        for lv in live:
            if lv.episode.outcome is None or lv.episode.outcome.reason == "env_timeout":
                lv.episode.outcome = None
                lv.finish(Outcome.infra_fail("episode_timeout", f"the episode ran past episode_timeout_s="
                                                                f"{self.limits.episode_timeout_s:g}"))
        return []

    def _open(self, lv: _Live, messages) -> None:
        if isinstance(messages, BaseException) or not isinstance(messages, list):
            err = messages if isinstance(messages, BaseException) else TypeError(
                f"reset returned {type(messages).__name__}, not a list of messages")
            lv.abandoned = isinstance(err, cf.TimeoutError)
            lv.episode.segments.append(Segment(prompt_ids=[]))
            lv.finish(_outcome_of_error(err))
            return
        lv.episode.messages = list(messages)
        lv.text = self.render(lv.env, lv.episode.messages, True)
        lv.episode.segments.append(Segment(prompt_ids=self.encode(lv.text)))

    def _max_turns(self, lv: _Live) -> int:
        own = getattr(lv.env, "max_turns", None)
        return min(self.limits.max_turns, own) if own else self.limits.max_turns

    def _model_turn(self, live: list[_Live], n: int, sampling: SamplingParams, turn: int) -> None:
        """One batched generate call, yielded: a turn for every live episode (``n`` > 1 on the first
        turn when the G episodes of every example open with the same ids: each prompt is then
        prefilled once). An episode's policy version is the oldest that served any of its turns."""
        room = {id(lv): self.limits.max_total_tokens - len(lv.context_ids) for lv in live}
        for lv in live:
            if room[id(lv)] < 1 and lv.episode.turns == 0:
                lv.finish(Outcome.task_fail("prompt_too_long", f"the prompt has {len(lv.context_ids)} tokens; "
                                            f"max_total_tokens={self.limits.max_total_tokens}"))
            elif room[id(lv)] < 1:
                lv.finish(lv.env.on_limit("max_tokens"))
                lv.episode.finish_reason = "length"
        fits = [lv for lv in live if lv.episode.outcome is None]
        if not fits:
            return
        n, live = (n if len(fits) == len(live) and shared_openings(fits, n) else 1), fits
        stops = sorted({s for lv in live for s in getattr(lv.env, "stop", [])} | set(sampling.stop))
        seed = None if sampling.seed is None else (sampling.seed + 1_000_003 * turn) % 2**63
        params = dataclasses.replace(sampling, stop=stops, seed=seed,
                                     max_new_tokens=min(sampling.max_new_tokens, max(room[id(lv)] for lv in live)))
        prompts = [lv.context_ids for lv in live[::n]]
        ro = yield prompts, n, params
        for r, lv in enumerate(live):
            k = min(len(ro.completion_ids[r]), room[id(lv)])
            ids = ro.completion_ids[r][:k]
            # an engine without truncated log-probs sampled from the full distribution: the
            # behaviour log-probs are its sampler log-probs, as on the single-turn path
            truncated = ro.truncated_logprobs[r] if ro.truncated_logprobs else ro.logprobs[r]
            lv.seg.add(ids, model=True, logprobs=ro.logprobs[r][:k], truncated=truncated[:k])
            lv.episode.finish_reason = "length" if k < len(ro.completion_ids[r]) else ro.finish_reason[r]
            version = ro.policy_version[r]
            lv.episode.policy_version = version if lv.episode.turns == 0 else min(lv.episode.policy_version, version)
            raw = self.decode(ids)
            content = self.decode(ids[:-1]) if ids and ids[-1] in self.end_ids else raw
            lv.episode.turn_texts.append(content)
            lv.episode.messages.append({"role": "assistant", "content": content})
            lv.text += raw
            if ro.finish_reason[r] == "error":
                lv.finish(Outcome.infra_fail("rollout_error", "the rollout engine returned no sample"))

    def _after_step(self, lv: _Live, res) -> None:
        ep = lv.episode
        if not isinstance(res, StepResult):
            err = res if isinstance(res, BaseException) else TypeError(
                f"step returned {type(res).__name__}, not StepResult")
            lv.abandoned = isinstance(err, cf.TimeoutError)
            return lv.finish(_outcome_of_error(err))
        ep.turn_rewards.append(float(res.reward))
        ep.tool_calls += int(res.info.get("tool_calls", 0))
        ep.tool_errors += int(res.info.get("tool_errors", 0))
        if res.done:
            scores = res.info.get("scores") or {}
            ep.scores = {str(k): float(v) for k, v in scores.items() if type(v) in (int, float) and v == v}
            return lv.finish(res.outcome or default_outcome(float(res.reward)))
        if ep.turns >= self._max_turns(lv):
            return lv.finish(lv.env.on_limit("max_turns"))
        if res.history is not None:  # the environment rewrote the conversation: a new sample
            ep.messages = list(res.history)
            return self._new_segment(lv, self.render(lv.env, ep.messages, True), "history_rewritten")
        obs = res.observation
        ep.messages += [{"role": "user", "content": obs}] if isinstance(obs, str) else list(obs)
        full = self.render(lv.env, ep.messages, True)
        if full.startswith(lv.text):
            delta = self.encode(full[len(lv.text):])
            if len(lv.context_ids) + len(delta) >= self.limits.max_total_tokens:
                ep.finish_reason = "length"
                return lv.finish(lv.env.on_limit("max_tokens"))
            lv.seg.add(delta, model=False)
            lv.text = full
            return None
        return self._new_segment(lv, full, "prefix_break")  # the template re-rendered the history

    def _new_segment(self, lv: _Live, full: str, why: str) -> None:
        """Close the sample and start one from ``full`` (counted as a prefix break), or end the
        episode as INFRA_FAIL (``why``) where samples are not split."""
        lv.episode.prefix_breaks += 1
        if not self.limits.split_on_prefix_break:
            detail = ("the chat template re-renders the history" if why == "prefix_break"
                      else "the environment's history does not extend the conversation the model saw")
            return lv.finish(Outcome.infra_fail(why, detail))
        lv.episode.segments.append(Segment(prompt_ids=self.encode(full)))
        lv.text = full
        return None


def shared_openings(live: list[_Live], n: int) -> bool:
    """Whether each run of ``n`` episodes (the G episodes of one example) has one context: only then
    may one prompt stand for all ``n`` (a reset may differ per episode: a random start state, a
    session id, a per-episode system prompt)."""
    return all(live[i].context_ids == live[j].context_ids
               for i in range(0, len(live), n) for j in range(i + 1, min(i + n, len(live))))


def drive(steps, engine):
    """Run an `EpisodeRunner.steps` generator to its end, each turn by ``engine.generate``; its value."""
    try:
        request = next(steps)
        while True:
            request = steps.send(engine.generate(*request))
    except StopIteration as done:
        return done.value
    finally:
        steps.close()  # an engine that raised still closes the environments


def run_episodes(engine, tokenizer, make_env: Callable[[], Environment], examples: list[dict], n: int,
                 sampling: SamplingParams, limits: EpisodeLimits | None = None) -> list[Episode]:
    """``n`` episodes of each example (see `EpisodeRunner.run`)."""
    return EpisodeRunner(engine, tokenizer, make_env, limits or EpisodeLimits()).run(examples, n, sampling)
