"""HumanEval+ / MBPP+ as evalplus judges them (`posttrain.data.evalplus`), on records sliced from
the real release files: the tests module a task carries, run here in-process against plain
functions (no sandbox), so each rule of evalplus' is checked on its own."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from posttrain.data import evalplus as ep
from posttrain.data.formats import convert
from posttrain.data.records import load_tasks
from posttrain.errors import UserError
from posttrain.sandbox.records import wrap_program

REALBENCH = Path(__file__).parent / "realbench"


def real_records(name: str, ids: list[str]) -> list[dict]:
    """The records of a release file (MbppPlus / HumanEvalPlus) with these task ids, as published."""
    wanted = set(ids)
    with gzip.open(REALBENCH / f"{name}.jsonl.gz", "rt") as f:
        found = {r["task_id"]: r for r in map(json.loads, f) if r["task_id"] in wanted}
    return [found[i] for i in ids]


def write_slice(path: Path, name: str, ids: list[str]) -> Path:
    """A ``.jsonl.gz`` slice of a release file, written as evalplus writes its releases."""
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in real_records(name, ids))
    return path


def run_check(task: dict, program: str) -> None:
    """The task's tests against the program's entry point, in this process, the candidate also
    bound to the entry point's name in the tests' namespace as the judge binds it; raises as the
    judge sees."""
    tests, prog = {}, {}
    exec(compile(task["tests"], "<tests>", "exec"), tests)
    exec(compile(wrap_program(task, program), "<program>", "exec"), prog)
    tests[task["entry_point"]] = prog[task["entry_point"]]
    tests["check"](prog[task["entry_point"]])


def passes(task: dict, program: str) -> bool:
    try:
        run_check(task, program)
    except AssertionError:
        return False
    return True


def mbpp(task_id: str, variant: str = "plus") -> dict:
    return convert(real_records("MbppPlus", [task_id])[0], task_id, "evalplus", variant=variant)


def test_empty_plus_input_object_is_no_inputs(tmp_path):
    """Mbpp/793 publishes ``"plus_input": {}``; evalplus iterates over it (no inputs)."""
    path = write_slice(tmp_path / "MbppPlus.jsonl.gz", "MbppPlus", ["Mbpp/2", "Mbpp/793"])
    tasks = dict((t["id"], t) for _, t in load_tasks(path, "evalplus"))
    assert sorted(tasks) == ["Mbpp/2", "Mbpp/793"]
    assert passes(tasks["Mbpp/793"], tasks["Mbpp/793"]["reference"])
    assert not passes(tasks["Mbpp/793"], "def last(arr, x):\n    return arr.index(x)\n")


@pytest.mark.parametrize("task_id", ["Mbpp/106", "Mbpp/124", "Mbpp/252", "Mbpp/580", "Mbpp/720"])
def test_mbpp_inputs_are_tuples_sets_and_complex_numbers_as_evalplus_makes_them(task_id):
    task = mbpp(task_id)
    run_check(task, task["reference"])  # canonical solutions that raise or differ on the raw lists


def test_an_entry_point_named_like_a_builtin_does_not_shadow_it_in_the_tests():
    task = mbpp("Mbpp/126")  # the function is called sum
    assert passes(task, task["reference"])
    assert not passes(task, "def sum(a, b):\n    return 1\n")


def test_tuples_reach_the_program_as_tuples():
    """Mbpp/596 asks for sys.getsizeof of a tuple: a list of the same items has another size."""
    task = mbpp("Mbpp/596")
    assert passes(task, "import sys\ndef tuple_size(t):\n    return sys.getsizeof(tuple(t))\n")
    assert not passes(task, "import sys\ndef tuple_size(t):\n    return sys.getsizeof(list(t))\n")


def test_mbpp_inputs_match_evalplus_table():
    assert ep.mbpp_inputs(124, [["1.5", "(1+2j)"]]) == [(1.5, 1 + 2j)]
    assert ep.mbpp_inputs(580, [[[1, [2, 3]], 4]]) == [((1, (2, 3)), 4)]
    assert ep.mbpp_inputs(722, [[{"a": [1, 2]}, 3]]) == [[{"a": (1, 2)}, 3]]
    assert ep.mbpp_inputs(115, [[[[1], []]]]) == [[[{1}, {}]]]
    assert ep.mbpp_inputs(3, [[[1, 2]]]) == [[[1, 2]]]


def made(task_id: str, entry: str, canonical: str, inputs: list) -> dict:
    """A task of the release's form (MBPP+ v0.2.0 no longer ships Mbpp/164 and Mbpp/295, whose
    oracles evalplus keeps)."""
    rec = {"task_id": task_id, "prompt": "", "entry_point": entry, "canonical_solution": canonical,
           "base_input": inputs, "plus_input": [], "atol": 0}
    return convert(rec, task_id, "evalplus")


@pytest.mark.parametrize("task_id, other_reading", [
    ("Mbpp/581", "import math\ndef surface_Area(b, s):\n"
                 "    return round(b * b + 4 * (b * math.sqrt((b / 2) ** 2 + s ** 2)) / 2)\n"),
    ("Mbpp/558", "def digit_distance_nums(a, b):\n    a, b = str(a), str(b)\n    n = max(len(a), len(b))\n"
                 "    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(n), b.zfill(n)))\n"),
])
def test_mbpp_special_oracles_accept_evalplus_second_reading(task_id, other_reading):
    task = mbpp(task_id)
    assert passes(task, task["reference"]) and passes(task, other_reading)
    assert not passes(task, other_reading.replace("return ", "return 1 + "))


def test_are_equivalent_takes_any_output_and_sum_div_also_zero():
    eq = made("Mbpp/164", "are_equivalent", "def are_equivalent(a, b):\n    return a == b\n", [[1, 2], [3, 3]])
    assert passes(eq, "def are_equivalent(a, b):\n    return 'anything'\n")
    div = made("Mbpp/295", "sum_div", "def sum_div(n):\n    return sum(i for i in range(1, n) if n % i == 0)\n",
               [[8], [12]])
    assert passes(div, "def sum_div(n):\n    return 0\n")
    assert not passes(div, "def sum_div(n):\n    return 1\n")


@pytest.mark.parametrize("task_id", ["Mbpp/737", "Mbpp/787", "Mbpp/794"])
def test_is_not_none_tasks_judge_what_evalplus_judges(task_id):
    """The canonical returns a regex match (not a value that can cross the sandbox boundary): the
    program's own entry sends whether it is not None, as evalplus compares it."""
    task = mbpp(task_id)
    assert task["entry_point"] == "__posttrain_entry__"
    assert passes(task, task["reference"])
    name = real_records("MbppPlus", [task_id])[0]["entry_point"]
    assert not passes(task, f"def {name}(text):\n    return None\n")


