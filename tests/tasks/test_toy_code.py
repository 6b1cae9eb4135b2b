"""The toy code task: disjoint splits, references pass their hidden tests, echoing does not, make-data."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.sandbox.worker import probe
from posttrain.tasks.toy_code import Function, all_functions, sample_functions, split_of, write_toy_code


def run_check(program: str, tests: str) -> bool:
    """Our own reference programs, run in-process (trusted code)."""
    ns: dict = {}
    exec(program, ns)
    try:
        exec(tests, ns)
        ns["check"](ns["f"])
    except AssertionError:
        return False
    return True


def test_function_text_and_values():
    f = Function(4, 3, -1)
    assert f.source == "def f(x):\n    return x * 4 - 3"
    assert f.prompt == "Write f: f(0) = -3, f(1) = 1, f(2) = 5"
    assert "assert candidate(-6) == -27" in f.tests


def test_functions_are_distinct_and_splits_disjoint():
    fns = all_functions()
    assert len(fns) == 171 and len({f.source for f in fns}) == 171
    held_out = {f for f in fns if split_of(f) == "eval"}
    assert 20 <= len(held_out) <= 50
    train = set(sample_functions(500, split="train", seed=3))
    assert train and not train & held_out
    assert set(sample_functions(40, split="eval", seed=1)) <= held_out


def test_seed_picks_problems_but_not_splits():
    a, b = sample_functions(30, split="train", seed=0), sample_functions(30, split="train", seed=1)
    assert a != b and {split_of(f) for f in a + b} == {"train"}
    assert sample_functions(30, split="train", seed=0) == a


def test_references_pass_and_wrong_functions_fail():
    for f in all_functions():
        assert run_check(f.source, f.tests)
        assert not run_check(Function(f.k + 1, f.c, f.sign).source, f.tests)
    f = Function(2, 5)
    echo = "def f(x):\n    return {0: 5, 1: 7, 2: 9}.get(x, 0)\n"  # memorises the shown examples only
    assert not run_check(echo, f.tests)


def test_make_data_writes_the_files(tmp_path):
    out = tmp_path / "code"
    assert main(["make-data", "toy_code", str(out), "--n-train", "12", "--n-eval", "5", "--seed", "2"]) == 0
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    prompts = [json.loads(x) for x in (out / "prompts_eval.jsonl").read_text().splitlines()]
    assert len(train) == 12 and len(prompts) == 5
    assert set(train[0]) == {"prompt", "completion", "tests", "entry_point"}
    assert set(prompts[0]) == {"prompt", "tests", "entry_point"}
    assert write_toy_code(tmp_path / "again", n_train=12, n_eval=5, seed=2)["train"].read_text() == \
        (out / "train.jsonl").read_text()


@pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")
def test_sft_completions_pass_the_code_verifier(tmp_path):
    from posttrain.verifiers.registry import VERIFIERS, score_batch

    write_toy_code(tmp_path, n_train=20, n_eval=0)
    recs = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    outcomes = score_batch(VERIFIERS["code"], [r["completion"] for r in recs], recs)
    assert [o.cls.value for o in outcomes] == ["PASS"] * 20
    shown_only = [r["completion"].replace("return x *", "return 0 *") for r in recs]
    assert all(o.reward == 0.0 for o in score_batch(VERIFIERS["code"], shown_only, recs))
