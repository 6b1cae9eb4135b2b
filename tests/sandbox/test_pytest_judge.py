"""Pytest-style tasks (KodCode's form): real pytest in the judge, the program behind a proxy.

Each test checks one thing pytest users rely on, with a right program (PASS) and a wrong one
(MODEL_FAIL); forgeries are in test_adversarial.py."""

from __future__ import annotations

import sys

from posttrain.sandbox.pool import Job
from posttrain.sandbox.pytest_judge import imported_names, task_problem


def run(pool, program: str, tests: str) -> tuple[str, str]:
    outcome = pool.run([Job(program, tests=tests, module="solution")])[0]
    return outcome.cls.value, outcome.reason


def test_plain_asserts_pass_and_fail(pool):
    tests = "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    assert run(pool, "def add(a, b):\n    return a + b\n", tests) == ("PASS", "")
    assert run(pool, "def add(a, b):\n    return a - b\n", tests) == ("MODEL_FAIL", "wrong_answer")


def test_parametrize_runs_every_case(pool):
    tests = ("import pytest\nfrom solution import sq\n\n"
             "@pytest.mark.parametrize('x,y', [(1, 1), (2, 4), (3, 9)])\n"
             "def test_sq(x, y):\n    assert sq(x) == y\n")
    assert run(pool, "def sq(x):\n    return x * x\n", tests) == ("PASS", "")
    assert run(pool, "def sq(x):\n    return 1 if x < 3 else x * x\n", tests) == ("MODEL_FAIL", "wrong_answer")


def test_raises_with_a_builtin_and_a_program_exception(pool):
    tests = ("import pytest\nfrom solution import div, DivError\n\n"
             "def test_raises():\n    with pytest.raises(ValueError, match='neg'):\n        div(-1)\n"
             "    with pytest.raises(DivError):\n        div(0)\n")
    program = ("class DivError(ZeroDivisionError):\n    pass\n"
               "def div(x):\n    if x < 0:\n        raise ValueError('neg')\n"
               "    if x == 0:\n        raise DivError('zero')\n    return 1 / x\n")
    assert run(pool, program, tests) == ("PASS", "")
    assert run(pool, "class DivError(Exception):\n    pass\ndef div(x):\n    return 1\n", tests) \
        == ("MODEL_FAIL", "wrong_answer")


def test_an_unexpected_exception_is_a_runtime_error(pool):
    tests = "from solution import f\n\ndef test_f():\n    assert f(1) == 1\n"
    assert run(pool, "def f(x):\n    raise KeyError(x)\n", tests) == ("MODEL_FAIL", "runtime_error")


def test_approx_on_floats(pool):
    tests = "import pytest\nfrom solution import mean\n\ndef test_mean():\n    assert mean([0.1, 0.2]) == pytest.approx(0.15)\n"
    assert run(pool, "def mean(xs):\n    return sum(xs) / len(xs)\n", tests) == ("PASS", "")


def test_classes_and_fixtures(pool):
    tests = ("import pytest\nfrom solution import Stack\n\n@pytest.fixture\ndef stack():\n"
             "    s = Stack()\n    s.push(1)\n    return s\n\n"
             "class TestStack:\n    def test_pop(self, stack):\n        assert stack.pop() == 1\n"
             "        assert len(stack) == 0 and not stack\n"
             "    def test_iter(self, stack):\n        stack.push(2)\n        assert list(stack) == [1, 2]\n"
             "        assert 2 in stack and str(stack) == 'Stack(2)'\n")
    program = ("class Stack:\n    def __init__(self):\n        self.items = []\n"
               "    def push(self, x):\n        self.items.append(x)\n"
               "    def pop(self):\n        return self.items.pop()\n"
               "    def __len__(self):\n        return len(self.items)\n"
               "    def __iter__(self):\n        return iter(self.items)\n"
               "    def __str__(self):\n        return f'Stack({len(self.items)})'\n")
    assert run(pool, program, tests) == ("PASS", "")


