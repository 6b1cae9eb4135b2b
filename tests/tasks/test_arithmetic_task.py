"""The embedded arithmetic task: traces, slips, strict answers, disjoint splits, files on disk."""

from __future__ import annotations

import json
import random

import pytest

from posttrain.cli import main
from posttrain.data.records import load_records
from posttrain.tasks import arithmetic as ar


def test_multiplication_trace_matches_the_worked_example():
    p = ar.Problem("x", 17, 13)
    assert p.prompt == "Solve: 17 × 13"
    assert ar.completion(p, "trace") == "17 × 10 = 170\n17 × 3 = 51\n170 + 51 = 221\nAnswer: 221"
    assert ar.completion(p, "direct") == "Answer: 221"
    assert ar.completion(p, "think") == "<think>17 × 10 = 170\n17 × 3 = 51\n170 + 51 = 221</think>\nAnswer: 221"


def test_addition_and_subtraction_traces_by_hand():
    assert ar.completion(ar.Problem("+", 58, 67), "trace") == (
        "ones: 8 + 7 = 15, carry 1\ntens: 5 + 6 + 1 = 12, carry 1\n58 + 67 = 125\nAnswer: 125")
    assert ar.completion(ar.Problem("-", 43, 17), "trace") == "43 - 10 = 33\n33 - 7 = 26\nAnswer: 26"
    assert ar.place_parts(403) == [400, 3] and ar.place_parts(0) == [0]


@pytest.mark.parametrize("op", ["+", "-", "x"])
def test_traces_reach_the_true_answer_on_many_problems(op):
    rng = random.Random(op)
    for _ in range(300):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        if op == "-" and a < b:
            a, b = b, a
        p = ar.Problem(op, a, b)
        lines, result = ar.trace_steps(p)
        assert result == p.answer, (p, lines)
        assert ar.check_answer(ar.completion(p, "trace"), p.answer)


def test_slips_are_plausible_and_wrong():
    p = ar.Problem("x", 17, 13)
    chosen, rejected = ar.completion(p, "trace"), ar.completion(p, "trace", slip=0)
    assert rejected == "17 × 10 = 180\n17 × 3 = 51\n180 + 51 = 231\nAnswer: 231"
    # A dropped carry in 58 + 67 loses the ones column's carry: tens 5 + 6 = 11, total 115.
    assert ar.completion(ar.Problem("+", 58, 67), "trace", slip=0).endswith("58 + 67 = 115\nAnswer: 115")
    assert ar.slip_positions(ar.Problem("+", 12, 13)) == []  # nothing carries: no pair
    rng = random.Random(0)
    for p in ar.sample_problems(100, split="train", digits=2, ops=["+", "-", "x"], seed=1):
        rec = ar.preference_record(p, "trace", rng)
        if rec is None:
            continue
        got = ar.extract_answer(rec["rejected"])
        assert got is not None and got != rec["answer"] and ar.check_answer(rec["chosen"], rec["answer"])
    assert chosen != rejected


@pytest.mark.parametrize("text,expected", [
    ("Answer: 221", "221"),
    ("17 × 13\nAnswer: 220\nAnswer: 221", "221"),
    ("Answer: 221  \n", "221"),
    ("Answer: -5", "-5"),
    ("Answer: 221.", None),
    ("answer: 221", None),
    ("Answer: 0221", None),
    ("Answer: 2,21", None),
    ("The Answer: 221", None),
    ("no answer here", None),
])
def test_extract_answer_is_strict(text, expected):
    assert ar.extract_answer(text) == expected


def test_check_answer():
    assert ar.check_answer("x\nAnswer: 221", "221")
    assert ar.check_answer("Answer: 221", 221)
    assert not ar.check_answer("Answer: 22", "221")
    assert not ar.check_answer("Answer 221", "221")


def test_splits_share_no_operand_pair_and_do_not_depend_on_seed():
    ops = ["+", "-", "x"]
    train = {p for s in range(3) for p in ar.sample_problems(300, split="train", digits=2, ops=ops, seed=s)}
    held = {p for s in range(3) for p in ar.sample_problems(100, split="eval", digits=2, ops=ops, seed=s)}
    canon = lambda p: (p.op, *sorted((p.a, p.b))) if p.op != "-" else (p.op, p.a, p.b)  # noqa: E731
    assert not {canon(p) for p in train} & {canon(p) for p in held}
    # Commutative twins land in the same split.
    assert ar.split_of(ar.Problem("x", 17, 13)) == ar.split_of(ar.Problem("x", 13, 17))
    a = ar.sample_problems(50, split="train", digits=2, ops=ops, seed=7)
    assert a == ar.sample_problems(50, split="train", digits=2, ops=ops, seed=7)
    assert a != ar.sample_problems(50, split="train", digits=2, ops=ops, seed=8)
    assert len(set(a)) == 50


def test_difficulty_knobs():
    ps = ar.sample_problems(50, split="train", digits=(3, 1), ops=ar.parse_ops("×"), seed=0)
    assert all(100 <= p.a <= 999 and 0 <= p.b <= 9 and p.op == "x" for p in ps)
    assert ar.parse_ops("+,-,x") == ["+", "-", "x"] and ar.parse_ops(("×",)) == ["x"]
    with pytest.raises(ValueError, match="unknown operation"):
        ar.parse_ops("/")
    with pytest.raises(ValueError, match="ask for fewer"):
        ar.sample_problems(500, split="train", digits=1, ops=["x"], seed=0)


def test_make_data_writes_the_six_files(tmp_path, capsys):
    rc = main(["make-data", "arithmetic", str(tmp_path), "--n-train", "40", "--n-eval", "10",
               "--ops", "+,x", "--format", "think", "--seed", "3"])
    assert rc == 0
    sft, prompts = load_records(tmp_path / "train.jsonl"), load_records(tmp_path / "prompts_eval.jsonl")
    assert len(sft) == 40 and len(prompts) == 10
    assert set(sft[0]) == {"prompt", "completion", "answer"} and set(prompts[0]) == {"prompt", "answer"}
    assert all(r["completion"].startswith("<think>") and ar.check_answer(r["completion"], r["answer"]) for r in sft)
    pairs = load_records(tmp_path / "pairs_train.jsonl")
    assert pairs and set(pairs[0]) == {"prompt", "chosen", "rejected", "answer"}
    # The × sign is written as itself, not as an escape.
    assert "×" in (tmp_path / "train.jsonl").read_text(encoding="utf-8")
    train_prompts = {json.loads(line)["prompt"] for line in (tmp_path / "train.jsonl").open(encoding="utf-8")}
    assert not train_prompts & {r["prompt"] for r in prompts}


def test_make_data_bad_input_exits_2(tmp_path, capsys):
    assert main(["make-data", "nosuch", str(tmp_path)]) == 2
    assert "unknown task 'nosuch'" in capsys.readouterr().err
    assert main(["make-data", "arithmetic", str(tmp_path), "--ops", "/"]) == 2
