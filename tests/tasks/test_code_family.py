"""The embedded code task family: splits, hand-worked records in each published format, and what
the loaders make of them (judged in the sandbox: tests/sandbox/test_code_family_judged.py)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

from posttrain.data.formats import convert, decode_private_tests
from posttrain.data.records import load_records
from posttrain.tasks import code_family as cf


def problem(name: str, k: int) -> cf.Problem:
    return cf.Problem(next(t for t in cf.TEMPLATES if t.name == name), k)


def test_train_and_held_out_never_share_a_problem(tmp_path):
    files = cf.write_code_family(tmp_path)
    train = {r["question_id"] for r in load_records(files["train_kodcode"])}
    held = ([r["task_id"] for r in load_records(files["HumanEvalPlus"])] + [r["task_id"] for r in load_records(files["mbpp"])]
            + [r["question_id"] for r in load_records(files["lcb"])])
    assert len(held) == len(set(held))
    keys = {p.key for p in cf.all_problems() if cf.split_of(p) == "eval"}
    assert not {f"family_{k}" for k in keys} & train
    assert len(train) + len(held) == len(cf.all_problems())
    # SFT sees every training problem in each of the five prompt shapes, and nothing held out
    sft = load_records(files["sft_direct"])
    assert len(sft) == 5 * len(train)
    held_solutions = {p.solution for p in cf.all_problems() if cf.split_of(p) == "eval"}
    assert not any(r["completion"].strip("`\n").removeprefix("python\n") in held_solutions for r in sft)
    assert {r["difficulty"] for r in load_records(files["lcb"])} == set(cf.LEVELS)


def test_split_is_a_function_of_the_problem_alone():
    a, b = cf.all_problems(), list(reversed(cf.all_problems()))
    assert {p.key: cf.split_of(p) for p in a} == {p.key: cf.split_of(p) for p in b}
    share = sum(cf.split_of(p) == "eval" for p in a) / len(a)
    assert 0.12 < share < 0.28


def test_kodcode_record_by_hand():
    rec = cf.kodcode_record(problem("count_above", 3))
    assert rec["question"] == "Write a function count_above(nums) that returns how many numbers of the list nums are greater than 3."
    assert "from solution import count_above" in rec["test"]
    assert "    assert count_above([1, 5, 9]) == 2\n" in rec["test"]  # 5 and 9
    assert "(([10, 20, 30, 40, 50],), 5)" in rec["test"]  # a parametrized case
    task = convert(rec, "x")
    assert task["format"] == "kodcode" and task["entry_points"] == ["count_above"]
    assert task["prompt"].endswith("Note that the function declaration is def count_above(nums):. "
                                   "Your code should be wrapped in a markdown code block.")


def test_mbpp_and_evalplus_records_by_hand():
    p = problem("add_k", 7)
    mbpp = convert(cf.mbpp_record(p, 1001), "x")
    assert mbpp["entry_point"] == "add_k" and "assert add_k(3) == 10" in mbpp["tests"]
    he = cf.evalplus_record(p, "HumanEval/3")
    assert he["prompt"] == 'def add_k(x: int) -> int:\n    """Return x plus 7.\n    >>> add_k(3)\n    10\n    """\n'
    assert he["canonical_solution"] == "    return x + 7\n" and len(he["base_input"]) == 3
    mean = cf.evalplus_record(problem("mean_plus", 2), "Mbpp/9")
    assert mean["atol"] == 1e-6 and mean["prompt"].startswith('"""\nWrite a function mean_plus')
    plus = convert(mean, "x", variant="plus")
    assert plus["prelude"] == "" and plus["entry_point"] == "mean_plus"


def test_livecodebench_record_private_tests_decode_to_the_rest():
    p = problem("first_over", 8)
    rec = cf.livecodebench_record(p, "q1")
    assert json.loads(rec["public_test_cases"])[0] == {"input": "[1, 5, 9]", "output": "2", "testtype": "functional"}
    assert [c["output"] for c in json.loads(rec["public_test_cases"])] == ["2", "-1", "2"]
    private = decode_private_tests(rec["private_test_cases"])
    assert [c["output"] for c in private] == ["0", "-1", "-1", "0", "-1"]
    assert json.loads(pickle.loads(zlib.decompress(base64.b64decode(rec["private_test_cases"])))) == private
    task = convert(rec, "x")
    assert task["difficulty"] == "hard" and "class Solution" in task["prompt"]
    assert cf.lcb_solution(p).startswith("class Solution:\n    def first_over(self, nums: List[int]) -> int:\n"
                                         "        for i, n in enumerate(nums):\n            if n > 8:")


def test_thinking_sft_completion_closes_the_trace_before_the_program():
    from posttrain.verifiers.basic import code_format

    rows = cf.sft_records(problem("times_k", 4), thinking=True)
    assert len(rows) == 5
    for row in rows:
        assert row["completion"].startswith("<think>Multiply x by 4 and return the product.</think>\n```python\n")
        assert code_format(row["completion"], {}).cls.value == "PASS"


def test_no_problem_is_passed_by_a_constant():
    """Every problem's tests need two different answers: else `return <that answer>` passes it."""
    from posttrain.tasks.code_family import all_problems

    constant = [p.key for p in all_problems() if len({repr(o) for o in p.outputs()}) == 1]
    assert constant == []
