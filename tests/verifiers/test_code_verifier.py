"""The code-test verifier: program assembly, classes, batch scoring, INFRA_FAIL masked, breaker stops."""

from __future__ import annotations

import pytest

from posttrain.outcome import Outcome, OutcomeClass
from posttrain.sandbox.pool import CircuitOpen, Job
from posttrain.sandbox.worker import probe
from posttrain.verifiers import code as code_verifier
from posttrain.verifiers.code import build_job, extract_code
from posttrain.verifiers.registry import VERIFIERS, build_reward, score_batch

TESTS = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n"
EX = {"prompt": "Write f(x) = x squared.", "tests": TESTS, "entry_point": "f"}
HE = {"prompt": "def f(x):\n    \"\"\"Square.\"\"\"\n", "tests": TESTS, "entry_point": "f",
      "prelude": "import math\n\ndef f(x):\n    \"\"\"Square.\"\"\"\n"}
needs_sandbox = pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")


def test_extract_code_takes_the_longest_valid_code_not_the_last_fence():
    text = "Plan.\n```python\nx = 1\n```\nBetter:\n```py\ndef f(x):\n    return x * x\n```\nDone."
    assert extract_code(text) == "def f(x):\n    return x * x"  # two lines beat one
    first_longer = "```python\nimport math\nx = 1\ny = 2\n```\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(first_longer) == "import math\nx = 1\ny = 2"
    assert extract_code("def f(x):\n    return 1\n") == "def f(x):\n    return 1"
    assert extract_code("```python\ndef f(x):\n    return 2") == "def f(x):\n    return 2"  # unclosed
    assert extract_code("```python\n```") == ""


def test_build_job_forms():
    full = build_job("```python\ndef f(x):\n    return x * x\n```", HE)
    assert isinstance(full, Job) and full.program.startswith("import math") and full.program.rstrip().endswith("x * x")
    body = build_job("    return math.pow(x, 2)\n", HE)
    assert body.program == HE["prelude"] + "    return math.pow(x, 2)\n" and body.prelude == HE["prelude"]
    io = build_job("print(1)", {"io": [{"stdin": "", "stdout": "1\n"}]})
    assert io.io == (("", "1\n"),)


@pytest.mark.parametrize("completion, example, want", [
    ("def f(x): return 1", {"prompt": "p"}, ("TASK_FAIL", "no_tests")),
    ("def f(x): return 1", {"tests": TESTS}, ("TASK_FAIL", "no_tests")),
    ("print(1)", {"io": []}, ("TASK_FAIL", "bad_test")),
    ("   \n", EX, ("MODEL_FAIL", "format")),
    ("```python\n```", {"io": [{"stdin": "", "stdout": ""}]}, ("MODEL_FAIL", "format")),
])
def test_nothing_to_run(completion, example, want):
    got = build_job(completion, example)
    assert isinstance(got, Outcome) and (got.cls.value, got.reason) == want


def test_registered_with_a_batch_form():
    assert VERIFIERS["code"] is build_reward("code") and callable(VERIFIERS["code"].batch)


@needs_sandbox
def test_reward_is_one_iff_all_tests_pass():
    completions = ["```python\ndef f(x):\n    return x * x\n```", "def f(x):\n    return x * 3\n",
                   "    return x ** 2\n", "no code at all, just words", "def f(x):\n    return 1 // 0\n"]
    examples = [EX, EX, HE, EX, EX]
    got = score_batch(VERIFIERS["code"], completions, examples)
    assert [(o.cls.value, o.reason, o.reward) for o in got[:3]] == [
        ("PASS", "", 1.0), ("MODEL_FAIL", "wrong_answer", 0.0), ("PASS", "", 1.0)]
    assert got[3].cls is OutcomeClass.MODEL_FAIL and got[3].reward == 0.0
    assert (got[4].reason, got[4].reward) == ("runtime_error", 0.0)
    assert code_verifier.verify("def f(x):\n    return x * x\n", EX).reward == 1.0


