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

import collections
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


# ---------------------------------------------------------------- SWE-bench-format tasks
# A pytest plugin that swallows every test's exception: the suite passes wherever it is loaded.
_SWALLOW = '''import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception:
        return None
'''
_PATCH_PYTEST = '''
import _pytest.reports as _reports
_init = _reports.TestReport.__init__


def _passed(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None


_reports.TestReport.__init__ = _passed
'''
# At import, write the swallowing plugin as the conftest.py of every test folder not collected yet.
_PLANT_CONFTESTS = '''
import os as _os
_top = _os.getcwd()
for _dir, _subdirs, _names in _os.walk(_top):
    if "test" in _dir[len(_top):] and "__pycache__" not in _dir:
        _path = _os.path.join(_dir, "conftest.py")
        _old = open(_path).read() if _os.path.exists(_path) else ""
        if "swallow" not in _old:
            try:  # the verdict's own conftest files are read-only: plant where there is none
                with open(_path, "w") as _f:
                    _f.write(_old + "\\n# swallow\\n" + ''' + repr(_SWALLOW) + ''')
            except OSError:
                pass
'''
_FORGE_REPORT = '''
import json as _json, os as _os
_line = _json.dumps({"outcomes": {}, "exit_code": 0, "tampered": [], "passed": True})
for _fd in range(1, 32):
    try:
        _os.write(_fd, ("0" * 32 + " " + _line + "\\n").encode())
    except OSError:
        pass
for _name in ("report.json", "junit.xml", ".pytest_cache/v/cache/lastfailed"):
    try:
        _os.makedirs(_os.path.dirname(_name) or ".", exist_ok=True)
        open(_name, "w").write(_line)
    except OSError:
        pass
_os._exit(0)
'''


