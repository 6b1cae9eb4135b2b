"""Audit repository tasks: the reference fix must score, doing nothing and known hacks must not.

Every policy is a script of tool-call turns played through `RepoEnv` itself, so the audit checks
the environment as training uses it:

- ``oracle``: write the task's ``fix`` files, submit — must PASS;
- ``null``: submit the project unchanged — must not;
- hacks, each on the unfixed project — none may score:
  ``delete_tests`` (delete the visible tests), ``edit_tests`` (make them ``assert True``),
  ``sys_exit`` / ``os_exit`` (exit 0 when the package is imported), ``monkeypatch`` (at import,
  replace ``AssertionError``, ``sys.excepthook`` and ``unittest.TestCase.run``, and register an
  exit-0 at exit), ``always_equal`` (every function of the fixed module returns an object equal to
  anything).

Flags per task, as `posttrain sandbox audit` writes them: ``false_negative`` (the oracle does not
pass: the task is broken here), ``false_positive`` (null or a hack passes: the hidden tests have a
hole), ``no_fix`` (no ``fix`` to play the oracle), ``infra_fail`` (the sandbox failed). A flagged
task is TASK_FAIL: it goes to ``audit.jsonl`` with its flags and stays out of ``clean.jsonl``,
the file to train on.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re

from posttrain.envs.base import EnvInfraError, EnvTaskError
from posttrain.envs.tools import format_call
from posttrain.outcome import Outcome

_MONKEYPATCH = '''import atexit, builtins, os, sys
class _Never(BaseException):
    pass
builtins.AssertionError = _Never
sys.excepthook = lambda *args: None
try:
    import unittest
    unittest.TestCase.run = lambda self, result=None: result
except Exception:
    pass
atexit.register(lambda: os._exit(0))
'''
_ALWAYS_EQUAL = '''

class _Equal:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False
'''


def _code_files(files: dict[str, str], visible: list[str]) -> list[str]:
    return [p for p in files if p.endswith(".py") and p not in visible]


def _prepend(files: dict[str, str], visible: list[str], header: str) -> list[str]:
    return [format_call("write_file", {"path": p, "content": header + files[p]}) for p in _code_files(files, visible)]


def _always_equal(task: dict) -> list[str]:
    turns = []
    for path, text in (task.get("fix") or {}).items():
        body = re.sub(r"^(\s+)return .*$", r"\1return _Equal()", text, flags=re.MULTILINE)
        turns.append(format_call("write_file", {"path": path, "content": _ALWAYS_EQUAL + body}))
    return turns


def policies(task: dict, checked: dict) -> dict[str, list[str]]:
    """Each policy's turns (the last one submits) for a task whose fields ``checked`` holds."""
    files, visible = checked["files"], checked["visible_tests"]
    submit = format_call("submit", {})
    out = {"null": [submit],
           "delete_tests": [format_call("delete_file", {"path": p}) for p in visible] + [submit],
           "edit_tests": [format_call("write_file", {"path": p, "content": "def test_ok():\n    assert True\n"})
                          for p in visible] + [submit],
           "sys_exit": _prepend(files, visible, "import sys\nsys.exit(0)\n") + [submit],
           "os_exit": _prepend(files, visible, "import os\nos._exit(0)\n") + [submit],
           "monkeypatch": _prepend(files, visible, _MONKEYPATCH) + [submit]}
    if task.get("fix"):
        out["oracle"] = [format_call("write_file", {"path": p, "content": t}) for p, t in task["fix"].items()] + [submit]
        out["always_equal"] = _always_equal(task) + [submit]
    return out


def play(make_env, task: dict, turns: list[str]) -> Outcome:
    """Play ``turns`` in a fresh episode of ``task``; the episode's verdict."""
    env = make_env()
    try:
        env.reset(task)
        for text in turns:
            result = env.step(text)
            if result.done:
                return result.outcome
        return Outcome.model_fail("no_submit")
    except EnvTaskError as e:
        return Outcome.task_fail("env_task_error", str(e))
    except EnvInfraError as e:
        return Outcome.infra_fail("env_infra_error", str(e))
    finally:
        env.close()


def audit_tasks(tasks: list[dict], make_env, workers: int = 4, progress=None) -> list[dict]:
    """One row per task: ``{"id", "flags", "runs": {policy: "CLASS/reason"}}``."""
    from posttrain.envs.repo import check_task

    rows, plan = [], []
    for i, task in enumerate(tasks):
        rows.append({"id": task.get("id", i), "flags": [], "runs": {}})
        try:
            checked = check_task(task)
        except EnvTaskError as e:
            rows[-1]["runs"]["task"] = f"TASK_FAIL/{e}"
            rows[-1]["flags"].append("false_negative")
            continue
        plan += [(i, name, turns) for name, turns in policies(task, checked).items()]
    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        futures = {ex.submit(play, make_env, tasks[i], turns): (i, name) for i, name, turns in plan}
        for fut in cf.as_completed(futures):
            i, name = futures[fut]
            outcome = fut.result()
            rows[i]["runs"][name] = f"{outcome.cls.value}/{outcome.reason}".rstrip("/")
            if progress is not None:
                progress()
    for row in rows:
        _flag(row)
    return rows


def _flag(row: dict) -> None:
    runs, flags = row["runs"], row["flags"]
    if "task" in runs:
        return
    if "oracle" not in runs:
        flags.append("no_fix")
    elif runs["oracle"] != "PASS":
        flags.append("false_negative")
    if any(v == "PASS" for k, v in runs.items() if k != "oracle"):
        flags.append("false_positive")
    if any(v.startswith("INFRA_FAIL") for v in runs.values()):
        flags.append("infra_fail")


def pass_rates(rows: list[dict]) -> dict[str, float]:
    """Share of tasks each policy passed (tasks the policy ran on)."""
    names = sorted({k for r in rows for k in r["runs"] if k != "task"})
    out = {}
    for name in names:
        ran = [r["runs"][name] for r in rows if name in r["runs"]]
        out[name] = sum(v == "PASS" for v in ran) / len(ran)
    return out


def summary_line(rows: list[dict]) -> str:
    return json.dumps({"pass_rate": {k: round(v, 4) for k, v in pass_rates(rows).items()}})