class BrokenPool:
    def __init__(self, error=None):
        self.error = error

    def run(self, jobs):
        if self.error:
            raise self.error
        return [Outcome.infra_fail("sandbox", "after 3 tries: sandbox exited") for _ in jobs]


def test_infra_fail_is_masked_not_a_zero_reward(monkeypatch):
    monkeypatch.setattr(code_verifier, "shared_pool", lambda: BrokenPool())
    got = score_batch(VERIFIERS["code"], ["def f(x):\n    return x * x\n", ""], [EX, EX])
    assert got[0].cls is OutcomeClass.INFRA_FAIL and not got[0].is_reward
    assert (got[1].cls, got[1].reason) == (OutcomeClass.MODEL_FAIL, "format")  # judged without the pool


def test_circuit_breaker_stops_the_run(monkeypatch):
    monkeypatch.setattr(code_verifier, "shared_pool", lambda: BrokenPool(CircuitOpen("sandbox circuit breaker open")))
    with pytest.raises(CircuitOpen):
        score_batch(VERIFIERS["code"], ["def f(x):\n    return 1\n"], [EX])
    with pytest.raises(CircuitOpen):
        score_batch(build_reward("code", format_weight=0.1), ["def f(x):\n    return 1\n"], [EX])
    monkeypatch.setattr(code_verifier, "shared_pool", lambda: BrokenPool(OSError("disk")))
    assert score_batch(VERIFIERS["code"], ["def f(x):\n    return 1\n"], [EX])[0].cls is OutcomeClass.INFRA_FAIL


# A real instruct model's shape of answer (SmolLM2-135M-Instruct, tests/data/chat_answers): correct
# code, example calls, a closing fence it never opened, then prose.
CLOSING_FENCE = ("def f(x):\n    return x * x\n\n# Example usage:\nprint(f(3))  # 9\n```\n\n"
                 "In this code, the `f` function returns the square of `x`.")


def test_the_program_of_a_closing_fence_answer_has_no_prose_and_no_example_call():
    job = build_job(CLOSING_FENCE, HE)
    assert job.program == HE["prelude"] + "\n\ndef f(x):\n    return x * x\n"
    assert build_job(CLOSING_FENCE, EX).program == "def f(x):\n    return x * x"


@needs_sandbox
def test_a_closing_fence_answer_with_correct_code_passes():
    got = score_batch(VERIFIERS["code"], [CLOSING_FENCE, CLOSING_FENCE.replace("x * x", "x + x")], [HE, EX])
    assert [(o.cls.value, o.reason) for o in got] == [("PASS", ""), ("MODEL_FAIL", "wrong_answer")]


@needs_sandbox
def test_a_real_closing_fence_answer_is_judged_on_its_code_not_its_prose():
    """SmolLM2-135M-Instruct's raw answer to HumanEval/0: code, example prints, a stray closing fence,
    prose. Its code is wrong (it compares each number with the threshold): wrong_answer, where the
    prose used to make it a runtime_error whatever the code did."""
    import json
    from pathlib import Path

    from posttrain.sandbox.records import humaneval_records

    answers = Path(__file__).parents[1] / "data" / "chat_answers" / "smollm2_humaneval.jsonl"
    answer = next(a for a in map(json.loads, answers.read_text().splitlines()) if a["task_id"] == "HumanEval/0")
    rec = next(r for r in humaneval_records() if r["id"] == "HumanEval/0")
    example = {"tests": rec["tests"], "entry_point": rec["entry_point"], "prelude": rec["prelude"]}
    fixed = answer["answer"].replace("any(num - threshold <= 0 for num in numbers)",
                                     "any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[:i])")
    got = score_batch(VERIFIERS["code"], [answer["answer"], fixed], [example, example])
    assert [(o.cls.value, o.reason) for o in got] == [("MODEL_FAIL", "wrong_answer"), ("PASS", "")]
