"""The candidate runs a program as plain Python runs it: no compiler flags from the sandbox's code."""

from __future__ import annotations

import pytest

from posttrain.sandbox.pool import Job

# HumanEval/0's signature with `List` never imported: plain Python raises NameError at the def.
HE0 = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
       "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
HE0_TESTS = "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3)\n"


def verdict(pool, job: Job) -> tuple[str, str]:
    out = pool.run([job])[0]
    return out.cls.value, out.reason


def test_function_call_program_does_not_inherit_postponed_annotations(pool):
    assert verdict(pool, Job(HE0, "has_close_elements", HE0_TESTS)) == ("MODEL_FAIL", "runtime_error")


def test_stdin_program_does_not_inherit_postponed_annotations(pool):
    program = "def f(xs: List[int]) -> int:\n    return sum(xs)\nprint(f([1, 2]))\n"
    assert verdict(pool, Job(program, io=(("", "3\n"),))) == ("MODEL_FAIL", "runtime_error")


def test_pytest_program_does_not_inherit_postponed_annotations(pool):
    tests = "from solution import has_close_elements\n\ndef test_f():\n    assert has_close_elements([1.0, 1.1], 0.3)\n"
    assert verdict(pool, Job(HE0, tests=tests, module="solution")) == ("MODEL_FAIL", "runtime_error")


def test_sandbox_check_fails_a_program_using_list_unimported(make_pool, tmp_path, capsys):
    import json

    from posttrain.cli import main

    make_pool(workers=1).close()  # skips where the machine has no sandbox
    path = tmp_path / "he0.jsonl"
    path.write_text(json.dumps({"id": "HumanEval/0", "program": HE0, "tests": HE0_TESTS,
                                "entry_point": "has_close_elements"}) + "\n")
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert (line["outcome"], line["reason"]) == ("MODEL_FAIL", "runtime_error")


# Values a correct program returns cross the boundary and compare as in Python (`==`), whatever
# their class in the collections module; a class of the program's own never decides.
@pytest.mark.parametrize("body, expected", [
    ("return collections.Counter(x)", "{'a': 2, 'b': 1}"),
    ("return collections.OrderedDict(sorted(collections.Counter(x).items()))", "{'a': 2, 'b': 1}"),
    ("d = collections.defaultdict(int)\n    for c in x:\n        d[c] += 1\n    return d", "{'a': 2, 'b': 1}"),
    ("return collections.namedtuple('Freq', 'a b')(x.count('a'), x.count('b'))", "(2, 1)"),
])
def test_collections_values_a_correct_program_returns_pass(pool, body, expected):
    program = f"import collections\ndef f(x):\n    {body}\n"
    tests = f"def check(candidate):\n    assert candidate('aba') == {expected}\n"
    assert verdict(pool, Job(program, "f", tests)) == ("PASS", "")


def test_an_object_equal_to_everything_is_still_refused(pool):
    program = ("class Any(tuple):\n    _fields = ('a',)\n    def __eq__(self, other):\n        return True\n"
               "def f(x):\n    return Any((0,))\n")
    tests = "def check(candidate):\n    assert candidate('aba') == (5,)\n"
    assert verdict(pool, Job(program, "f", tests))[0] == "MODEL_FAIL"


def test_a_million_floats_cross(pool):
    program = "def f(n):\n    return [1, 3] + [i / 2 for i in range(n)]\n"
    tests = "def check(candidate):\n    out = candidate(10 ** 6)\n    assert out[:3] == [1, 3, 0.0] and type(out[0]) is int and out[-1] == 499999.5\n"
    assert verdict(pool, Job(program, "f", tests, timeout_s=20)) == ("PASS", "")


def test_sandbox_check_passes_a_program_returning_a_counter(make_pool, tmp_path, capsys):
    # Mbpp/88's shape: the frequencies of a list's items, expected as a dict.
    import json

    from posttrain.cli import main

    make_pool(workers=1).close()  # skips where the machine has no sandbox
    program = "import collections\ndef freq_count(xs):\n    return collections.Counter(xs)\n"
    tests = "def check(candidate):\n    assert candidate([10, 10, 5]) == {10: 2, 5: 1}\n"
    path = tmp_path / "counter.jsonl"
    path.write_text(json.dumps({"id": "freq", "program": program, "tests": tests, "entry_point": "freq_count"}) + "\n")
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert (line["outcome"], line["reason"]) == ("PASS", "")
