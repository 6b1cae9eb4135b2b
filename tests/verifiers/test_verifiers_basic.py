"""Hand cases for the plain verifiers, the registry, combine and safe scoring."""

from __future__ import annotations

import threading

import pytest
import torch

from posttrain.errors import UserError
from posttrain.outcome import Outcome, OutcomeClass
from posttrain.verifiers import VERIFIERS, build_reward, combine, resolve_verifier, safe_verify, score_batch
from posttrain.verifiers.basic import arithmetic, format_reward, math

PASS, MODEL_FAIL, TASK_FAIL, INFRA_FAIL = (OutcomeClass.PASS, OutcomeClass.MODEL_FAIL,
                                           OutcomeClass.TASK_FAIL, OutcomeClass.INFRA_FAIL)


def test_arithmetic():
    ex = {"prompt": "Solve: 17 × 13", "answer": "221"}
    assert arithmetic("17 × 10 = 170\n17 × 3 = 51\n170 + 51 = 221\nAnswer: 221", ex) == Outcome.passed()
    wrong = arithmetic("Answer: 231", ex)
    assert (wrong.cls, wrong.reason, wrong.reward) == (MODEL_FAIL, "wrong_answer", 0.0)
    assert arithmetic("the answer is 221", ex).reason == "format"
    assert arithmetic("Answer: 221.", ex).reason == "format"
    assert arithmetic("<think>x</think>\nAnswer: 221", {"answer": 221}).cls is PASS
    assert arithmetic("Answer: 221", {"prompt": "p"}).cls is TASK_FAIL
    assert arithmetic("Answer: 221", {"answer": None}).cls is TASK_FAIL


@pytest.mark.parametrize("completion,answer,cls,reason", [
    ("So the result is $\\frac{1}{2}$.", "0.5", PASS, ""),
    ("Answer: 0.5", "\\frac{1}{2}", PASS, ""),
    ("\\boxed{1+x}", "x+1", PASS, ""),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", PASS, ""),
    ("Answer: 3", "2", MODEL_FAIL, "wrong_answer"),
    ("I do not know", "2", MODEL_FAIL, "format"),
])
def test_math(completion, answer, cls, reason):
    out = math(completion, {"answer": answer})
    assert (out.cls, out.reason) == (cls, reason)


def test_math_task_failures():
    assert math("Answer: 1", {}).cls is TASK_FAIL
    assert math("Answer: 1", {"answer": "$ $"}).reason == "unparsable_answer"
    assert math("Answer: 1", {"answer": "  "}).reason == "no_answer"


def test_math_works_off_the_main_thread():
    results = []
    t = threading.Thread(target=lambda: results.append(math("$\\frac{1}{2}$", {"answer": "0.5"})))
    t.start()
    t.join()
    assert results == [Outcome.passed()]


@pytest.mark.parametrize("completion,ok", [
    ("<think>17 × 13 = 221</think>\nAnswer: 221", True),
    ("  <think>plan</think>\n```python\nprint(1)\n```", True),
    ("<think>17 × 13 = 221\nAnswer: 221", False),          # never closed
    ("Answer: 221", False),                                  # no think block
    ("<think>a</think>\nthe answer is 221", False),          # no answer line
    ("<think></think>\nAnswer: 1", False),                   # empty thinking
    ("<think>a</think><think>b</think>\nAnswer: 1", False),  # two blocks
    ("Sure. <think>a</think>\nAnswer: 1", False),            # not at the start
])
def test_format(completion, ok):
    out = format_reward(completion, {})
    assert out.cls is (PASS if ok else MODEL_FAIL)
    assert out.reward == (1.0 if ok else 0.0)
    assert ok or out.reason == "format"


def test_combine_weights_rewards_and_keeps_the_correctness_class():
    v = combine([(arithmetic, 1.0), (format_reward, 0.05)])
    ex = {"answer": "221"}
    both = v("<think>t</think>\nAnswer: 221", ex)
    assert (both.cls, both.reward) == (PASS, pytest.approx(1.05))
    wrong_but_formatted = v("<think>t</think>\nAnswer: 7", ex)
    assert (wrong_but_formatted.cls, wrong_but_formatted.reason) == (MODEL_FAIL, "wrong_answer")
    assert wrong_but_formatted.reward == pytest.approx(0.05)
    assert v("Answer: 221", ex).reward == pytest.approx(1.0)
    assert v("Answer: 221", {}).cls is TASK_FAIL  # the task failure dominates the format bonus


def boom(completion: str, example: dict) -> Outcome:
    raise RuntimeError("disk on fire")


