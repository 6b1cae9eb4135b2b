"""SWE-bench-format tasks (``env.name=swe``): a real repository at a commit, an issue, hidden tests.

A task is one JSONL record in SWE-bench's format — ``instance_id``, ``repo``, ``base_commit``,
``patch`` (the gold fix), ``test_patch`` (the hidden tests), ``FAIL_TO_PASS``, ``PASS_TO_PASS``
(pytest node ids; a list or SWE-bench's JSON string of one), ``problem_statement`` — plus
``repo_path``: a local git checkout (the tree is read at ``base_commit``) or a plain folder (read
as it is; ``base_commit`` is then only a label; an empty one reads a checkout's work tree). The
episode's project is that tree; the test
patch is held back (an empty one: the project's own tests are the hidden tests, visible to the
agent but restored before the verdict, as in tasks made by `posttrain.envs.swe_tasks`). Files that are not UTF-8 text, dot-files and folders (``.git``, ``.github``)
and caches are left out of the tree, and the parts of ``patch``/``test_patch`` that touch them
are not applied (the task's ``left_out`` names them; `posttrain env-audit` reports them).

**Dependencies.** ``venv`` (``env.options.venv``) names a virtual environment for the sandbox's
interpreter; its site-packages is bound read-only in the sandbox (`SandboxConfig.site_packages`)
and put on the import path after the project's tree, for the verdict and ``run_tests``. pytest
and its plugins still come from posttrain's own environment, imported first. The interpreter
keeps ``-I -S``: the venv's ``.pth`` files are never run (install dependencies non-editable;
PEP 420 namespace packages work, ``-nspkg.pth`` ones do not).

**The tree in the sandbox.** The task's tree (`Tree`, made once per record and process) is
written once to the sandbox's shared read-only store and mounted at `ROOT` under an overlay for
each run (`posttrain.sandbox.trees`); a run's program carries only what differs from it (the
episode's changes, for the verdict also the restored tests), so a run costs the same at any
project size.

**The verdict.** Submitting runs real pytest (the library) in the code sandbox on the agent's
tree after restoring, from the original with the test patch applied: every test file (under a
``tests``/``test``/``testing`` folder, ``test_*.py``, ``*_test.py``, every path the test patch
touches), every ``conftest.py``, ``pytest.ini``, ``pyproject.toml``, ``setup.cfg`` and
``tox.ini``; such files the agent added are removed, and so are ``sitecustomize.py``,
``usercustomize.py`` and ``.pth`` files. The reward is 1 when every FAIL_TO_PASS and PASS_TO_PASS
test passes. A test suite imports the code under test into its own process, so that code can
change anything the session holds; no list of the runner's objects can hold there. What holds
instead (docs/envs.md, "What the SWE verdict trusts"):

- **a forged "passed" shows**: before each verdict the required tests get fresh random names and
  must-fail copies of some of them (sentinels) are mixed in, on the host
  (`posttrain.envs.swe_sentinels`); the sandbox sees only the random names, and a report in
  which a sentinel passed, or vanished while its original passed, is MODEL_FAIL (forbidden);
- **tests and configuration from a read-only layer**: restored as above, they are the job's
  hidden files (`tree_job`'s ``hidden``): the sandbox writes each one and binds it read-only
  over itself before the program starts (`posttrain.sandbox.inside.mounts.place_hidden`), so
  code under test cannot write, truncate, chmod, unlink or rename over one, nor rename its
  folder away; the program writes only the agent's changes;
- **no bytecode from the tree**: none is written, the cache prefix is a path under ``/dev/null``
  where no folder can exist, and each folder holding a hidden file has an empty read-only
  ``__pycache__``; pytest's cache plugin is off. Code under test can still reset the prefix to a
  folder of its own and plant bytecode there (docs/envs.md says exactly how): a takeover of the
  session, which the sentinels are for;
- **start-up**: ``PYTEST_*``/``PYTHON*`` variables cleared,
  plugin autoloading off; the interpreter runs with ``-I -S`` (no ``sitecustomize``,
  ``usercustomize`` or ``.pth`` file is read);
- **the report**: one line starting with a random nonce (read and stdin closed before the tree
  is importable) on a copy of stdout taken before pytest ran; ``os._exit(0)``, a crash or a
  timeout leaves none (MODEL_FAIL no_verdict). The code under test can find the nonce and write
  a report of its own: the sentinels are what make such a report detectable.

Outcomes: PASS; MODEL_FAIL (wrong_answer with the F2P/P2P fractions, forbidden, no_verdict,
timeout); TASK_FAIL when the record is malformed or its patches do not apply (`EnvTaskError`);
INFRA_FAIL when the sandbox failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
from pathlib import Path

from posttrain.envs.base import EnvTaskError, StepResult
from posttrain.envs.repo import PathError, RepoEnv, check_path
from posttrain.envs.swe_sentinels import Hidden, hide
from posttrain.outcome import Outcome, OutcomeClass
from posttrain.sandbox.trees import Tree, overlay
from posttrain.sandbox.zygote import SITE_DIR, TREE_DIR

FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
          "problem_statement", "repo_path")
CONFIG_NAMES = frozenset({"conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"})
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
TEST_DIRS = frozenset({"tests", "test", "testing"})
SKIP_DIRS = frozenset({"__pycache__", "build", "dist", "node_modules"})
MAX_FILES = 4000
MAX_FILE_CHARS = 512 * 1024
MAX_TREE_CHARS = 16 * 1024 * 1024
ROOT = TREE_DIR  # the sandbox shows the task's tree here (`posttrain.sandbox.trees`)
PROMPT = ("{problem}\n\nThe repository {repo} ({n} files) is checked out at its commit. Find the cause, "
          "fix it with the tools, then submit.")


# --------------------------------------------------------------------------------- the record
def _ids(record: dict, key: str) -> list[str]:
    value = record.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise EnvTaskError(f"'{key}' is a string that is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise EnvTaskError(f"'{key}' must be a list of pytest node ids")
    return value


def check_record(record: dict) -> dict:
    """The record's fields, checked (`EnvTaskError` names the first bad key)."""
    if not isinstance(record, dict):
        raise EnvTaskError("a task is a JSON object")
    for key in FIELDS:
        if key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            continue
        if not isinstance(record.get(key), str):
            raise EnvTaskError(f"'{key}' must be a string")
    f2p, p2p = _ids(record, "FAIL_TO_PASS"), _ids(record, "PASS_TO_PASS")
    if not f2p:
        raise EnvTaskError("'FAIL_TO_PASS' is empty: nothing would tell a fix from no change")
    if not Path(record["repo_path"]).is_dir():
        raise EnvTaskError(f"'repo_path': {record['repo_path']!r} is not a folder")
    return {**record, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}


