"""SWE-bench-format tasks: a task from a local git repository made here, its verdict by real pytest
in the sandbox (oracle passes, null fails, every known forgery fails — and, in the slow lane, each
forgery is shown to pass plain pytest on the same tree, so the defences are each needed), the
repository-scale tools, and bad records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs.audit import IN_PROCESS, audit_tasks, pass_rates, swe_policies
from posttrain.envs.base import EnvTaskError
from posttrain.envs.swe import SweEnv, load_task, verdict_files
from posttrain.envs.tools import format_call
from posttrain.outcome import OutcomeClass
from tests.envs.pools import start_pool
from tests.envs.swe_project import F2P, FILES, P2P, make_record


@pytest.fixture(scope="module")
def pool():
    p = start_pool(workers=1, timeout_s=30.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return make_record(tmp_path_factory.mktemp("swe"))


def episode(pool, record) -> SweEnv:
    env = SweEnv(pool=pool, max_output_chars=400)
    env.reset(record)
    return env


def tool(env, name, **args):
    result = env.step(format_call(name, args))
    return result.observation[0]["content"], result.info


def play(env, turns):
    for text in turns:
        result = env.step(text)
        if result.done:
            return result
    raise AssertionError("the turns never submitted")


# ------------------------------------------------------------------------------ the task
def test_the_task_is_the_tree_at_the_base_commit_with_the_test_patch_held_back(record):
    task = load_task(record)
    assert set(task["files"]) == set(FILES)  # LATER.md is a later commit's; .git is never in the tree
    assert set(task["hidden"]) == {"tests/hidden/test_add.py"} and "tests/hidden/test_add.py" not in task["files"]
    assert "def test_total" in task["hidden"]["tests/hidden/test_add.py"]
    assert task["fix"]["src/calc/ops.py"].count("return a + b") == 1
    assert task["fail_to_pass"] == F2P and task["pass_to_pass"] == P2P
    assert load_task(dict(record)) is task  # made once: a reset afterwards is a lookup


def test_the_verdict_tree_takes_tests_and_configuration_from_the_original(record):
    task = load_task(record)
    working = {**task["files"], "conftest.py": "x", "pytest.ini": "[pytest]\naddopts = -x\n",
               "src/sitecustomize.py": "x", "a.pth": "import x", "tests/test_mul.py": "def test_x(): pass\n",
               "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p evil'\n", "src/calc/new.py": "y = 1\n"}
    del working["tests/conftest.py"]
    tree = verdict_files(task, working)
    assert tree["tests/test_mul.py"] == FILES["tests/test_mul.py"]
    assert tree["tests/conftest.py"] == FILES["tests/conftest.py"]
    assert tree["pyproject.toml"] == FILES["pyproject.toml"]
    assert tree["tests/hidden/test_add.py"] == task["hidden"]["tests/hidden/test_add.py"]
    assert not {"conftest.py", "pytest.ini", "src/sitecustomize.py", "a.pth"} & set(tree)
    assert tree["src/calc/new.py"] == "y = 1\n"  # the agent's code stays


def test_oracle_passes_and_null_fails_with_the_fractions(pool, record):
    null = play(episode(pool, record), [format_call("submit", {})])
    assert (null.outcome.cls, null.outcome.reason) == (OutcomeClass.MODEL_FAIL, "wrong_answer")
    assert (null.info["scores"]["fail_to_pass"], null.info["scores"]["pass_to_pass"]) == (0.0, 1.0)
    oracle = play(episode(pool, record), swe_policies(load_task(record))["oracle"])
    assert oracle.outcome.cls is OutcomeClass.PASS and oracle.reward == 1.0, oracle.outcome
    assert (oracle.info["scores"]["fail_to_pass"], oracle.info["scores"]["pass_to_pass"]) == (1.0, 1.0)


def test_a_fix_that_breaks_a_passing_test_fails_on_pass_to_pass(pool, record):
    env = episode(pool, record)
    tool(env, "replace", path="src/calc/ops.py", old="return a - b", new="return a + b")
    tool(env, "replace", path="src/calc/ops.py", old="return a * b", new="return a * b + 1")
    result = env.step(format_call("submit", {}))
    assert result.outcome.reason == "wrong_answer" and result.info["scores"]["pass_to_pass"] == 0.0
    assert result.info["scores"]["fail_to_pass"] == 1.0


# ------------------------------------------------------------------------------ forgeries
# The forgeries that pass the same tree under plain pytest on the host (exit 0): without the
# verdict's defences each would score.
FORGING_ON_PLAIN_PYTEST = ("conftest_planted", "conftest_edited", "addopts", "startup_files", "patch_pytest",
                           "conftest_at_run", "os_exit", "forged_report",
                           *(n for n in IN_PROCESS if n not in ("unittest_run", "stack_walk")))  # no TestCase here; no verdict frame
EXPECTED = {"null": "wrong_answer", "conftest_planted": "wrong_answer", "conftest_edited": "wrong_answer",
            "addopts": "wrong_answer", "startup_files": "wrong_answer", "patch_pytest": "forbidden",
            "patch_builtins": "wrong_answer", "conftest_at_run": "forbidden", "os_exit": "no_verdict",
            "delete_tests": "wrong_answer", "forged_report": "no_verdict",
            **{name: "forbidden" for name in IN_PROCESS}, "unittest_run": "wrong_answer",
            "plant_bytecode": "wrong_answer", "overwrite_tests": "wrong_answer"}  # its writes are refused


def _plain_pytest(env: SweEnv, tmp: Path) -> int:
    """Exit code of plain pytest on the agent's tree with the hidden tests added, nothing restored."""
    for path, text in {**env.files(), **load_task(env.example)["hidden"]}.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    env_vars = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{tmp / 'src'}:{tmp}", "HOME": str(tmp)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *F2P, *P2P], cwd=tmp,
                          env=env_vars, capture_output=True, timeout=120).returncode


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_forgery_passes_the_verdict(pool, record, name):
    result = play(episode(pool, record), swe_policies(load_task(record))[name])
    assert result.outcome.cls is OutcomeClass.MODEL_FAIL, result.outcome
    assert result.outcome.reason == EXPECTED[name], result.outcome