def test_tmp_path_files_reach_the_program(pool):
    tests = ("from solution import count_lines, write_lines\n\ndef test_files(tmp_path):\n"
             "    p = tmp_path / 'a.txt'\n    p.write_text('x\\ny\\n')\n"
             "    assert count_lines(p) == 2 and count_lines(str(p)) == 2\n"
             "    write_lines(tmp_path / 'b.txt', ['1', '2', '3'])\n"
             "    assert (tmp_path / 'b.txt').read_text() == '1\\n2\\n3\\n'\n")
    program = ("def count_lines(path):\n    with open(path) as f:\n        return len(f.readlines())\n"
               "def write_lines(path, lines):\n    with open(path, 'w') as f:\n"
               "        f.write(''.join(l + '\\n' for l in lines))\n")
    assert run(pool, program, tests) == ("PASS", "")


def test_capsys_reads_what_the_program_printed(pool):
    tests = "from solution import greet\n\ndef test_greet(capsys):\n    greet('ann')\n    assert capsys.readouterr().out == 'hi ann\\n'\n"
    assert run(pool, "def greet(n):\n    print('hi', n)\n", tests) == ("PASS", "")
    assert run(pool, "def greet(n):\n    print('hello', n)\n", tests) == ("MODEL_FAIL", "wrong_answer")


def test_in_place_changes_come_back(pool):
    tests = "from solution import rotate\n\ndef test_rotate():\n    m = [[1, 2], [3, 4]]\n    rotate(m)\n    assert m == [[3, 1], [4, 2]]\n"
    program = "def rotate(m):\n    m[:] = [list(r) for r in zip(*m[::-1])]\n"
    assert run(pool, program, tests) == ("PASS", "")


def test_generators_and_module_constants(pool):
    tests = ("import itertools\nimport solution\n\ndef test_gen():\n"
             "    assert list(itertools.islice(solution.naturals(), 3)) == [0, 1, 2]\n"
             "    assert solution.LIMIT == 10\n")
    program = "LIMIT = 10\ndef naturals():\n    n = 0\n    while True:\n        yield n\n        n += 1\n"
    assert run(pool, program, tests) == ("PASS", "")


def test_a_missing_name_is_the_programs_fault(pool):
    tests = "from solution import f\n\ndef test_f():\n    assert f() == 1\n"
    assert run(pool, "def g():\n    return 1\n", tests) == ("MODEL_FAIL", "runtime_error")


def test_tests_needing_a_module_the_sandbox_lacks_are_task_fail(pool):
    tests = "import numpy_not_here\nfrom solution import f\n\ndef test_f():\n    assert f() == 1\n"
    assert run(pool, "def f():\n    return 1\n", tests) == ("TASK_FAIL", "bad_test")


def test_tests_without_a_test_are_task_fail(pool):
    assert run(pool, "def f():\n    return 1\n", "from solution import f\n") == ("TASK_FAIL", "no_tests")


def test_a_program_that_times_out(pool):
    tests = "from solution import f\n\ndef test_f():\n    assert f() == 1\n"
    outcome = pool.run([Job("def f():\n    while True:\n        pass\n", tests=tests, module="solution",
                            timeout_s=1.0)])[0]
    assert (outcome.cls.value, outcome.reason) == ("MODEL_FAIL", "timeout")


def test_judge_reads_the_tests_imports_without_running_them():
    tests = ("import os.path as p\nimport pytest\nfrom solution import f, g as h\nfrom solution import *\n"
             "EXPECTED, (A, B) = 1, (2, 3)\nfor I in range(2):\n    pass\n"
             "def helper():\n    local = 1\nclass TestX:\n    attr = 2\n")
    assert imported_names(tests) == ({"os", "pytest", "solution"},
                                     {"p", "pytest", "f", "h", "EXPECTED", "A", "B", "I", "helper", "TestX"})
    assert task_problem("def broken(:\n", "solution").startswith("the tests do not parse")
    assert task_problem("import json\nfrom solution import f\n", "solution") == ""


def test_a_fresh_sandboxs_first_task_does_not_pay_for_importing_pytest(make_pool):
    # The zygote loads pytest once; a judge forked from it must not spend the program's time limit on it.
    with make_pool() as fresh:
        tests = "from solution import f\n\ndef test_f():\n    assert f() == 1\n"
        outcome, seconds = fresh.run_timed([Job("def f():\n    return 1\n", tests=tests, module="solution",
                                                timeout_s=1.0)])[0]
    assert outcome.cls.value == "PASS" and seconds < 0.5


