"""The repository environment (``env.name=repo``): fix a small Python project with file tools.

Each episode works on its own copy of a task's project. The model has seven tools:
``list_files``, ``read_file``, ``write_file``, ``replace`` (one exact occurrence), ``delete_file``,
``run_tests`` (the project's visible tests, run in the code sandbox; their report comes back) and
``submit``. Submitting (or a turn with no tool call) ends the episode; the reward is the task's
*hidden* tests run on the submitted copy in a fresh sandbox process.

A task (one JSONL record; `posttrain.envs.repo_tasks` writes an embedded family of them):

- ``files``: ``{path: text}``, the project as the model first sees it, visible tests included;
- ``hidden_tests``: Python source defining ``check(call)``, where ``call("pkg.mod.fn", *args)``
  imports ``pkg.mod`` from the submitted copy and calls ``fn``; e.g.
  ``def check(call):\\n    assert call("pkg.ops.add_k", 2) == 7``;
- ``prompt``: the task statement (``{files}`` in it becomes the list of files; the RL data
  loader needs it; the environment falls back to a default);
- ``visible_tests`` (optional): the test files ``run_tests`` runs (default: every
  ``tests/test_*.py`` of the working copy, those the model wrote too);
- ``fix`` (optional, for `posttrain env-audit`): ``{path: text}``, the files of the reference fix.

**Reset** copies nothing: an episode's working copy is the task's ``files`` (shared, never
written) under an overlay of the episode's own writes and deletions, so starting an episode is
checking the task's paths and making an empty dict (`bench/env_reset.py`: ~0.02 ms, 65x faster
than copying the project into a folder, ~5,000x faster than a fresh sandbox per episode).

**Isolation.** Tools that only touch files act on the overlay, on the host, after checking the
path (relative, no ``..``, bounded names and sizes). Code runs only in the sandbox
(`posttrain.sandbox`): ``run_tests`` and ``submit`` each send the whole working copy to a fresh
process that writes it into its private ``/tmp`` and runs it; after it, the sandbox kills every
process the program left, replaces that ``/tmp`` and starts the next from an empty environment.
Nothing one episode does — a planted file, a background process, an environment variable, an
edited test — reaches another episode, and the hidden tests never enter the working copy.

**Why hacks do not score.** The hidden tests run in the sandbox's judge process; the project's
code runs in the candidate process and is reached only through calls whose return values come
back as plain data (exact builtin types). Deleting or editing the visible tests changes nothing
the verdict reads; ``sys.exit(0)`` or ``os._exit(0)`` in the project is a failed call
(MODEL_FAIL); a project that patches ``unittest``, ``builtins`` or the test runner patches them
in its own process only. `posttrain env-audit` checks this on every task (docs/envs.md).

Outcomes: hidden tests pass -> PASS; fail -> MODEL_FAIL with the sandbox's reason; the hidden
tests do not load -> TASK_FAIL (bad_test); the sandbox died -> INFRA_FAIL (`EnvInfraError`).
"""

from __future__ import annotations

import re

from posttrain.envs.base import EnvInfraError, EnvTaskError, StepResult
from posttrain.envs.tool_env import ToolEnv
from posttrain.envs.tools import MalformedCall, Tool, parse_tool_calls
from posttrain.outcome import Outcome, OutcomeClass

MAX_FILES = 256
MAX_FILE_CHARS = 64 * 1024
MAX_PROJECT_CHARS = 1024 * 1024
_PART_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
ENTRY = "call"
DEFAULT_PROMPT = "Fix the bug, then submit. Files: {files}"


class PathError(ValueError):
    """A path a tool was given that is not a file of the project's tree (the model's fault)."""


def check_path(path: str) -> str:
    """``path`` as a normalised relative POSIX path, or `PathError` saying why not."""
    if not isinstance(path, str) or not path or len(path) > 200:
        raise PathError("a path is a non-empty string of at most 200 characters")
    parts = path.strip().removeprefix("./").split("/")
    for part in parts:
        if part in ("", ".", "..") or not _PART_RE.match(part):
            raise PathError(f"{path!r} is not a relative path of letters, digits, '_', '-' and '.' "
                            "(no '..', no leading '/')")
    return "/".join(parts)


def default_visible_tests(files: dict) -> list[str]:
    return sorted(p for p in files if re.match(r"^(.*/)?tests?/test_[^/]*\.py$", p) or re.match(r"^test_[^/]*\.py$", p))