def is_swe_record(record: dict) -> bool:
    return isinstance(record, dict) and "FAIL_TO_PASS" in record and "test_patch" in record


# ----------------------------------------------------------------------------------- the tree
def _keep(path: str) -> bool:
    try:
        check_path(path)
    except PathError:  # dot-files and names outside the tools' alphabet
        return False
    parts = path.split("/")
    return not any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts) and not path.endswith((".pyc", ".pyo"))


def _git(repo: str, *args: str, data: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", "-C", repo, *args], input=data, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise EnvTaskError(f"git {args[0]} in {repo}: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def _is_git(repo: str) -> bool:
    proc = subprocess.run(["git", "-C", repo, "rev-parse", "--is-inside-work-tree"], capture_output=True)
    return proc.returncode == 0 and (Path(repo) / ".git").exists()


def _text(data: bytes) -> str | None:
    if len(data) > MAX_FILE_CHARS or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tree_at(repo: str, commit: str) -> dict[str, str]:
    """``{path: text}`` of a git checkout at ``commit``, or of a folder as it is (a plain folder,
    or a checkout's work tree when ``commit`` is empty)."""
    if commit and _is_git(repo):
        entries = [e for e in _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).split(b"\0") if e]
        blobs = []
        for entry in entries:
            meta, path = entry.split(b"\t", 1)
            mode, kind, sha = meta.split()
            if kind == b"blob" and mode in (b"100644", b"100755") and _keep(path.decode()):
                blobs.append((path.decode(), sha.decode()))
        raw = _git(repo, "cat-file", "--batch", data="".join(f"{s}\n" for _, s in blobs).encode())
        out, at = {}, 0
        for path, _ in blobs:
            head_end = raw.index(b"\n", at)
            size = int(raw[at:head_end].split()[2])
            text = _text(raw[head_end + 1:head_end + 1 + size])
            at = head_end + 2 + size
            if text is not None:
                out[path] = text
    else:
        out = {}
        for folder, dirs, names in os.walk(repo):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
            for name in names:
                full = os.path.join(folder, name)
                path = os.path.relpath(full, repo).replace(os.sep, "/")
                text = _text(Path(full).read_bytes()) if _keep(path) and not os.path.islink(full) else None
                if text is not None:
                    out[path] = text
    if len(out) > MAX_FILES or sum(map(len, out.values())) > MAX_TREE_CHARS:
        raise EnvTaskError(f"'repo_path': more than {MAX_FILES} files or {MAX_TREE_CHARS} characters")
    return out


