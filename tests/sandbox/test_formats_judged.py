"""Published datasets judged in the sandbox: each format's own reference passes and trivial
programs do not (the audit), LiveCodeBench and evalplus verdicts as those benchmarks define
them, the code verifier on completions, and `posttrain sandbox check` on published records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.data.formats import convert
from posttrain.data.records import load_tasks
from posttrain.sandbox.audit import audit
from posttrain.sandbox.records import to_job
from posttrain.verifiers.code import build_job
from tests.data.test_evalplus import real_records, write_slice

FIXTURES = Path(__file__).parents[1] / "data" / "formats"


def tasks(name: str, **options) -> list[dict]:
    return [{**t, "_where": w} for w, t in load_tasks(str(FIXTURES / name), **options)]


def judge(pool, task: dict, program: str) -> tuple[str, str]:
    outcome = pool.run([to_job({**task, "program": program}, "test")])[0]
    return outcome.cls.value, outcome.reason


@pytest.mark.parametrize("name", ["kodcode.jsonl", "mbpp.jsonl", "mbpp_sanitized.jsonl", "evalplus.jsonl"])
def test_references_pass_and_trivial_programs_do_not(pool, name):
    rows = audit(tasks(name), pool, name)
    assert [r["flags"] for r in rows] == [[]] * len(rows), [r for r in rows if r["flags"]]


def test_livecodebench_audit_marks_broken_and_unreferenced_tasks(pool):
    rows = audit(tasks("livecodebench.jsonl"), pool, "lcb")
    assert [r["flags"] for r in rows] == [["no_reference"]] * 5 + [["task_fail"]] * 2


def test_livecodebench_stdin_answers_compared_as_decimals(pool):
    avg = tasks("livecodebench.jsonl")[1]  # expects 1.5, 1.25, 7.0
    program = "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) / n)\n"
    assert judge(pool, avg, program) == ("PASS", "")
    assert judge(pool, avg, program.replace("print(sum(a) / n)", "print(f'{sum(a) / n:.3f}')")) == ("PASS", "")
    assert judge(pool, avg, "input()\nprint(1.5)\n") == ("MODEL_FAIL", "wrong_answer")


def test_livecodebench_functional_solution_class(pool):
    two_sum, pairs = tasks("livecodebench.jsonl")[3:5]
    right = ("class Solution:\n    def twoSum(self, numbers: List[int], target: int) -> List[int]:\n"
             "        i, j = 0, len(numbers) - 1\n        while numbers[i] + numbers[j] != target:\n"
             "            if numbers[i] + numbers[j] < target:\n                i += 1\n            else:\n"
             "                j -= 1\n        return [i + 1, j + 1]\n")
    assert judge(pool, two_sum, right) == ("PASS", "")
    assert judge(pool, two_sum, right.replace("[i + 1, j + 1]", "[i, j]")) == ("MODEL_FAIL", "wrong_answer")
    tuple_answer = ("class Solution:\n    def countPairs(self, nums, k):\n"
                    "        s = sorted(nums[i] + nums[j] for i in range(len(nums)) for j in range(i + 1, len(nums))"
                    " if nums[i] + nums[j] < k)\n        return (len(s), s)\n")
    assert judge(pool, pairs, tuple_answer) == ("PASS", "")  # a tuple answers for a list, as in LiveCodeBench


def test_evalplus_plus_inputs_catch_what_base_inputs_miss(pool):
    rec = [json.loads(line) for line in (FIXTURES / "evalplus.jsonl").read_text().splitlines()][3]  # gcd
    base, plus = convert(rec, "e", variant="base"), convert(rec, "e")
    no_zero = "def greatest_common_divisor(a, b):\n    return max(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)\n"
    assert judge(pool, base, no_zero) == ("PASS", "")
    assert judge(pool, plus, no_zero)[0] == "MODEL_FAIL"


def test_evalplus_float_tolerance(pool):
    truncate, mad = tasks("evalplus.jsonl")[1:3]
    assert judge(pool, truncate, "def truncate_number(number):\n    return number - int(number)\n") == ("PASS", "")
    assert judge(pool, truncate, "def truncate_number(number):\n    return round(number - int(number), 3)\n") \
        == ("MODEL_FAIL", "wrong_answer")
    reordered = ("def mean_absolute_deviation(numbers):\n    m = sum(reversed(numbers)) / len(numbers)\n"
                 "    return sum(abs(m - x) for x in reversed(numbers)) / len(numbers)\n")
    assert judge(pool, mad, reordered) == ("PASS", "")


def test_evalplus_find_zero_takes_any_root(pool):
    find_zero = tasks("evalplus.jsonl")[4]
    newton = ("def find_zero(xs):\n    x = 0.5\n    for _ in range(200):\n"
              "        f = sum(c * x ** i for i, c in enumerate(xs))\n"
              "        d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)\n"
              "        x = x - f / d if d else x + 1.0\n    return x\n")
    assert judge(pool, find_zero, newton) == ("PASS", "")  # not the reference's root: |poly(x)| <= atol is what counts


@pytest.mark.parametrize("name", ["kodcode.jsonl", "mbpp.jsonl", "evalplus.jsonl"])
def test_code_verifier_judges_fenced_references(pool, name):
    examples = tasks(name)
    jobs = [build_job(ex["completion"], ex) for ex in examples]
    assert [o.cls.value for o in pool.run(jobs)] == ["PASS"] * len(examples)


def test_check_on_published_records_with_a_program(make_pool, tmp_path, capsys):
    make_pool().close()
    recs = [json.loads(line) for line in (FIXTURES / "evalplus.jsonl").read_text().splitlines()][3:4]
    recs[0]["program"] = "def greatest_common_divisor(a, b):\n    return max(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)\n"
    kod = json.loads((FIXTURES / "kodcode.jsonl").read_text().splitlines()[2])
    recs.append({**kod, "program": kod["solution"]})
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (out[0]["outcome"], out[0]["base"]["outcome"]) == ("MODEL_FAIL", "PASS")
    assert (out[1]["id"], out[1]["outcome"]) == ("Prefill_1003_C", "PASS")


def test_check_names_file_and_line_of_a_record_without_program(make_pool, tmp_path, capsys):
    path = tmp_path / "k.jsonl"
    path.write_text((FIXTURES / "kodcode.jsonl").read_text().splitlines()[0] + "\n")
    assert main(["sandbox", "check", str(path)]) == 2
    assert capsys.readouterr().err == f"posttrain sandbox: error: {path}:1: missing key 'program'\n"


@pytest.mark.parametrize("action", ["check", "audit"])
@pytest.mark.parametrize("content, extra, message", [
    ('{"question": "q", "solution": "s", "test_code": 5}\n', [], ":1: field 'test_code' of a kodcode record must be a non-empty string"),
    ('{"id": 1}\n{"test_list": ["assert f() == 1"], "code": "def f(): return 1", "text": "t", "program": "x"}\n',
     [], ":1: cannot tell the dataset format from the fields ['id']"),
    ('{"prompt": "p"}\n', ["--format", "leetcode"], ": unknown dataset format 'leetcode'"),
    ('{"question_content": "q", "public_test_cases": "[]", "contest_date": "soon"}\n', [], ":1: contest_date 'soon' is not an ISO date"),
    ('{"question_content": "q", "contest_date": "2024-01-01"}\n', ["--format", "livecodebench"],
     ":1: a livecodebench record needs the field 'public_test_cases'"),
    ('{"task_id": "Mbpp/2", "prompt": "", "entry_point": "f", "canonical_solution": "", "base_input": "[[1]",'
     ' "plus_input": []}\n', [], ":1: field 'base_input' of an evalplus record is not JSON"),
    ('{"test_list": ["assert f() == 1"], "code": "def f(): return 1", "text": "t", "test_setup_code": ["x"]}\n',
     [], ":1: field 'test_setup_code' of a mbpp record must be a string"),
])
def test_bad_published_records_exit_2_naming_file_and_line(tmp_path, capsys, action, content, extra, message):
    """Read before any sandbox starts: one line naming the file (and line), exit status 2."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    out = ["--out", str(tmp_path / "audit")] if action == "audit" else []
    assert main(["sandbox", action, str(path), *extra, *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posttrain sandbox: error: {path}{message}") and err.count("\n") == 1


# ----------------------------------------------------------------------------- evalplus as published
MBPP_SLICE = ["Mbpp/106", "Mbpp/124", "Mbpp/126", "Mbpp/252", "Mbpp/580", "Mbpp/596", "Mbpp/720", "Mbpp/737", "Mbpp/787",
              "Mbpp/794", "Mbpp/793"]


def test_mbpp_plus_canonicals_pass_and_trivial_programs_do_not(pool, tmp_path):
    """Tuples/sets/complex inputs, the "is not None" oracle, ``plus_input: {}``: real MBPP+ records."""
    path = write_slice(tmp_path / "MbppPlus.jsonl.gz", "MbppPlus", MBPP_SLICE)
    rows = audit([{**t, "_where": w} for w, t in load_tasks(path)], pool, str(path))
    assert [(r["id"], r["flags"]) for r in rows] == [(i, []) for i in MBPP_SLICE]


def made_task(canonical: str, inputs: list) -> dict:
    rec = {"task_id": "Mbpp/9001", "prompt": "", "entry_point": "f", "atol": 0, "canonical_solution": canonical,
           "base_input": inputs, "plus_input": []}
    return convert(rec, "made", "evalplus")


def test_reference_time_is_not_charged_and_each_input_has_its_limit(pool):
    """The pool gives a program 2 s; the reference alone takes 3 s, an O(1) program passes; one
    slower than max(1 s, 4 x the reference) on an input times out there."""
    task = made_task("import time\ndef f(x):\n    time.sleep(0.3)\n    return x\n", [[i] for i in range(10)])
    assert judge(pool, task, "def f(x):\n    return x\n") == ("PASS", "")
    assert judge(pool, task, "import time\ndef f(x):\n    time.sleep(0.3 if x < 3 else 2.0)\n    return x\n") \
        == ("MODEL_FAIL", "timeout")


@pytest.mark.parametrize("canonical", ["def f(x):\n    return 1 // x\n",
                                       "def f(x):\n    return bytearray(1 << 40)\n"])
def test_a_reference_that_fails_on_its_inputs_is_task_fail(pool, canonical):
    """Raising, or running the judge out of memory, is the task's fault: masked, never a zero reward."""
    assert judge(pool, made_task(canonical, [[1], [0]]), "def f(x):\n    return 1\n")[0] == "TASK_FAIL"


def test_check_and_audit_read_the_release_file_gzipped(make_pool, tmp_path, capsys):
    make_pool().close()
    recs = real_records("MbppPlus", ["Mbpp/737", "Mbpp/793"])
    programs = ["import re\ndef check_str(s):\n    return re.match('^[aeiouAEIOU][A-Za-z0-9_]*', s)\n",
                "def last(arr, x):\n    return len(arr) - 1 - arr[::-1].index(x) if x in arr else -1\n"]
    path = tmp_path / "MbppPlus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps({**r, "program": p}) + "\n" for r, p in zip(recs, programs))
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(o["id"], o["outcome"], o["base"]["outcome"]) for o in out] == [("Mbpp/737", "PASS", "PASS"),
                                                                           ("Mbpp/793", "PASS", "PASS")]
    assert main(["sandbox", "audit", str(path), "--workers", "1", "--out", str(tmp_path / "a")]) == 0
    assert json.loads(capsys.readouterr().out) == {"records": 2, "clean": 2, "flags": {}}