def check_task(example: dict) -> dict:
    """The task's fields, checked (`EnvTaskError` names what is wrong: TASK_FAIL, never the model's)."""
    files, hidden = example.get("files"), example.get("hidden_tests")
    if not isinstance(files, dict) or not files or not all(isinstance(k, str) and isinstance(v, str)
                                                          for k, v in files.items()):
        raise EnvTaskError("the task needs 'files': a non-empty object of path -> text")
    if not isinstance(hidden, str) or "def check" not in hidden:
        raise EnvTaskError("the task needs 'hidden_tests': Python source defining check(call)")
    try:
        paths = [check_path(p) for p in files]
    except PathError as e:
        raise EnvTaskError(f"'files': {e}") from None
    if len(files) > MAX_FILES or sum(map(len, files.values())) > MAX_PROJECT_CHARS:
        raise EnvTaskError(f"'files': more than {MAX_FILES} files or {MAX_PROJECT_CHARS} characters")
    visible = example.get("visible_tests")
    if visible is None:
        visible = default_visible_tests(dict(zip(paths, files.values())))
    if not isinstance(visible, list) or not all(isinstance(v, str) and v in files for v in visible):
        raise EnvTaskError("'visible_tests' must list paths that are in 'files'")
    return {"files": dict(zip(paths, files.values())), "hidden_tests": hidden, "visible_tests": visible,
            "explicit_tests": example.get("visible_tests") is not None}


# ------------------------------------------------------------------------------ sandbox programs
# Both programs start by writing the working copy into the sandbox's private /tmp (a fresh tmpfs
# per program) and putting it first on sys.path.
_WRITE = '''import importlib, os, sys, traceback
sys.dont_write_bytecode = True
FILES = {files}
ROOT = "/tmp/work"
for _path, _text in FILES.items():
    _full = os.path.join(ROOT, _path)
    os.makedirs(os.path.dirname(_full), exist_ok=True)
    with open(_full, "w") as _f:
        _f.write(_text)
sys.path.insert(0, ROOT)
os.chdir(ROOT)
'''

_RUN_TESTS = '''
def _line(exc, path):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(path)]
    return frames[-1].line if frames else ""


def _report(path, name, exc):
    where = _line(exc, path)
    what = type(exc).__name__ + (": " + str(exc) if str(exc) else "")
    return "FAIL " + path + "::" + name + ": " + (where + " -> " if where else "") + what[:300]


_passed = _failed = 0
for _path in {tests}:
    try:
        _module = importlib.import_module(_path[:-3].replace("/", "."))
    except BaseException as e:
        print("ERROR " + _path + ": cannot import: " + type(e).__name__ + ": " + str(e)[:300])
        _failed += 1
        continue
    for _name in [n for n in vars(_module) if n.startswith("test") and callable(getattr(_module, n))]:
        try:
            getattr(_module, _name)()
            _passed += 1
        except BaseException as e:
            _failed += 1
            print(_report(_path, _name, e))
print(str(_passed) + " passed, " + str(_failed) + " failed")
sys.stdout.flush()
'''

_CALL = '''

def call(name, *args, **kwargs):
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)(*args, **kwargs)
'''


def tests_program(files: dict[str, str], tests: list[str]) -> str:
    """The program ``run_tests`` runs: a line per failed test (FAIL, or ERROR for a file that does not
    import) with the failing line and the error, then the counts."""
    return _WRITE.format(files=repr(dict(files))) + _RUN_TESTS.replace("{tests}", repr(list(tests)))


def submit_program(files: dict[str, str]) -> str:
    """The candidate the hidden tests call through ``call("pkg.mod.fn", ...)``."""
    return _WRITE.format(files=repr(dict(files))) + _CALL


def report_line(path: str, name: str, failing_line: str, error: str) -> str:
    """The ``run_tests`` report's line for a failed test, as the sandbox program prints it (for traces)."""
    return f"FAIL {path}::{name}: " + (f"{failing_line} -> " if failing_line else "") + error[:300]