@pytest.mark.slow
@pytest.mark.parametrize("name", FORGING_ON_PLAIN_PYTEST)
def test_each_forgery_fools_plain_pytest(pool, record, name, tmp_path):
    """The other half of the test above: each forgery would score without the verdict's defences."""
    env = episode(pool, record)
    for turn in swe_policies(load_task(record))[name][:-1]:  # all but the submit
        env.step(turn)
    assert _plain_pytest(env, tmp_path) == 0, f"{name} does not even fool plain pytest: it tests nothing"


SELF_RESTORING = """def add(a, b):
    import _pytest.reports as r
    init = r.TestReport.__init__

    def once(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.outcome, self.longrepr = "passed", None
        r.TestReport.__init__ = init

    r.TestReport.__init__ = once
    return a - b
"""
OVERRIDE = """def add(a, b):
    import _pytest.reports as r
    r.TestReport.failed = property(lambda self: False)
    r.TestReport.passed = property(lambda self: True)
    return a - b
"""


@pytest.mark.parametrize("body, reason", [(SELF_RESTORING, "forbidden"), (OVERRIDE, "wrong_answer")],
                         ids=["self_restoring_patch", "inherited_override"])
def test_patching_the_runner_from_a_test_call_is_seen(pool, record, body, reason):
    """Not at import: the code under test patches pytest's report when a test calls it — a patch
    that undoes itself once used (the sentinel copy of the test calls it too, and passes), or
    properties added over the report's outcome (the verdict reads the outcome itself: no effect)."""
    env = episode(pool, record)
    tool(env, "replace", path="src/calc/ops.py", old="def add(a, b):\n    return a - b\n", new=body)
    result = env.step(format_call("submit", {}))
    assert (result.outcome.cls, result.outcome.reason) == (OutcomeClass.MODEL_FAIL, reason), result.outcome


@pytest.mark.slow
@pytest.mark.parametrize("body", [SELF_RESTORING, OVERRIDE], ids=["self_restoring_patch", "inherited_override"])
def test_patching_the_runner_from_a_test_call_fools_plain_pytest(pool, record, body, tmp_path):
    env = episode(pool, record)
    tool(env, "replace", path="src/calc/ops.py", old="def add(a, b):\n    return a - b\n", new=body)
    assert _plain_pytest(env, tmp_path) == 0


@pytest.mark.slow  # the same policies as test_no_forgery_passes_the_verdict, through audit_tasks
def test_env_audit_on_the_fixture_task(pool, record):
    rows = audit_tasks([record], lambda: SweEnv(pool=pool), workers=2,
                       policies_of=lambda rec: swe_policies(load_task(rec)))
    rates = pass_rates(rows)
    assert rates.pop("oracle") == 1.0
    assert set(rates) == set(EXPECTED) and all(r == 0.0 for r in rates.values()), rates
    assert rows[0]["flags"] == []


def test_env_audit_cli_reads_swe_bench_records(record, tmp_path, capsys):
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert main(["env-audit", str(path), "--out", str(tmp_path / "audit"), "--workers", "1", "--timeout", "30"]) == 0
    summary = json.loads((tmp_path / "audit" / "summary.json").read_text())
    assert summary["pass_rate"]["oracle"] == 1.0 and summary["clean"] == 1
    assert sorted(k for k, v in summary["pass_rate"].items() if v) == ["oracle"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record) + "\n" + json.dumps({**record, "PASS_TO_PASS": 3}) + "\n")
    assert main(["env-audit", str(bad), "--out", str(tmp_path / "audit2")]) == 2
    assert f"{bad}:2: 'PASS_TO_PASS' must be a list of pytest node ids" in capsys.readouterr().err


def test_swe_bench_records_are_detected_as_published(record):
    from posttrain.data.formats import convert, detect

    assert detect(record) == "swebench"
    task = convert(record, "x.jsonl:1")
    assert task["prompt"] == record["problem_statement"] and task["id"] == "calc__calc-1"
    assert task["test_patch"] == record["test_patch"]  # the environment reads the record's own fields