def patch_paths(patch: str) -> list[str]:
    """The paths a unified git diff touches (old and new names)."""
    found = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.MULTILINE)
    return list(dict.fromkeys(p for pair in found for p in pair))


def kept_sections(patch: str) -> tuple[str, list[str]]:
    """``patch`` without the files the tree leaves out (dot-files such as ``.gitignore``, caches:
    `_keep`), and the paths left out."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    kept, left_out = [], []
    for section in sections:
        paths = patch_paths(section)
        if paths and not all(_keep(p) for p in paths):
            left_out += paths
        else:
            kept.append(section)
    return "".join(kept), left_out


def apply_patch(files: dict[str, str], patch: str, key: str) -> dict[str, str | None]:
    """``{path: new text, or None when deleted}`` for each path ``patch`` touches, applied with
    ``git apply`` to those files alone in a scratch folder (`EnvTaskError` when it does not apply).
    Line endings are kept as they are (CRLF stays CRLF)."""
    paths = patch_paths(patch)
    if not paths:
        raise EnvTaskError(f"'{key}' is not a git diff (no 'diff --git' line)")
    with tempfile.TemporaryDirectory(prefix="swe-patch-") as tmp:
        for path in paths:
            if path in files:
                (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / path).write_bytes(files[path].encode("utf-8"))
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(tmp).parent)}  # never a repository above
        proc = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tmp, input=patch.encode(),
                              capture_output=True, env=env)
        if proc.returncode != 0:
            raise EnvTaskError(f"'{key}' does not apply: {proc.stderr.decode(errors='replace').strip()[:300]}")
        return {p: (Path(tmp) / p).read_bytes().decode("utf-8") if (Path(tmp) / p).is_file() else None
                for p in paths}


_CACHE: dict[str, dict] = {}
_CACHE_LOCK = threading.Lock()


def load_task(record: dict) -> dict:
    """The episode's task from a SWE-bench record: ``files`` (the tree at the commit), ``hidden``
    (what the test patch makes of the paths it touches), ``fix`` (the same for the gold patch),
    the node ids. Made once per record and process (a reset afterwards costs a dict lookup)."""
    key = hashlib.sha256(json.dumps([record.get(k) for k in FIELDS], sort_keys=True).encode()).hexdigest()
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    rec = check_record(record)
    files = tree_at(rec["repo_path"], rec["base_commit"])
    test_patch, left_tests = kept_sections(rec["test_patch"])
    patch, left_fix = kept_sections(rec["patch"])
    task = {"id": rec["instance_id"], "repo": rec["repo"], "files": files, "tree": Tree(files),
            "hidden": apply_patch(files, test_patch, "test_patch") if test_patch.strip() else {},
            "fix": apply_patch(files, patch, "patch") if patch.strip() else None,
            "left_out": sorted(set(left_tests + left_fix)),
            "fail_to_pass": rec["FAIL_TO_PASS"], "pass_to_pass": rec["PASS_TO_PASS"],
            "problem": rec["problem_statement"]}
    with _CACHE_LOCK:
        if len(_CACHE) >= 256:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = task
    return task


# ------------------------------------------------------------------------------- the verdict
def is_test_path(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (any(p in TEST_DIRS for p in parts[:-1]) or (name.startswith("test_") and name.endswith(".py"))
            or name.endswith("_test.py"))


def guarded(path: str, hidden: dict) -> bool:
    """Whether the verdict takes ``path`` from the original tree, never from the agent's."""
    name = path.rsplit("/", 1)[-1]
    return (path in hidden or is_test_path(path) or name in CONFIG_NAMES or name in STARTUP_NAMES
            or name.endswith(".pth"))