def test_the_pytest_runner_reports_every_test_by_node_id(tmp_path):
    """The runner under the pytest judge, alone (no sandbox): one outcome per node id, each failure
    classified, the run's own modules dropped afterwards. Repository tasks read FAIL_TO_PASS and
    PASS_TO_PASS from these outcomes."""
    from posttrain.sandbox.pytest_judge import pytest_args, run_pytest

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_mod_under_runner.py").write_text(
        "import pytest\n\ndef test_ok():\n    assert 1\n\ndef test_bad():\n    assert 0\n\n"
        "@pytest.mark.skip\ndef test_skipped():\n    pass\n\n@pytest.fixture\ndef broken():\n    raise KeyError\n\n"
        "def test_setup_error(broken):\n    pass\n")
    args = pytest_args([str(tmp_path / "test_mod_under_runner.py")], rootdir=str(tmp_path),
                       ini=str(tmp_path / "pytest.ini"), basetemp=str(tmp_path / "bt"), stop_first=False)
    run = run_pytest(args, classify=lambda excinfo: excinfo.type.__name__)
    assert run.outcomes == {"test_mod_under_runner.py::test_ok": "passed", "test_mod_under_runner.py::test_bad": "failed",
                            "test_mod_under_runner.py::test_skipped": "skipped",
                            "test_mod_under_runner.py::test_setup_error": "failed"}
    assert [reason for reason, _ in run.failures] == ["AssertionError", "KeyError"] and run.exit_code == 1
    assert not any(name.endswith("test_mod_under_runner") for name in sys.modules)


def test_tests_that_call_the_program_from_threads(pool):
    tests = ("import threading\nfrom solution import Counter\n\ndef test_threads():\n    c = Counter()\n"
             "    ts = [threading.Thread(target=lambda: [c.add() for _ in range(20)]) for _ in range(4)]\n"
             "    [t.start() for t in ts]\n    [t.join() for t in ts]\n    assert c.value == 80\n")
    program = "class Counter:\n    def __init__(self):\n        self.value = 0\n    def add(self):\n        self.value += 1\n"
    assert run(pool, program, tests) == ("PASS", "")


def test_the_star_import_brings_what_plain_pytest_sees(pool):
    # KodCode's harness puts `from solution import *` before every test module: pytest then calls a
    # set-up function the program defines, and tests use the program's names without importing them.
    tests = ("from solution import *\n\ndef test_a():\n    assert count() == 1\n\n"
             "def test_b():\n    assert count() == 1 and pytest_style() == 'ok'\n")
    program = ("calls = []\ndef setup_function():\n    calls.append(1)\ndef teardown_function():\n    calls.clear()\n"
               "def count():\n    return len(calls)\ndef pytest_style():\n    return 'ok'\n")
    assert run(pool, program, tests) == ("PASS", "")
    no_teardown = program.replace("calls.clear()", "pass")
    assert run(pool, no_teardown, tests) == ("MODEL_FAIL", "wrong_answer")


def test_isinstance_of_a_program_class(pool):
    tests = ("from solution import Node, Leaf, make\n\ndef test_kinds():\n    assert isinstance(make(1), Node)\n"
             "    assert isinstance(make(0), (Leaf, int)) and not isinstance(make(1), Leaf)\n"
             "    assert issubclass(Leaf, Node) and not isinstance(3, Node)\n")
    program = ("class Node:\n    pass\nclass Leaf(Node):\n    pass\n"
               "def make(x):\n    return Node() if x else Leaf()\n")
    assert run(pool, program, tests) == ("PASS", "")
    wrong = program.replace("class Leaf(Node)", "class Leaf")
    assert run(pool, wrong, tests) == ("MODEL_FAIL", "wrong_answer")


