"""The embedded code-repair environment: write ``f``, read the failing test, revise (3 turns).

Examples are the toy code task's (`posttrain.tasks.toy_code`: ``Write f: f(0) = 3, f(1) = 7,
f(2) = 11``, hidden tests ``assert candidate(x) == y``). Each model turn is a program, judged in
the sandbox (`posttrain.sandbox`, through the code verifier's shared pool) against the hidden
tests. A pass ends the episode (PASS). A failure shows the model the sandbox's verdict — which
test failed and what ``f`` returned (the hidden asserts are rewritten to say so) — and asks for a
fix, up to ``max_turns`` turns; after the last, the episode is MODEL_FAIL with the sandbox's
reason. The reward is whether the final version passes; each turn's reward is whether that
version passed, so ``turn_rewards[0]`` is the pass after the first turn.

The sandbox's own classes pass through: a program that times out is MODEL_FAIL("timeout"), a
sandbox that dies raises `EnvInfraError` (INFRA_FAIL), an example without tests is TASK_FAIL.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from posttrain.envs.base import EnvInfraError, Environment, EnvTaskError, StepResult
from posttrain.outcome import Outcome, OutcomeClass

_ASSERT_RE = re.compile(r"^(\s*)assert candidate\((.+)\) == (.+?)\s*$")
_DETAIL_PREFIX_RE = re.compile(r"^assertion failed after \d+ calls\s*")


def failure_message(args: str, got, want: str) -> str:
    return f"f({args}) returned {got!r}, expected {want}"


def explain_tests(tests: str) -> str:
    """Hidden tests whose failing assert says what ``f`` returned (others are kept as they are)."""
    out = []
    for line in tests.splitlines():
        m = _ASSERT_RE.match(line)
        if m is None:
            out.append(line)
            continue
        pad, args, want = m.groups()
        out.append(f"{pad}_got = candidate({args})")
        out.append(f"{pad}assert _got == {want}, failure_message({args!r}, _got, {want!r})")
    helper = "def failure_message(args, got, want):\n    return f'f({args}) returned {got!r}, expected {want}'\n\n"
    return helper + "\n".join(out) + "\n"


def feedback(outcome: Outcome) -> str:
    """What the model reads after a failed version."""
    detail = _DETAIL_PREFIX_RE.sub("", outcome.detail or "").strip()[:300]
    return f"The tests failed ({outcome.reason}): {detail}\nFix f." if detail else f"The tests failed ({outcome.reason}).\nFix f."


class CodeRepairEnv(Environment):
    def __init__(self, *, max_turns: int = 3):
        self.max_turns = max_turns
        self.turn = 0
        self.example: dict = {}
        self.last: Outcome | None = None

    def reset(self, example: dict) -> list[dict]:
        if not isinstance(example.get("tests"), str) or not example.get("entry_point"):
            raise EnvTaskError("the example needs 'tests' and 'entry_point'")
        self.example = dict(example, tests=explain_tests(example["tests"]))
        self.turn, self.last = 0, None
        return [{"role": "user", "content": example["prompt"]}]

    def judge(self, text: str) -> Outcome:
        from posttrain.verifiers.code import build_job, shared_pool

        job = build_job(text, self.example)
        return job if isinstance(job, Outcome) else shared_pool().run([job])[0]

    def step(self, text: str) -> StepResult:
        self.turn += 1
        outcome = self.last = self.judge(text)
        if outcome.cls is OutcomeClass.INFRA_FAIL:
            raise EnvInfraError(f"sandbox: {outcome.reason} {outcome.detail}")
        if outcome.cls is not OutcomeClass.MODEL_FAIL or self.turn >= self.max_turns:
            return StepResult(reward=outcome.reward, done=True, outcome=outcome)
        return StepResult(observation=feedback(outcome), reward=0.0)

    def on_limit(self, why: str) -> Outcome:
        return self.last if self.last is not None else Outcome.model_fail(why)


def _wrong_source(fn, rng: random.Random) -> str:
    """A plausible first attempt: the constant or the slope off by one or two."""
    from posttrain.tasks.toy_code import Function

    if rng.random() < 0.5:
        k = fn.k + rng.choice([-1, 1]) if fn.k > 1 else fn.k + 1
        wrong = Function(k, fn.c, fn.sign)
    else:
        c = fn.c + rng.choice([1, 2])
        wrong = Function(fn.k, c, fn.sign)
    return wrong.source, wrong


def sft_record(fn, rng: random.Random, repair_frac: float = 0.5) -> dict:
    """A direct solution, or (``repair_frac`` of the time) a wrong first version, the sandbox's
    feedback on it, and the fix: the conversation the environment would hold."""
    from posttrain.tasks.toy_code import HIDDEN

    messages = [{"role": "user", "content": fn.prompt}]
    if rng.random() < repair_frac:
        source, wrong = _wrong_source(fn, rng)
        x = next(x for x in HIDDEN if wrong(x) != fn(x))
        detail = failure_message(repr(x), wrong(x), repr(fn(x)))
        messages += [{"role": "assistant", "content": source},
                     {"role": "user", "content": feedback(Outcome.model_fail("wrong_answer", detail=detail))}]
    return {"messages": messages + [{"role": "assistant", "content": fn.source}]}


def write_code_repair_data(out_dir: str | Path, *, n_train: int = 2000, n_eval: int = 200, seed: int = 0,
                           repair_frac: float = 0.5) -> dict[str, Path]:
    """``prompts_train.jsonl`` / ``prompts_eval.jsonl`` (prompt, tests, entry_point) and
    ``sft_train.jsonl`` (direct and repair conversations) in ``out_dir``."""
    from posttrain.data.records import write_jsonl
    from posttrain.tasks.toy_code import prompt_record, sample_functions

    out, written, rng = Path(out_dir), {}, random.Random(seed)
    for split, n in (("train", n_train), ("eval", n_eval)):
        fns = sample_functions(n, split=split, seed=seed)
        written[f"prompts_{split}"] = write_jsonl(out / f"prompts_{split}.jsonl", [prompt_record(f) for f in fns])
        if split == "train":
            written["sft_train"] = write_jsonl(out / "sft_train.jsonl", [sft_record(f, rng, repair_frac) for f in fns])
    return written