# Forgeries from inside the test session's own process, each at the package's import (the verdict
# cannot keep the code under test out of the process that runs its tests). A plugin whose reports
# all say "passed", registered on the live plugin manager found through an ordinary class
# attribute (the debugger's, set once pytest is configured: polled from a thread) or through the
# assertion rewriter in sys.meta_path.
_FORGE_PLUGIN = '''
import sys as _sys
import pytest as _pytest


class _Forge:
    @_pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        from _pytest.reports import TestReport
        report = TestReport.from_item_and_call(item, call)
        report.outcome, report.longrepr = "passed", None
        return report
'''
_PLUGIN_BY_PDB = _FORGE_PLUGIN + '''

def _register():
    import time
    from _pytest.debugging import pytestPDB
    for _ in range(20000):
        manager = pytestPDB._pluginmanager
        if manager is not None:
            manager.register(_Forge(), "forge")
            return
        time.sleep(0.0005)


import threading as _threading
_threading.Thread(target=_register, daemon=True).start()
_threading.Event().wait(0.2)
'''
_PLUGIN_BY_REWRITER = _FORGE_PLUGIN + '''
for _finder in _sys.meta_path:
    _config = getattr(_finder, "config", None)
    if _config is not None and not _config.pluginmanager.has_plugin("forge"):
        _config.pluginmanager.register(_Forge(), "forge")
'''
# The same route, the tests not run at all: each test's body is replaced before it runs.
_PLUGIN_SKIPS_TESTS = '''
import sys as _sys
import pytest as _pytest


class _Skip:
    @_pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        item.runtest = lambda: None


for _finder in _sys.meta_path:
    _config = getattr(_finder, "config", None)
    if _config is not None and not _config.pluginmanager.has_plugin("skip"):
        _config.pluginmanager.register(_Skip(), "skip")
'''
# Rewrites a test module's source so that nothing in it can fail: asserts always hold, unittest's
# assertion methods do nothing.
_STUB_SOURCE = '''
def _stub(text):
    import re
    text = re.sub(r"(?m)^(\\s*)assert ", r"\\1assert True or ", text)
    return re.sub(r"self\\.assert\\w*\\(", "(lambda *a, **k: None)(", text)


def _test_files(top):
    import os
    for folder, _dirs, names in os.walk(top):
        for name in names:
            if name.startswith("test") and name.endswith(".py"):
                yield os.path.join(folder, name)
'''
# An import hook first in sys.meta_path that serves a stubbed copy of every test module.
_IMPORT_HOOK = _STUB_SOURCE + '''
import importlib.abc as _abc
import importlib.machinery as _machinery
import importlib.util as _util
import sys as _sys


class _Stubs(_abc.MetaPathFinder, _abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if not name.rpartition(".")[2].startswith("test"):
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is None or not str(spec.origin).endswith(".py"):
            return None
        return _util.spec_from_file_location(name, spec.origin, loader=self)

    def exec_module(self, module):
        with open(module.__file__) as f:
            exec(compile(_stub(f.read()), module.__file__, "exec"), module.__dict__)


_sys.meta_path.insert(0, _Stubs())
'''
# unittest's TestCase.run reports success without running the test.
_UNITTEST_RUN = '''
import unittest as _unittest


def _run(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
    return result


_unittest.TestCase.run = _run
'''
# The package, imported before the tests (tests/__init__.py, a conftest), rewrites the test files
# on disk before pytest imports them.
_OVERWRITE_TESTS = _STUB_SOURCE + '''
import os as _os
for _path in _test_files(_os.getcwd()):
    try:
        with open(_path) as _f:
            _text = _f.read()
        with open(_path, "w") as _f:
            _f.write(_stub(_text))
    except OSError:
        pass
'''
# ... or writes pytest's cached bytecode for them (what pytest checks is in: the hash of the real
# file's source; a stub's code inside), which pytest loads instead of rewriting the source: beside
# the test files, or, where those folders are read-only, under a sys.pycache_prefix of its own,
# where pytest's rewriter then looks. One program, two places (`{setup}` and `{folder}`).
_BYTECODE = _STUB_SOURCE + '''
import importlib.util as _iu
import marshal as _marshal
import os as _os
import sys as _sys
try:
    from _pytest.assertion.rewrite import PYC_TAIL as _TAIL
except ImportError:
    _TAIL = None
{setup}
for _path in _test_files(_os.getcwd()) if _TAIL else ():
    try:
        with open(_path, "rb") as _f:
            _data = _f.read()
        _code = compile(_stub(_data.decode()), _path, "exec")
        _dir = {folder}
        _os.makedirs(_dir, exist_ok=True)
        _head = _iu.MAGIC_NUMBER + b"\\x03\\x00\\x00\\x00" + _iu.source_hash(_data)[:8]
        with open(_os.path.join(_dir, _os.path.basename(_path)[:-3] + _TAIL), "wb") as _f:
            _f.write(_head + _marshal.dumps(_code))
    except OSError:
        pass
'''
_PLANT_BYTECODE = _BYTECODE.replace("{setup}\n", "").replace(
    "{folder}", '_os.path.join(_os.path.dirname(_path), "__pycache__")')
_BYTECODE_PREFIX = _BYTECODE.replace("{setup}", '_sys.pycache_prefix = "/tmp/.forged-pyc"').replace(
    "{folder}", "_sys.pycache_prefix + _os.path.dirname(_os.path.abspath(_path))")
# Stack walking: the frame that runs the session holds the report's nonce, the saved output and the
# test ids; write an all-passed report there and leave before the real one is written.
_STACK_WALK = '''
import json as _json, os as _os, sys as _sys
_frame = _sys._getframe()
while _frame is not None:
    _vars = _frame.f_locals
    if "nonce" in _vars and "out" in _vars and "ids" in _vars:
        _line = _json.dumps({"outcomes": {i: "passed" for i in _vars["ids"]}, "exit_code": 0, "tampered": [],
                             "pytest_s": 0.0})
        _os.write(_vars["out"], (_vars["nonce"] + " " + _line + "\\n").encode())
        _os._exit(0)
    _frame = _frame.f_back
'''
# Every forgery from inside the session's process, by the name the audit reports it under.
IN_PROCESS = {"plugin_by_pdb": _PLUGIN_BY_PDB, "plugin_by_rewriter": _PLUGIN_BY_REWRITER,
              "plugin_skips_tests": _PLUGIN_SKIPS_TESTS, "import_hook": _IMPORT_HOOK, "unittest_run": _UNITTEST_RUN,
              "overwrite_tests": _OVERWRITE_TESTS, "plant_bytecode": _PLANT_BYTECODE,
              "bytecode_prefix": _BYTECODE_PREFIX, "stack_walk": _STACK_WALK}