def test_typing_and_stdlib_names_from_the_program_work_in_the_tests(pool):
    # The program's `from typing import List` reaches the tests by the star import; the tests
    # annotate with it, as they can under plain pytest.
    tests = ("from solution import *\n\ndef helper(xs: List[int]) -> Optional[int]:\n    return total(xs)\n\n"
             "def test_total():\n    assert helper([1, 2]) == 3 and isinstance(deque([1]), deque)\n")
    program = ("from collections import deque\nfrom typing import List, Optional\n"
               "def total(xs: List[int]) -> int:\n    return sum(xs)\n")
    assert run(pool, program, tests) == ("PASS", "")


def test_tests_write_files_in_their_working_folder(pool):
    # KodCode's tests run in a folder of their own: some write a file there and read it back.
    tests = ("import sys\nfrom solution import shout\n\ndef test_shout():\n    saved = sys.stdout\n"
             "    with open('out.txt', 'w') as f:\n        sys.stdout = f\n        shout('a')\n"
             "    sys.stdout = saved\n    assert open('out.txt').read() == 'A\\n'\n")
    assert run(pool, "def shout(s):\n    print(s.upper())\n", tests) == ("PASS", "")
    assert run(pool, "def shout(s):\n    print(s)\n", tests) == ("MODEL_FAIL", "wrong_answer")


def test_a_generator_test_is_left_out_as_pytest_8_did(pool):
    # `from heapq import merge as test_merge` in a KodCode test: pytest 8 (KodCode's harness) marked
    # the generator function an expected failure that never runs; pytest 9 fails the collection.
    tests = "from heapq import merge as test_merge\nfrom solution import f\n\ndef test_f():\n    assert f() == 1\n"
    assert run(pool, "def f():\n    return 1\n", tests) == ("PASS", "")
    assert run(pool, "def f():\n    return 2\n", tests) == ("MODEL_FAIL", "wrong_answer")


def test_a_nul_byte_in_the_tests_is_the_tasks_fault(pool):
    tests = "from solution import f\n\ndef test_f():\n    assert f() == 1  # \0\n"
    assert run(pool, "def f():\n    return 1\n", tests) == ("TASK_FAIL", "bad_test")


def test_the_star_import_never_brings_plugins_to_load(pool):
    # Plain pytest would import and register each module a test module's `pytest_plugins` names.
    tests = "from solution import *\n\ndef test_f():\n    assert f() == 1\n"
    program = "pytest_plugins = ['no_such_plugin_here']\ndef f():\n    return 1\n"
    assert run(pool, program, tests) == ("PASS", "")


def test_real_kodcode_records_that_rely_on_the_harness(pool):
    # Records as KodCode published them: tests calling functions they never import (004), writing
    # a file in their working folder while printing into it through sys.stdout (038), annotating
    # with the program's `List` (051), importing a generator function as `test_merge` (Prefill 003).
    from pathlib import Path

    from posttrain.data.records import load_tasks

    folder = Path(__file__).parents[1] / "data" / "realbench" / "kodcode"
    wanted = {"Algorithm_00000004_I", "Algorithm_00000038_I", "Algorithm_00000051_I", "Prefill_00000003_I"}
    tasks = [t for path in sorted(folder.glob("*.json")) for _, t in load_tasks(str(path)) if t["id"] in wanted]
    assert {t["id"] for t in tasks} == wanted
    for task in tasks:
        assert run(pool, task["reference"], task["tests"]) == ("PASS", ""), task["id"]
        wrong = "".join(f"def {name}(*args, **kwargs):\n    return None\n" for name in task["entry_points"])
        assert run(pool, wrong, task["tests"])[0] == "MODEL_FAIL", task["id"]