# ----------------------------------------------------------------------------------- environment
class RepoEnv(ToolEnv):
    """One episode's working copy and tools (see the module docstring)."""

    def __init__(self, *, tools_style: str = "compact", on_malformed: str = "continue", max_turns: int | None = 8,
                 timeout_s: float = 10.0, max_output_chars: int = 2000, pool=None):
        super().__init__(self._tools(), tools_style=tools_style, on_malformed=on_malformed, max_turns=max_turns)
        self.timeout_s, self.max_output_chars, self._pool = timeout_s, max_output_chars, pool
        self.task: dict = {}
        self.changes: dict[str, str | None] = {}  # path -> new text, or None when deleted

    TOOL_NAMES = ("list_files", "read_file", "write_file", "replace", "delete_file", "run_tests", "submit")

    def _tools(self) -> list[Tool]:
        """The tools bound to this episode (schemas derived once per class: a reset stays cheap)."""
        if "_specs" not in type(self).__dict__:  # a subclass derives its own
            type(self)._specs = {n: Tool.from_function(getattr(self, n)) for n in self.TOOL_NAMES}
        return [Tool(n, getattr(self, n), s.description, s.parameters) for n, s in self._specs.items()]

    # ----------------------------------------------------------------------- the working copy
    def reset(self, example: dict) -> list[dict]:
        self.example, self.task, self.changes = example, check_task(example), {}
        prompt = example.get("prompt") or DEFAULT_PROMPT
        return [{"role": "user", "content": prompt.replace("{files}", ", ".join(self.task["files"]))}]

    def files(self) -> dict[str, str]:
        """The working copy: the task's files under this episode's changes."""
        out = {p: t for p, t in self.task["files"].items() if self.changes.get(p, t) is not None}
        out.update({p: t for p, t in self.changes.items() if t is not None})
        return out

    def _get(self, path: str) -> str:
        path = check_path(path)
        text = self.changes[path] if path in self.changes else self.task["files"].get(path)
        if text is None:
            raise PathError(f"no file {path!r}; list_files shows the project")
        return text

    def _put(self, path: str, text: str | None) -> str:
        path = check_path(path)
        if text is not None and len(text) > MAX_FILE_CHARS:
            raise ValueError(f"a file holds at most {MAX_FILE_CHARS} characters")
        after = {**self.files(), path: text or ""}
        if text is not None and (len(after) > MAX_FILES or sum(map(len, after.values())) > MAX_PROJECT_CHARS):
            raise ValueError(f"the project holds at most {MAX_FILES} files and {MAX_PROJECT_CHARS} characters")
        self.changes[path] = text
        return path

    def _clip(self, text: str) -> str:
        cut = self.max_output_chars
        return text if len(text) <= cut else text[:cut] + f"\n[... {len(text) - cut} more characters]"

    # ------------------------------------------------------------------------------ the tools
    def list_files(self) -> str:
        """List the project's files."""
        return "\n".join(sorted(self.files()))

    def read_file(self, path: str) -> str:
        """Show a file of the project.

        Args:
            path: the file's path, e.g. pkg/ops.py
        """
        return self._clip(self._get(path))

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file.

        Args:
            path: the file's path
            content: the file's whole new text
        """
        return f"wrote {self._put(path, content)}"

    def replace(self, path: str, old: str, new: str) -> str:
        """Replace the one occurrence of old in a file by new.

        Args:
            path: the file's path
            old: text that occurs exactly once in the file
            new: its replacement
        """
        text = self._get(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ValueError(f"old occurs {count} times in {path}; it must occur exactly once")
        return f"replaced 1 occurrence in {self._put(path, text.replace(old, new))}"

    def delete_file(self, path: str) -> str:
        """Delete a file.

        Args:
            path: the file's path
        """
        self._get(path)
        return f"deleted {self._put(path, None)}"

    def run_tests(self) -> str:
        """Run the project's tests and show which pass."""
        from posttrain.sandbox.pool import Job

        files = self.files()
        tests = self.task["visible_tests"] if self.task["explicit_tests"] else default_visible_tests(files)
        tests = [t for t in tests if t in files]
        if not tests:
            return "no test files"
        outcome = self._run(Job(tests_program(files, tests), io=(("", ""),), timeout_s=self.timeout_s, capture=True))
        if outcome.cls is OutcomeClass.PASS:
            return self._clip(outcome.detail.rstrip("\n"))
        return self._clip(f"the test run did not finish ({outcome.reason}): {outcome.detail}")

    def submit(self) -> str:
        """Submit the project as it is now; this ends the episode."""
        return "submitted"

    # ------------------------------------------------------------------------------ verdicts
    def _run(self, job) -> Outcome:
        if self._pool is None:
            from posttrain.verifiers.code import shared_pool

            self._pool = shared_pool()
        outcome = self._pool.run([job])[0]
        if outcome.cls is OutcomeClass.INFRA_FAIL:
            raise EnvInfraError(f"sandbox: {outcome.reason} {outcome.detail}")
        return outcome

    def judge(self, text: str) -> Outcome:
        """The hidden tests on the working copy as it is now."""
        from posttrain.sandbox.pool import Job

        return self._run(Job(submit_program(self.files()), ENTRY, self.task["hidden_tests"], timeout_s=self.timeout_s))

    def step(self, text: str) -> StepResult:
        try:
            calls = parse_tool_calls(text, self.by_name)
        except MalformedCall:
            return super().step(text)
        if not any(c.name == "submit" for c in calls):
            return super().step(text)
        before = calls[:[c.name for c in calls].index("submit")]
        info = {"tool_calls": len(before) + 1, "tool_errors": 0}
        if before:  # the calls written before the submit run first
            info["tool_errors"] = self.run_calls(before).info["tool_errors"]
        outcome = self.judge(text)
        return StepResult(reward=outcome.reward, done=True, outcome=outcome, info=info)