def verdict_files(task: dict, working: dict[str, str]) -> dict[str, str]:
    """The tree the hidden tests run on: the agent's code, the original's tests and configuration
    (with the test patch applied)."""
    hidden = task["hidden"]
    original = {**task["files"], **hidden}
    out = {p: t for p, t in working.items() if not guarded(p, hidden)}
    out.update({p: t for p, t in original.items() if t is not None and guarded(p, hidden)})
    return out


def ini_file(files: dict[str, str]) -> str:
    """The project's pytest configuration file, as pytest would pick it at the root ('' for none)."""
    for name, marker in (("pytest.ini", ""), ("pyproject.toml", "[tool.pytest"), ("tox.ini", "[pytest]"),
                         ("setup.cfg", "[tool:pytest]")):
        if name in files and marker in files[name]:
            return name
    return ""


def import_roots(files: dict[str, str]) -> list[str]:
    """Folders the project's code imports from: the root, and ``src`` for a src layout."""
    return [ROOT] + [f"{ROOT}/src"] * any(p.startswith("src/") for p in files)


_WRITE_TREE = '''
def _write_tree(changes, root, ini, blank_ini):
    """Turns the task's tree, shown at root, into this run's: writes each changed file and
    removes each deleted one (None). Returns the pytest configuration file to run with: the
    project's own, or a blank one at blank_ini (pytest must never look above the tree)."""
    import os
    for path, text in changes.items():
        full = os.path.join(root, path)
        if text is None:
            os.remove(full)
            continue
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    if ini:
        return root + "/" + ini
    with open(blank_ini, "w") as f:
        f.write("[pytest]\\n")
    return blank_ini
'''

# Runs in the sandbox with the nonce on stdin. Order matters: the nonce is read and stdin closed,
# stdout kept aside and the runner imported before any file of the tree is importable. No bytecode
# is written, and none is read from the tree: the cache prefix is a path under /dev/null, where no
# folder can ever be made (pytest reads its rewritten test modules' cache from there too). CHANGES
# holds only the agent's files: the tests and configuration are already in place, read-only.
_VERDICT = _WRITE_TREE + '''

def _verdict(changes, ids, ini, roots, site):
    import json, os, sys, time
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    os.close(0)
    out, write, dumps, leave = os.dup(1), os.write, json.dumps, os._exit
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    for key in [k for k in os.environ if k.startswith(("PYTEST", "PYTHON"))]:
        del os.environ[key]
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.dont_write_bytecode, sys.pycache_prefix = True, "/dev/null/pycache"
    sys.path.append("/sandbox/lib")
    import posttrain_pytest_judge as pj
    for name in ("iniconfig", "packaging.version", "pygments"):
        try:
            __import__(name)
        except ImportError:
            pass
    pj.warm()
    ini = _write_tree(changes, ROOT, ini, "/tmp/.verdict.ini")
    os.chdir(ROOT)
    sys.path[:0] = roots
    sys.path += site
    args = pj.pytest_args(ids, rootdir=ROOT, ini=ini, basetemp="/tmp/.pytest-base", conftest=True,
                          stop_first=False, lean=False, import_mode="prepend")
    clock = time.perf_counter
    t0 = clock()
    try:
        run = pj.run_pytest(["-p", "no:cacheprovider", *args], lambda excinfo: "failed")
        outcomes, code = dict(run.outcomes), run.exit_code
    except BaseException as e:
        outcomes, code = {}, "session broke: " + type(e).__name__
    line = dumps({"outcomes": outcomes, "exit_code": code, "pytest_s": clock() - t0})
    write(out, (nonce + " " + line + "\\n").encode())
    leave(0)
'''