def test_one_configuration_many_sessions_nothing_carried_over(tmp_path, monkeypatch):
    """`Sessions` alone (no sandbox): tasks share one pytest configuration, each runs in a fresh
    session, and nothing a task's tests defined or registered reaches the next task."""
    import pytest

    from posttrain.sandbox.pytest_judge import Sessions, scan_plugin_fixtures_once

    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    scan_plugin_fixtures_once()
    sessions = Sessions(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pytest.ini").write_text("[pytest]\n")

    def task(text: str):
        (tmp_path / "run" / "test_task.py").write_text(text)
        return sessions.run(pytest, lambda excinfo: excinfo.type.__name__, str(tmp_path / "bt"), None)

    first = task("import pytest\n\n@pytest.fixture\ndef thing():\n    return 1\n\ndef test_a(thing, tmp_path):\n    assert thing == 1\n")
    config, history = sessions.config, len(sessions.config.hook.pytest_plugin_registered._call_history)
    second = task("def test_b(thing):\n    assert thing == 1\n")  # the fixture was the last task's
    assert (first.exit_code, first.passed, second.exit_code, second.passed) == (0, 1, 1, 0)
    assert [reason for reason, _ in second.failures] == ["FixtureLookupError"]
    assert sessions.config is config and len(config.hook.pytest_plugin_registered._call_history) == history
    task("def test_c(request):\n    request.config.pluginmanager.register(object(), 'left-behind')\n")
    assert sessions.config is None  # a configuration a test changed is not used again
    assert task("def test_d():\n    assert 1\n").passed == 1 and sessions.config.pluginmanager.get_plugin("left-behind") is None


def test_what_a_task_leaves_in_the_shared_recorder_and_fixtures_stays_there(tmp_path, monkeypatch):
    """The recorder plugin and the plugins' fixture definitions are set up once per configuration:
    each task still gets its own run record and fresh fixture definitions (no cached value, no
    finalizer, undone changes), and a task's ``open_dir`` is not touched by the next task."""
    import os
    import types

    import pytest

    from posttrain.sandbox.pytest_judge import Sessions, scan_plugin_fixtures_once

    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    probe = types.SimpleNamespace(defs=[])
    monkeypatch.setitem(sys.modules, "posttrain_probe", probe)  # before the sessions: they keep it
    scan_plugin_fixtures_once()
    sessions = Sessions(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pytest.ini").write_text("[pytest]\n")
    opened = tmp_path / "opened"

    def task(text: str, basetemp: str, open_dir):
        (tmp_path / "run" / "test_task.py").write_text(text)
        return sessions.run(pytest, lambda excinfo: excinfo.type.__name__, str(tmp_path / basetemp), open_dir)

    uses = ("import os\nimport posttrain_probe\n\ndef test_a(request, tmp_path, monkeypatch):\n"
            "    posttrain_probe.defs.append(request._fixturemanager.getfixturedefs('tmp_path_factory', request.node)[0])\n"
            "    assert 'POSTTRAIN_LEFT' not in os.environ and tmp_path.is_relative_to({basetemp!r})\n"
            "    monkeypatch.setenv('POSTTRAIN_LEFT', '1')\n    assert {ok}\n")
    opened.mkdir()
    first = task(uses.format(basetemp=str(tmp_path / "bt1"), ok=False), "bt1", str(opened))
    os.chmod(opened, 0o700)
    second = task(uses.format(basetemp=str(tmp_path / "bt2"), ok=True), "bt2", None)
    third = task(uses.format(basetemp=str(tmp_path / "bt3"), ok=True), "bt3", None)
    assert list(first.outcomes.values()) == ["failed"] and len(first.failures) == 1
    for run in (second, third):
        assert list(run.outcomes.values()) == ["passed"] and run.failures == []
    assert (tmp_path / "opened").stat().st_mode & 0o777 == 0o700
    assert len({id(d) for d in probe.defs}) == 3  # the first session parses; the others get copies
    assert all(d.cached_result is None and d._finalizers == [] for d in probe.defs)
    assert "POSTTRAIN_LEFT" not in os.environ


def test_collection_asks_the_program_only_what_the_tests_use(pool):
    """Each question to the candidate is a round trip: collecting the module must not probe the
    program's objects (pytest 9 asks every module-level object for ``_mock_name``)."""
    tests = "from solution import f\n\ndef test_f():\n    assert f() == 1\n"
    outcome = pool.run([Job("def f():\n    return 1\n", tests=tests, module="solution")])[0]
    # `f` itself, its `__module__` (a standard-library name would be the judge's own), the call
    assert (outcome.cls.value, outcome.detail) == ("PASS", "1 tests, 3 calls")