def test_a_raising_verifier_is_infra_fail_not_reward_zero():
    out = safe_verify(boom, "Answer: 1", {"answer": "1"})
    assert (out.cls, out.reason, out.is_reward) == (INFRA_FAIL, "verifier_error", False)
    assert "disk on fire" in out.detail
    assert safe_verify(lambda c, e: 1.0, "x", {}).cls is INFRA_FAIL
    combined = combine([(arithmetic, 1.0), (boom, 0.05)])("Answer: 1", {"answer": "1"})
    assert combined.cls is INFRA_FAIL
    outs = score_batch(boom, ["a", "b"], [{}, {}])
    assert [o.cls for o in outs] == [INFRA_FAIL, INFRA_FAIL]


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_reward_is_infra_fail_and_its_group_keeps_finite_advantages(reward):
    from posttrain.algos.advantages import grpo, reinforce_pp, rloo
    from posttrain.rl.batch import group_outcomes

    def broken(completion, example):
        return Outcome.passed(reward) if completion == "odd" else arithmetic(completion, example)

    def broken_batch(completions, examples):
        return [broken(c, e) for c, e in zip(completions, examples)]

    texts, examples = ["Answer: 1", "odd", "Answer: 2", "Answer: 1"], [{"answer": "1"}] * 4
    out = safe_verify(broken, "odd", {})
    assert (out.cls, out.reason) == (INFRA_FAIL, "verifier_error") and "not a finite number" in out.detail
    broken.batch = broken_batch
    for fn in (broken, combine([(broken, 1.0), (format_reward, 0.05)])):
        outcomes = score_batch(fn, texts, examples)
        assert [o.cls for o in outcomes] == [PASS, INFRA_FAIL, MODEL_FAIL, PASS]
        rewards_PG, valid_PG, _ = group_outcomes(outcomes, 4)
        for estimator in (grpo, rloo, reinforce_pp):
            adv_PG, _ = estimator(rewards_PG, valid_PG)
            assert torch.isfinite(adv_PG).all() and adv_PG[0, 1] == 0


def test_registry_and_import_paths():
    assert set(VERIFIERS) >= {"arithmetic", "math", "format", "code"}
    assert resolve_verifier("arithmetic") is arithmetic
    assert resolve_verifier("posttrain.verifiers.basic:format_reward") is format_reward
    with pytest.raises(UserError, match="'nosuch'"):
        resolve_verifier("nosuch")
    with pytest.raises(UserError, match="cannot import module 'no_such_pkg.mod'"):
        resolve_verifier("no_such_pkg.mod:fn")
    with pytest.raises(UserError, match="has no function 'nope'"):
        resolve_verifier("posttrain.verifiers.basic:nope")
    assert build_reward("arithmetic") is arithmetic
    assert build_reward("arithmetic", format_weight=0.05)("<think>t</think>\nAnswer: 2", {"answer": "2"}).reward \
        == pytest.approx(1.05)


@pytest.mark.parametrize("completion,ok,detail", [
    ("<think>read the tests</think>\n```python\ndef f(x):\n    return x + 1\n```", True, ""),
    ("<think>plan</think>\ndef f(x):\n    return x + 1\n", True, ""),  # an unfenced program
    ("<think>plan</think>\n```python\ndef f(x) return x\n```", False, "not valid Python"),
    ("<think>plan</think>\nThe answer is f(x) = x + 1.", False, "not valid Python"),
    ("<think>plan</think>\n```python\n```", False, "no code"),
    ("<think>plan</think>\n", False, "no code"),
    ("```python\ndef f(x):\n    return x\n```", False, "no closed"),
    ("<think>plan, cut at the length limit\n```python\ndef f(x):\n    return x\n```", False, "no closed"),
    ("<think> </think>\ndef f(x):\n    return x\n", False, "empty think"),
    ("<think>a</think><think>b</think>\ndef f(x):\n    return x\n", False, "more than one"),
    ("<think>draft:\n```python\ndef f(x):\n    return x\n```\n</think>\nsee above", False, "not valid Python"),
])
def test_code_format_is_a_closed_trace_then_valid_python(completion, ok, detail):
    from posttrain.verifiers.basic import code_format

    out = code_format(completion, {})
    assert (out.cls is PASS, out.reward) == (ok, 1.0 if ok else 0.0)
    assert detail in out.detail


def test_extract_code_reads_past_the_trace_only():
    from posttrain.verifiers.basic import extract_code

    draft = "<think>try\n```python\ndef f():\n    return 0\n```\n</think>\n"
    assert extract_code(draft + "```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"
    assert extract_code(draft + "def f():\n    return 2\n") == "def f():\n    return 2"
    assert extract_code("<think>never closed\ndef f():\n    return 3\n") == ""
    assert extract_code("def f():\n    return 4\n") == "def f():\n    return 4"


def test_the_format_reward_of_a_recipe_is_named():
    ex = {"answer": "2"}
    code = build_reward("arithmetic", format_weight=0.05, format_spec="code_format")
    plain = build_reward("arithmetic", format_weight=0.05)
    prose = "<think>t</think>\nThat's 2.\nAnswer: 2"  # an Answer line, but not Python
    assert (plain(prose, ex).reward, code(prose, ex).reward) == (pytest.approx(1.05), pytest.approx(1.0))
    program = "<think>t</think>\nAnswer: 2"  # an annotated name: valid Python, and an Answer line
    assert (plain(program, ex).reward, code(program, ex).reward) == (pytest.approx(1.05), pytest.approx(1.05))
    with pytest.raises(UserError, match="not a registered name"):
        build_reward("arithmetic", format_weight=0.05, format_spec="nope")