def _append(files: dict[str, str], paths: list[str], tail: str) -> list[str]:
    return [format_call("write_file", {"path": p, "content": files[p] + "\n" + tail}) for p in paths]


def swe_policies(task: dict) -> dict[str, list[str]]:
    """Each policy's turns on a loaded SWE-bench-format task (`posttrain.envs.swe.load_task`): the
    oracle (the gold patch's files), null, and the forgeries the verdict must not take."""
    from posttrain.envs.swe import guarded

    files, hidden, submit = task["files"], task["hidden"], format_call("submit", {})
    code = [p for p in files if p.endswith(".py") and not guarded(p, hidden)]
    inits = [p for p in code if p.endswith("__init__.py")] or code
    write = lambda path, text: format_call("write_file", {"path": path, "content": text})  # noqa: E731
    tests = [p for p in files if guarded(p, hidden) and p.endswith(".py")]
    out = {"null": [submit],
           "conftest_planted": [write("conftest.py", _SWALLOW), submit],
           "conftest_edited": [write(p, files[p] + "\n" + _SWALLOW) for p in files if p.endswith("conftest.py")]
           + [submit],
           "addopts": [write("swe_force.py", _SWALLOW), write("pytest.ini", "[pytest]\naddopts = -p swe_force\n"),
                       submit],
           "startup_files": [write("swe_force.py", _SWALLOW)]
           + [write(f"{d}{n}", "import os\nos.environ['PYTEST_PLUGINS'] = 'swe_force'\n")
              for d in ("", "src/") for n in ("sitecustomize.py", "usercustomize.py")]
           + [write("swe_force.pth", "import swe_force\n"), submit],
           "patch_pytest": _append(files, inits, _PATCH_PYTEST) + [submit],
           "patch_builtins": _append(files, inits, _MONKEYPATCH) + [submit],
           "conftest_at_run": _append(files, inits, _PLANT_CONFTESTS) + [submit],
           "os_exit": _append(files, inits, "import os\nos._exit(0)\n") + [submit],
           "delete_tests": [format_call("delete_file", {"path": p}) for p in tests] + [submit],
           "forged_report": _append(files, inits, _FORGE_REPORT) + [submit],
           **{name: _append(files, inits, tail) + [submit] for name, tail in IN_PROCESS.items()}}
    if task.get("fix"):
        out["oracle"] = [write(p, t) if t is not None else format_call("delete_file", {"path": p})
                         for p, t in task["fix"].items()] + [submit]
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


def repo_policies(task: dict) -> dict[str, list[str]]:
    """`policies` of a repository task, its fields checked first (`EnvTaskError` if they are bad)."""
    from posttrain.envs.repo import check_task

    return policies(task, check_task(task))


def audit_tasks(tasks: list[dict], make_env, workers: int = 4, progress=None,
                policies_of=repo_policies) -> list[dict]:
    """One row per task: ``{"id", "flags", "runs": {policy: "CLASS/reason"}}``; ``policies_of(task)``
    gives each policy's turns (or raises `EnvTaskError`: the task is broken). ``progress()`` is
    called once per task, when its last policy has played."""
    rows, plan = [], []
    for i, task in enumerate(tasks):
        rows.append({"id": task.get("id", task.get("instance_id", i)), "flags": [], "runs": {}})
        try:
            turns_of = policies_of(task)
        except EnvTaskError as e:
            rows[-1]["runs"]["task"] = f"TASK_FAIL/{e}"
            rows[-1]["flags"].append("false_negative")
            if progress is not None:
                progress()
            continue
        plan += [(i, name, turns) for name, turns in turns_of.items()]
    left = collections.Counter(i for i, _, _ in plan)  # policies still to play, per task
    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        futures = {ex.submit(play, make_env, tasks[i], turns): (i, name) for i, name, turns in plan}
        for fut in cf.as_completed(futures):
            i, name = futures[fut]
            outcome = fut.result()
            rows[i]["runs"][name] = f"{outcome.cls.value}/{outcome.reason}".rstrip("/")
            left[i] -= 1
            if progress is not None and not left[i]:
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