def tree_job(program: str, base: Tree, view: dict[str, str], stdin: str, timeout_s: float,
             hidden: frozenset[str] | set[str] = frozenset()):
    """A sandbox job that runs ``program`` on ``view``: the task's tree ``base`` shown read-only
    at `ROOT` (shared by every run), with the program writing only what differs (`CHANGES`).
    The paths in ``hidden`` are not the program's to write: the sandbox places them from
    ``view``, read-only to the program (`Job.hidden`), and `CHANGES` leaves them out."""
    from posttrain.sandbox.pool import Job

    changes = {p: t for p, t in overlay(base.files, view).items() if p not in hidden}
    placed = {p: view[p] for p in hidden if view.get(p) is not None}
    return Job(f"ROOT = {ROOT!r}\nCHANGES = {changes!r}\n" + program, io=((stdin, ""),), timeout_s=timeout_s,
               capture=True, tree=base, hidden=placed or None)


def verdict_program(files: dict[str, str], ids: list[str], site: bool = False) -> str:
    """For `tree_job` on ``files``. ``site``: the venv's site-packages (`SITE_DIR`) goes on the
    path after the tree."""
    return (_VERDICT + f"\n_verdict(CHANGES, {ids!r}, {ini_file(files)!r}, {import_roots(files)!r}, "
            f"{[SITE_DIR] * site!r})\n")