def test_reference_time_is_not_the_programs():
    """Each input may take max(1 s, 4 x the reference's time on it); the reference's own run is
    not charged: a slow reference and a fast program pass, a program slower than its limit fails."""
    rec = {"task_id": "Mbpp/9001", "prompt": "", "entry_point": "f", "atol": 0,
           "canonical_solution": "import time\ndef f(x):\n    time.sleep(0.3)\n    return x\n",
           "base_input": [[1], [2]], "plus_input": [[3], [4], [5], [6], [7], [8], [9], [10]]}
    task = convert(rec, "r", "evalplus")
    assert passes(task, "def f(x):\n    return x\n")  # the reference alone takes 3 s
    start = time.time()
    with pytest.raises(TimeoutError, match="input 0: over its time limit"):
        run_check(task, "import time\ndef f(x):\n    time.sleep(1.4)\n    return x\n")
    assert time.time() - start < 1.4 + 3.3  # stopped at its limit (1.2 s), not at the end of the sleep


def test_a_reference_that_raises_is_the_tasks_fault():
    rec = {"task_id": "Mbpp/9002", "prompt": "", "entry_point": "f", "atol": 0,
           "canonical_solution": "def f(x):\n    return 1 // x\n", "base_input": [[1], [0]], "plus_input": []}
    with pytest.raises(ZeroDivisionError):  # while the tests load, before any program runs: TASK_FAIL
        exec(compile(convert(rec, "r", "evalplus")["tests"], "<tests>", "exec"), {})


def test_atol_of_zero_becomes_1e6_from_the_first_float_on():
    rec = {"task_id": "HumanEval/9003", "prompt": "", "entry_point": "f", "atol": 0,
           "canonical_solution": "def f(x):\n    return x / 3\n", "base_input": [[1.0], [2.0]], "plus_input": []}
    task = convert(rec, "r", "evalplus")
    assert passes(task, "def f(x):\n    return x / 3 + 1e-7\n")
    assert not passes(task, "def f(x):\n    return x / 3 + 1e-5\n")


@pytest.mark.parametrize("field, value, message", [
    ("base_input", "[[1], [2]", "field 'base_input' of an evalplus record is not JSON"),
    ("plus_input", 5, "field 'plus_input' of an evalplus record must be a list of argument lists"),
])
def test_bad_inputs_name_file_line_and_field(tmp_path, field, value, message):
    rec = {**real_records("MbppPlus", ["Mbpp/2"])[0], field: value}
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(UserError, match=rf"^{path}:1: {message}"):
        load_tasks(path)