# ------------------------------------------------------------------------------ the tools
def test_repository_tools_search_view_list_and_edit(pool, record):
    env = episode(pool, record)
    out, _ = tool(env, "search", pattern=r"def (add|mul)\(")
    assert out.splitlines() == ["src/calc/ops.py:1: def add(a, b):", "src/calc/ops.py:5: def mul(a, b):"]
    out, _ = tool(env, "search", pattern="import", path="tests")
    assert all(line.startswith("tests/") for line in out.splitlines())
    assert tool(env, "view", path="src/calc/ops.py", start=2, end=2)[0] == "    2     return a - b"
    assert tool(env, "list_dir")[0].splitlines() == ["README.md", "pyproject.toml", "src/", "tests/"]
    assert tool(env, "list_dir", path="src/calc")[0].splitlines() == ["__init__.py", "ops.py"]
    out, info = tool(env, "replace", path="src/calc/ops.py", old="return", new="yield")
    assert "occurs 3 times" in out and info["tool_errors"] == 1
    for name, args in (("view", {"path": "../etc/passwd"}), ("view", {"path": "nope.py"}),
                       ("view", {"path": "src/calc/ops.py", "start": 99}), ("search", {"pattern": "("}),
                       ("list_dir", {"path": "nowhere"}), ("run_tests", {"target": "tests/missing.py"})):
        out, info = tool(env, name, **args)
        assert out.startswith("error:") and info["tool_errors"] == 1, (name, out)
    result = env.step("<tool_call>{not json</tool_call>")
    assert result.observation[0]["content"].startswith("error:") and result.info["tool_errors"] == 1


def test_run_tests_runs_a_chosen_test_and_clips_from_the_end(pool, record):
    env = episode(pool, record)
    out, _ = tool(env, "run_tests", target="tests/test_mul.py::test_mul")
    assert out.splitlines()[-1].startswith("1 passed")
    tool(env, "write_file", path="tests/test_long.py",
         content="def test_long():\n    assert 'x' * 3000 == 'y', 'end of the output'\n")
    out, _ = tool(env, "run_tests", target="tests/test_long.py")
    assert out.startswith("[... ") and out.rstrip().endswith("1 failed in " + out.rstrip().split(" in ")[-1])
    assert "test_add" not in tool(env, "run_tests")[0]  # the hidden tests are not in the working copy


# ------------------------------------------------------------------------------ bad records
@pytest.mark.parametrize("change, message", [
    ({"FAIL_TO_PASS": "not json"}, "'FAIL_TO_PASS' is a string that is not a JSON list"),
    ({"FAIL_TO_PASS": []}, "'FAIL_TO_PASS' is empty"),
    ({"base_commit": 7}, "'base_commit' must be a string"),
    ({"repo_path": "/nonexistent/x"}, "'repo_path'"),
    ({"test_patch": "not a diff"}, "'test_patch' is not a git diff"),
    ({"patch": "diff --git a/src/calc/ops.py b/src/calc/ops.py\n--- a/src/calc/ops.py\n+++ b/src/calc/ops.py\n"
               "@@ -1,2 +1,2 @@\n-def nothing():\n+def x():\n     pass\n"}, "'patch' does not apply"),
])
def test_a_bad_record_is_a_task_error_naming_its_key(record, change, message):
    with pytest.raises(EnvTaskError, match=message.replace("(", r"\(")):
        load_task({**record, **change})


def test_a_plain_folder_is_a_task_too(pool, tmp_path, record):
    folder = tmp_path / "plain"
    for path, text in FILES.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    rec = {**record, "repo_path": str(folder), "instance_id": "calc-folder"}
    assert set(load_task(rec)["files"]) == set(FILES)
    oracle = play(episode(pool, rec), swe_policies(load_task(rec))["oracle"])
    assert oracle.outcome.cls is OutcomeClass.PASS, oracle.outcome


# ------------------------------------------------------------------------------ patches and trees
def test_patch_parts_for_files_the_tree_leaves_out_are_not_applied(record):
    # the checkout's .gitignore is not in the tree (a dot-file): its hunk cannot apply there
    ignore = "diff --git a/.gitignore b/.gitignore\n--- a/.gitignore\n+++ b/.gitignore\n@@ -1 +1,2 @@\n *.pyc\n+build/\n"
    task = load_task({**record, "patch": record["patch"] + ignore, "instance_id": "calc-gitignore"})
    assert task["left_out"] == [".gitignore"] and set(task["fix"]) == {"src/calc/ops.py"}


def test_apply_patch_keeps_crlf_line_endings():
    from posttrain.envs.swe import apply_patch

    files = {"a.txt": "one\r\ntwo\r\nthree\r\n"}
    patch = ("diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\r\n-two\r\n+TWO\r\n"
             " three\r\n")
    assert apply_patch(files, patch, "patch") == {"a.txt": "one\r\nTWO\r\nthree\r\n"}


def test_a_checkout_with_no_commit_named_is_read_as_its_work_tree(record):
    from posttrain.envs.swe import tree_at

    files = tree_at(record["repo_path"], "")
    assert set(files) == set(FILES) and files["src/calc/ops.py"] == FILES["src/calc/ops.py"]