def read_verdict(stdout: str, nonce: str, f2p: list[str], p2p: list[str],
                 hidden: Hidden | None = None) -> tuple[Outcome, dict]:
    """The outcome from the verdict program's output, and the F2P/P2P fractions. ``hidden``: the
    renamed tests and sentinels the program ran (`swe_sentinels.hide`)."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(nonce + " ")]
    if len(lines) != 1:
        return Outcome.model_fail("no_verdict", detail="the test session ended without its report"), {}
    report = json.loads(lines[0][len(nonce) + 1:])
    reported = report["outcomes"] if isinstance(report.get("outcomes"), dict) else {}
    outcomes = hidden.outcomes(reported) if hidden else reported
    passed = {k: outcomes.get(k) == "passed" for k in f2p + p2p}
    fractions = {"fail_to_pass": sum(passed[k] for k in f2p) / len(f2p),
                 "pass_to_pass": sum(passed[k] for k in p2p) / len(p2p) if p2p else 1.0,
                 "pytest_s": float(report.get("pytest_s") or 0.0)}
    tampered = hidden.tampered(reported) if hidden else []
    if tampered:
        return Outcome.model_fail("forbidden", detail="the report cannot be true: " + "; ".join(tampered[:3])), fractions
    failing = [k for k, ok in passed.items() if not ok]
    if failing:
        detail = (f"FAIL_TO_PASS {fractions['fail_to_pass']:.0%}, PASS_TO_PASS {fractions['pass_to_pass']:.0%}; "
                  f"not passing: {', '.join(failing[:5])} (pytest exit {report.get('exit_code')})")
        return Outcome.model_fail("wrong_answer", detail=detail), fractions
    return Outcome.passed(detail=f"{len(passed)} tests pass"), fractions


_RUN_TESTS = _WRITE_TREE + '''

def _run_tests(changes, targets, ini, roots, site):
    import os, sys
    os.dup2(1, 2)  # pytest reports a conftest that fails to import on stderr: the agent sees it too
    sys.stderr = sys.stdout
    sys.path.append("/sandbox/lib")
    import pytest
    ini = _write_tree(changes, ROOT, ini, "/tmp/.run.ini")
    os.chdir(ROOT)
    sys.path[:0] = roots
    sys.path += site
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    pytest.main(["-q", "-p", "no:cacheprovider", "-c", ini, "--rootdir", ROOT, "--basetemp", "/tmp/.pytest-base",
                 *targets])
    sys.stdout.flush()
'''


def tests_program(files: dict[str, str], targets: list[str], site: bool = False) -> str:
    """The program ``run_tests`` runs (`tree_job` on ``files``): pytest on the working copy as
    it is, its report printed."""
    return (_RUN_TESTS + f"\n_run_tests(CHANGES, {targets!r}, {ini_file(files)!r}, "
            f"{import_roots(files)!r}, {[SITE_DIR] * site!r})\n")


def venv_site(venv: str, python: str) -> str:
    """The site-packages folder of the virtual environment ``venv``, for the sandbox's interpreter
    ``python`` (ValueError naming ``env.options.venv`` when it is not a venv of that version)."""
    root = Path(venv).expanduser()
    if not (root / "pyvenv.cfg").is_file():
        raise ValueError(f"env.options.venv: {venv} is not a virtual environment (no pyvenv.cfg)")
    version = re.search(r"python(\d+\.\d+)$", Path(python).name)
    found = sorted(root.glob("lib/python3*/site-packages"))
    wanted = [d for d in found if version is None or d.parent.name == "python" + version.group(1)]
    if len(wanted) != 1:
        raise ValueError(f"env.options.venv: {venv} has no site-packages for the sandbox's {Path(python).name} "
                         f"(found: {', '.join(d.parent.name for d in found) or 'none'})")
    return str(wanted[0].resolve())


class _VenvPool:
    """The shared pool whose sandboxes bind the venv's site-packages, taken at first use (making
    an environment starts no sandbox)."""

    def __init__(self, site: str, shared_pool):
        self.site, self.shared_pool = site, shared_pool

    def run(self, jobs):
        return self.shared_pool(self.site).run(jobs)


class SweEnv(RepoEnv):
    """One episode on a SWE-bench-format task (see the module docstring): repository-scale tools on
    an overlay of the tree, the verdict by the project's tests in the sandbox."""

    TOOL_NAMES = ("list_dir", "search", "view", "replace", "write_file", "delete_file", "run_tests", "submit")
    MAX_HITS = 50

    def __init__(self, *, tools_style: str = "compact", on_malformed: str = "continue", max_turns: int | None = 16,
                 timeout_s: float = 60.0, max_output_chars: int = 2000, pool=None, venv: str = ""):
        super().__init__(tools_style=tools_style, on_malformed=on_malformed, max_turns=max_turns,
                         timeout_s=timeout_s, max_output_chars=max_output_chars, pool=pool)
        self.fractions: dict[str, float] = {}
        self.site = ""
        if venv:
            from posttrain.verifiers.code import sandbox_python, shared_pool

            cfg = getattr(pool, "cfg", None)
            self.site = venv_site(venv, cfg.python if cfg else sandbox_python())
            if pool is None:
                self._pool = _VenvPool(self.site, shared_pool)
            elif cfg and cfg.site_packages != self.site:
                raise ValueError(f"env.options.venv: the pool given does not bind {self.site}")

    def reset(self, example: dict) -> list[dict]:
        self.example, self.task, self.changes, self.fractions = example, load_task(example), {}, {}
        prompt = PROMPT.format(problem=self.task["problem"].strip(), repo=self.task["repo"], n=len(self.task["files"]))
        return [{"role": "user", "content": prompt}]

    def _put(self, path: str, text: str | None) -> str:
        path = check_path(path)
        if text is not None and len(text) > MAX_FILE_CHARS:
            raise ValueError(f"a file holds at most {MAX_FILE_CHARS} characters")
        if text is not None and path not in self.task["files"] and path not in self.changes:
            if len(self.files()) >= MAX_FILES:
                raise ValueError(f"the project holds at most {MAX_FILES} files")
        self.changes[path] = text
        return path

    def _clip_end(self, text: str) -> str:
        cut = self.max_output_chars
        return text if len(text) <= cut else f"[... {len(text) - cut} characters before]\n" + text[-cut:]

    # ------------------------------------------------------------------------------ the tools
    def list_dir(self, path: str = "") -> str:
        """List a folder of the repository: its files, and its subfolders ending in '/'.

        Args:
            path: the folder, e.g. src/pkg ('' for the root)
        """
        prefix = check_path(path) + "/" if path.strip().strip("/.") else ""
        entries = {p[len(prefix):].split("/")[0] + ("/" if "/" in p[len(prefix):] else "")
                   for p in self.files() if p.startswith(prefix)}
        if not entries:
            raise PathError(f"no folder {path!r}; list_dir('') shows the root")
        return self._clip("\n".join(sorted(entries)))

    def search(self, pattern: str, path: str = "") -> str:
        """Search the repository's files for a regular expression; one line per hit: file:line: text.

        Args:
            pattern: a Python regular expression, e.g. def parse_
            path: only files under this folder or this file ('' for all)
        """
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"bad pattern: {e}") from None
        where = check_path(path) if path.strip().strip("/.") else ""
        hits = []
        for name, text in sorted(self.files().items()):
            if where and name != where and not name.startswith(where + "/"):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{name}:{number}: {line.strip()[:200]}")
                    if len(hits) > self.MAX_HITS:
                        return self._clip("\n".join(hits[:-1]) + f"\n[more than {self.MAX_HITS} hits: narrow the search]")
        return self._clip("\n".join(hits) or "no match")

    def view(self, path: str, start: int = 1, end: int = 0) -> str:
        """Show lines start..end of a file, numbered (end 0 = to the end of the file).

        Args:
            path: the file's path
            start: first line (1-based)
            end: last line (0 = the end of the file)
        """
        lines = self._get(path).splitlines()
        if start < 1 or end < 0 or (end and end < start) or (lines and start > len(lines)):
            raise ValueError(f"{path} has {len(lines)} lines; lines {start}..{end or 'end'} are not in it")
        stop = min(end or len(lines), len(lines))
        return self._clip("\n".join(f"{n:>5} {lines[n - 1]}" for n in range(start, stop + 1)))

    def run_tests(self, target: str = "") -> str:
        """Run the repository's tests with pytest: a test file or test id (file::name), or all with ''.

        Args:
            target: e.g. tests/test_core.py or tests/test_core.py::test_parse ('' runs them all)
        """
        files = self.files()
        targets = []
        if target.strip():
            file_part = check_path(target.strip().split("::")[0])
            if file_part not in files and not any(p.startswith(file_part + "/") for p in files):
                raise PathError(f"no file or folder {file_part!r} to test")
            targets = [file_part + target.strip()[len(target.strip().split("::")[0]):]]
        outcome = self._run(tree_job(tests_program(files, targets, bool(self.site)), self.task["tree"], files, "",
                                     self.timeout_s))
        if outcome.cls is OutcomeClass.PASS:
            return self._clip_end(outcome.detail.rstrip("\n"))
        return self._clip_end(f"the test run did not finish ({outcome.reason}): {outcome.detail}")

    # ------------------------------------------------------------------------------ the verdict
    def judge(self, text: str) -> Outcome:
        """FAIL_TO_PASS and PASS_TO_PASS on the working copy, tests and configuration restored."""
        nonce, f2p, p2p = secrets.token_hex(16), self.task["fail_to_pass"], self.task["pass_to_pass"]
        job, hidden = self.verdict_job(nonce)
        outcome = self._run(job)
        if outcome.cls is not OutcomeClass.PASS:
            return outcome
        outcome, self.fractions = read_verdict(outcome.detail, nonce, f2p, p2p, hidden)
        return outcome

    def verdict_job(self, nonce: str):
        """The verdict's sandbox job on the working copy, and its `Hidden` key. Fresh names and
        sentinels each time; the restored tests and configuration and the rewritten modules are
        the job's hidden files, placed read-only by the sandbox, never written by the program."""
        view = verdict_files(self.task, self.files())
        hidden = hide(view, self.task["fail_to_pass"], self.task["pass_to_pass"])
        view.update(hidden.files)
        program = verdict_program(view, hidden.ids, bool(self.site))
        placed = {p for p in view if guarded(p, self.task["hidden"])} | set(hidden.files)
        return tree_job(program, self.task["tree"], view, nonce + "\n", self.timeout_s, placed), hidden

    def step(self, text: str) -> StepResult:
        result = super().step(text)
        if result.done and self.fractions:
            result.info["scores"] = dict(self.fractions)  # env/<key>_mean in rl and eval
        return result
