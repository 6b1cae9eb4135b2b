"""SWE-bench-format tasks made from a real Python project and its own test suite (`posttrain
make-env-data swe DIR --from SDIST|FOLDER`), in the manner of SWE-smith: inject a bug, keep it when
the project's tests catch it.

1. **Baseline**: the project's suite runs once in the code sandbox (real pytest, the project's own
   configuration), each test's outcome noted and, with a profiler, the project's functions it
   calls (file and first line).
2. **Mutations** (`mutations`): in each function some passing test covers, one change at a time —
   an arithmetic operator swapped, a comparison flipped, an integer off by one, a boolean
   flipped, a statement dropped (``pass`` in its place), an ``and``/``or`` condition dropped,
   the first two arguments of a call swapped. Each is a splice of the changed node's source, so
   the rest of the file keeps its text.
3. **Kept** when, with the mutation, some tests of the files whose tests cover the function fail
   that passed before (FAIL_TO_PASS) and the others of those files still pass (PASS_TO_PASS);
   then both trees run exactly those ids, as the verdict will, and only ids that agree stay (a
   test whose outcome depends on what ran before it is dropped). A mutant that hangs, or makes
   those tests take over three times as long as the original plus a second (`too_slow`), is
   dropped. Only the project's code is mutated: never a test file, a ``conftest.py`` (the verdict
   restores every one, so a bug there could not be fixed) or another file the verdict restores.
4. **Problem statement**: what a user would see — the failing tests' names and their errors
   (pytest's one-line crash message), never the diff.
5. **Records**: the project goes into ``DIR/repos/NAME`` as a git repository whose first commit is
   the original; each task is a commit on top of it holding the bug (``base_commit``), its
   ``patch`` is the fix (the diff back to the original), its ``test_patch`` empty (the project's
   tests, restored before each verdict, are the hidden tests), ``repo_path`` that repository.
6. **Split**: tasks from several projects (``--from`` given more than once) are split by
   project (`project_splits`): every task of a project in the same split, chosen by a hash of
   its name, with at least one project in each split; training never shows a held-out file.
   Tasks from one project are split by a hash of the project and mutated file (`split_of`), so
   no held-out task shares a mutated function (or file) with training, but the held-out files'
   originals are in every training episode's tree: the log says so, and warns when a split is
   empty (`split_notes`), and `posttrain eval` says so of such tasks (`eval_split_note`). Each
   record's ``split_by`` ("project" or "file") says which. ``DIR/tasks_train.jsonl`` and
   ``DIR/tasks_eval.jsonl`` feed ``posttrain rl``/``eval`` with ``env.name=swe`` and
   ``posttrain env-audit``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import subprocess
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from posttrain.envs.base import EnvTaskError
from posttrain.envs.swe import _WRITE_TREE, guarded, import_roots, ini_file, tree_at, tree_job
from posttrain.errors import UserError
from posttrain.sandbox.trees import Tree

HELD_OUT_FRAC = 0.2
SLOW_FACTOR, SLOW_MARGIN_S = 3.0, 1.0
_SALT = "posttrain-swe-v1"
# Node ids the verdict can name on pytest's command line as they are.
_SAFE_ID = re.compile(r"^[\w./-]+\.py(::[\w.\[\]\-+,=]+)+$")
_SWAP_OPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
             ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift,
             ast.RShift: ast.LShift}


# ------------------------------------------------------------------------------- the project
def unpack(source: str | Path, into: Path) -> Path:
    """The project's folder: ``source`` itself, or the one top folder of an sdist (.tar.gz, .zip)
    unpacked under ``into`` (members that would land outside it are refused)."""
    source = Path(source)
    if source.is_dir():
        return source
    if not source.is_file():
        raise UserError(f"--from {source}: no such file or folder")
    into.mkdir(parents=True, exist_ok=True)
    if source.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(source) as tar:
            tar.extractall(into, filter="data")
    elif source.suffix == ".zip":
        with zipfile.ZipFile(source) as z:
            for name in z.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UserError(f"--from {source}: member {name!r} points outside the archive")
            z.extractall(into)
    else:
        raise UserError(f"--from {source}: not a folder, .tar.gz or .zip")
    tops = [p for p in into.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise UserError(f"--from {source}: expected one top folder in the archive, found {len(tops)}")
    return tops[0]


_SUITE = _WRITE_TREE + '''

def _suite(changes, targets, ini, roots, profile):
    import json, os, sys
    sys.path.append("/sandbox/lib")
    import pytest
    out = os.dup(1)
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    ini = _write_tree(changes, ROOT, ini, "/tmp/.suite.ini")
    os.chdir(ROOT)
    sys.path[:0] = roots
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    results, cover, prefix, seconds = {}, {}, ROOT + "/", [0.0]

    class Probe:
        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_call(self, item):
            seen = set()

            def note(frame, event, arg):
                if event == "call" and frame.f_code.co_filename.startswith(prefix):
                    seen.add((frame.f_code.co_filename[len(prefix):], frame.f_code.co_firstlineno))
            if profile:
                sys.setprofile(note)
            try:
                return (yield)
            finally:
                sys.setprofile(None)
                cover[item.nodeid] = sorted(seen)

        def pytest_runtest_logreport(self, report):
            seconds[0] += report.duration
            if report.failed:
                crash = getattr(report.longrepr, "reprcrash", None)
                results[report.nodeid] = ["failed", str(getattr(crash, "message", "") or "")[:400]]
            elif report.when == "call" or report.skipped:
                results.setdefault(report.nodeid, [report.outcome, ""])

    pytest.main(["-q", "-p", "no:cacheprovider", "-c", ini, "--rootdir", ROOT, "--basetemp", "/tmp/.pytest-base",
                 *targets], plugins=[Probe()])
    os.write(out, json.dumps({"results": results, "cover": cover, "seconds": seconds[0]}).encode())
    os._exit(0)
'''


# Options of pytest plugins the sandbox does not have, as projects put them in their addopts.
PLUGIN_OPTIONS = {"--cov": "pytest-cov", "-n": "pytest-xdist", "--numprocesses": "pytest-xdist",
                  "--timeout": "pytest-timeout", "--benchmark": "pytest-benchmark", "--mypy": "pytest-mypy",
                  "--flake8": "pytest-flake8", "--doctest-plus": "pytest-doctestplus"}


def plugin_options(files: dict[str, str]) -> str:
    """A message naming an option of a plugin the sandbox lacks in the project's pytest
    configuration, or ''. pytest refuses an unknown option before running any test."""
    ini = ini_file(files)
    for option, plugin in PLUGIN_OPTIONS.items():
        if ini and re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", files[ini]):
            return (f"the project's {ini} passes {option} (from {plugin}, which the sandbox's pytest does not "
                    f"have): remove it from addopts in a copy of the project")
    return ""


def suite_program(files: dict[str, str], targets: list[str], profile: bool) -> str:
    return _SUITE + f"\n_suite(CHANGES, {targets!r}, {ini_file(files)!r}, {import_roots(files)!r}, {profile!r})\n"


def run_suite(pool, base: Tree, files: dict[str, str], targets: list[str], profile: bool,
              timeout_s: float) -> dict | None:
    """The suite's ``targets`` run on ``files`` (``base`` with a few changes):
    ``{"results": {node id: [outcome, crash message]}, "cover": {node id: [[path, line], ...]},
    "seconds": the tests' own time (set-up, call and tear-down of each)}``,
    or None when the run did not finish (a timeout, a crash)."""
    from posttrain.outcome import OutcomeClass

    outcome = pool.run([tree_job(suite_program(files, targets, profile), base, files, "", timeout_s)])[0]
    if outcome.cls is not OutcomeClass.PASS:
        return None
    try:
        return json.loads(outcome.detail)
    except json.JSONDecodeError:
        return None


def too_slow(fixed_s: float, mutant_s: float) -> bool:
    """Whether a mutant makes the task's tests take too long: over `SLOW_FACTOR` times the fixed
    code's time plus `SLOW_MARGIN_S` (it loops or waits; its verdict would use up the time limit,
    and a policy would learn about time limits rather than the bug)."""
    return mutant_s > SLOW_FACTOR * fixed_s + SLOW_MARGIN_S


# ------------------------------------------------------------------------------- mutations
def functions(text: str) -> list[ast.FunctionDef]:
    """Every function and method of a module (nested ones too)."""
    return [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def first_line(fn) -> int:
    """The line the function's code object starts at (its first decorator's, if any)."""
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list])


_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%",
            ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>"}
# A comparison's operator as it is written (a pattern that matches no longer operator) -> its flip.
_CMP_TEXT = {ast.Lt: (r"<(?!=)", "<="), ast.LtE: (r"<=", "<"), ast.Gt: (r">(?!=)", ">="), ast.GtE: (r">=", ">"),
             ast.Eq: (r"==", "!="), ast.NotEq: (r"!=", "=="), ast.In: (r"(?<!not )\bin\b", "not in"),
             ast.NotIn: (r"\bnot\s+in\b", "in"), ast.Is: (r"\bis\b(?!\s+not\b)", "is not"),
             ast.IsNot: (r"\bis\s+not\b", "is")}


class _Source:
    """A module's text with ast positions (1-based line, UTF-8 byte column) turned into offsets."""

    def __init__(self, text: str):
        self.text, self.starts = text, [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.lines = text.splitlines(keepends=True)

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode(errors="ignore"))

    def span(self, node) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _edits(src: _Source, node) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """(kind, [(start, end, new text)]) for each mutation of one node; text outside the edits is kept."""
    if not hasattr(node, "end_col_offset"):  # contexts and operators have no position
        return []
    text, (start, end) = src.text, src.span(node)
    if isinstance(node, ast.BinOp) and type(node.op) in _OP_TEXT:
        a, b = src.span(node.left)[1], src.span(node.right)[0]
        old, new = _OP_TEXT[type(node.op)], _OP_TEXT[_SWAP_OPS[type(node.op)]]
        gap = text[a:b]
        return [("operator", [(a, b, gap.replace(old, new, 1))])] if gap.count(old) == 1 else []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_TEXT:
        a, b = src.span(node.left)[1], src.span(node.comparators[0])[0]
        pattern, new = _CMP_TEXT[type(node.ops[0])]
        gap, n = re.subn(pattern, new, text[a:b], count=1)
        return [("comparison", [(a, b, gap)])] if n else []
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return [("constant" if type(node.value) is bool else "off_by_one",
                 [(start, end, repr(not node.value if type(node.value) is bool else node.value + 1))])]
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        first = src.span(node.values[0])
        kept = text[first[0]:first[1]]
        loose = isinstance(node.values[0], (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
        return [("condition", [(start, end, f"({kept})" if loose else kept)])]
    if isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(x, ast.Starred) for x in node.args[:2]):
        (a0, a1), (b0, b1) = src.span(node.args[0]), src.span(node.args[1])
        return [("arguments", [(a0, a1, text[b0:b1]), (b0, b1, text[a0:a1])])]
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)):
        return [("statement", [(start, end, "pass")])]
    return []


def mutations(text: str, fn) -> list[tuple[str, str]]:
    """``(kind, mutated module text)`` for each mutation site of ``fn`` in the module ``text``
    (see the module docstring): only the changed tokens differ, so the mutant keeps the project's
    own formatting; only mutants that parse and differ."""
    src, out = _Source(text), []
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body  # not the docstring
    # f-string parts carry no usable source positions: nothing inside one is mutated
    in_fstring = {id(n) for stmt in body for j in ast.walk(stmt) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
    for node in (n for stmt in body for n in ast.walk(stmt) if id(n) not in in_fstring):
        for kind, edits in _edits(src, node):
            mutant = text
            for start, end, new in sorted(edits, reverse=True):
                mutant = mutant[:start] + new + mutant[end:]
            if mutant == text:
                continue
            try:
                ast.parse(mutant)
            except SyntaxError:
                continue
            out.append((kind, mutant))
    return out


# ------------------------------------------------------------------------------- the tasks
def _unit(key: str) -> float:
    """A stable number in [0, 1) for ``key``."""
    return int.from_bytes(hashlib.sha256(f"{_SALT}:{key}".encode()).digest()[:4], "big") / 2**32


def split_of(project: str, path: str) -> str:
    """The split of a task within one project: by its mutated file."""
    return "eval" if _unit(f"{project}:{path}") < HELD_OUT_FRAC else "train"


def project_splits(names: list[str]) -> dict[str, str]:
    """The split of each project when tasks come from several: a project is held out when its
    name hashes under `HELD_OUT_FRAC`. With two or more projects both splits get one at least:
    if the hash put them all on one side, the project nearest the threshold moves over."""
    score = {name: _unit(f"project:{name}") for name in names}
    splits = {name: "eval" if score[name] < HELD_OUT_FRAC else "train" for name in names}
    if len(names) >= 2 and len(set(splits.values())) == 1:
        side = next(iter(splits.values()))
        nearest = (min if side == "train" else max)(names, key=score.__getitem__)
        splits[nearest] = "eval" if side == "train" else "train"
    return splits


def eval_split_note(records: list[dict]) -> str:
    """A line for `posttrain eval` when SWE tasks were split within one project (``split_by``
    "file"): their files' originals were in training, so the score is not a held-out one; else ''."""
    if not any(r.get("split_by") == "file" for r in records):
        return ""
    return ("these SWE tasks were split within one project (split_by: file): training showed the held-out "
            "files unmutated, so this is not a held-out score; make tasks from several projects "
            "(make-env-data swe --from A --from B) for a clean one")


def split_notes(name: str, counts: dict[str, int]) -> list[str]:
    """What a user must know of a split made within one project: the held-out files' originals are
    in every training episode's tree; a warning when a split got no task."""
    notes = [f"{name}: the split is by mutated file within one project: every training episode shows the "
             "held-out files unmutated (hold out a whole project for a clean evaluation)"]
    for split in ("train", "eval"):
        if sum(counts.values()) and not counts.get(split):
            notes.append(f"warning: {name}: no {split} task (every kept mutant's file hashed to the other split); "
                         "make more tasks (--max-tasks) or hold out another project")
    return notes


def problem_statement(failing: dict[str, str]) -> str:
    """What a user running the tests sees: the failing tests and their errors."""
    lines = [f"Running the project's tests, {len(failing)} test(s) that used to pass now fail:"]
    for nodeid, message in list(failing.items())[:5]:
        lines.append(f"- {nodeid}: {message.strip().splitlines()[0] if message.strip() else 'fails'}")
    return "\n".join(lines) + "\nFind the cause in the code and fix it (the tests are right)."


class TaskRepo:
    """The git repository holding the original project and one commit per task (written with git's
    plumbing on a private index: the work tree is never touched)."""

    def __init__(self, folder: Path, files: dict[str, str]):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._git("init", "-q")
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        self._git("add", "-A")
        self.original = self._commit(self._git("write-tree").strip(), [], "original")

    def _git(self, *args: str, data: str | None = None, index: str | None = None) -> str:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.folder),
               "GIT_AUTHOR_NAME": "posttrain", "GIT_AUTHOR_EMAIL": "posttrain@localhost",
               "GIT_COMMITTER_NAME": "posttrain", "GIT_COMMITTER_EMAIL": "posttrain@localhost",
               "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
        if index:
            env["GIT_INDEX_FILE"] = index
        proc = subprocess.run(["git", "-C", str(self.folder), *args], input=data, capture_output=True, text=True,
                              env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"git {args[0]}: {proc.stderr.strip()[:300]}")
        return proc.stdout

    def _commit(self, tree: str, parents: list[str], message: str) -> str:
        return self._git("commit-tree", tree, *[a for p in parents for a in ("-p", p)], "-m", message).strip()

    def commit_change(self, path: str, text: str, message: str) -> tuple[str, str]:
        """(the commit with ``path`` changed to ``text``, the diff that takes it back to the original)."""
        blob = self._git("hash-object", "-w", "--stdin", data=text).strip()
        with tempfile.TemporaryDirectory() as tmp:
            index = os.path.join(tmp, "index")
            self._git("read-tree", self.original, index=index)
            self._git("update-index", "--cacheinfo", f"100644,{blob},{path}", index=index)
            tree = self._git("write-tree", index=index).strip()
        commit = self._commit(tree, [self.original], message)
        return commit, self._git("diff", commit, self.original)


def make_tasks(sources: list[str | Path], out_dir: Path, pool, *, max_tasks: int = 50, per_function: int = 2,
               timeout_s: float = 120.0, log=print) -> dict:
    """Tasks from one project or several (see the module docstring), written to ``out_dir``;
    returns each project's counts and times and the split's totals."""
    t0, made = time.monotonic(), []
    for source in sources:
        taken = {summary["project"] for summary, _ in made}
        made.append(_project_tasks(source, out_dir, pool, taken, max_tasks=max_tasks, per_function=per_function,
                                   timeout_s=timeout_s, log=log))
    records = _split(made, log)
    from posttrain.data.records import write_jsonl

    for split, rows in records.items():
        write_jsonl(out_dir / f"tasks_{split}.jsonl", rows)
    split_by = records["train"][0]["split_by"] if records["train"] else \
        records["eval"][0]["split_by"] if records["eval"] else ""
    return {"projects": [summary for summary, _ in made], "split_by": split_by, "train": len(records["train"]),
            "eval": len(records["eval"]), "seconds": round(time.monotonic() - t0, 1)}


def _split(made: list[tuple[dict, list[dict]]], log) -> dict[str, list[dict]]:
    """Train and eval records: by project where two or more projects gave tasks, else by file
    (with `split_notes` logged); each record gets its ``split_by`` and each summary its counts."""
    records: dict[str, list[dict]] = {"train": [], "eval": []}
    given = [summary["project"] for summary, rows in made if rows]
    by_project = project_splits(given) if len(given) >= 2 else {}
    for summary, rows in made:
        name = summary["project"]
        for row in rows:
            split = by_project.get(name) or split_of(name, row["mutation"]["path"])
            records[split].append({**row, "split_by": "project" if by_project else "file"})
        summary.update({split: sum(r["repo"] == name for r in records[split]) for split in records})
        if not by_project:
            for line in split_notes(name, {split: summary[split] for split in records}):
                log(line)
    if by_project:
        held = sorted(name for name, split in by_project.items() if split == "eval")
        log(f"split by project: eval holds {', '.join(held)}; train holds "
            f"{', '.join(sorted(set(by_project) - set(held)))} (no held-out file is in a training tree)")
    return records


def _project_tasks(source: str | Path, out_dir: Path, pool, taken: set[str], *, max_tasks: int, per_function: int,
                   timeout_s: float, log) -> tuple[dict, list[dict]]:
    """One project's counts and its task records (not yet split); ``taken``: the names of the
    projects made before it (each has its own repository under ``repos/``)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="swe-src-") as tmp:
        folder = unpack(source, Path(tmp))
        name = re.sub(r"[^\w.-]", "_", folder.name)
        if name in taken:
            raise UserError(f"--from {source}: a second project named {name!r} (rename its folder)")
        try:
            files = tree_at(str(folder), "")
        except EnvTaskError as e:
            raise UserError(f"--from {source}: {e}") from None
    tree = Tree(files)
    baseline = run_suite(pool, tree, files, [], True, timeout_s)
    if baseline is None or not baseline["results"]:
        plugin = plugin_options(files)
        if plugin:
            raise UserError(f"--from {source}: {plugin}")
        raise UserError(f"--from {source}: the project's test suite did not run in the sandbox (no tests found, "
                        "a missing dependency, or over the time limit)")
    passed = {k for k, (o, _) in baseline["results"].items() if o == "passed"}
    log(f"{name}: {len(files)} files, {len(baseline['results'])} tests, {len(passed)} pass "
        f"({time.monotonic() - t0:.1f} s)")
    covering: dict[tuple[str, int], set[str]] = {}
    for nodeid, seen in baseline["cover"].items():
        if nodeid in passed:
            for path, line in seen:
                covering.setdefault((path, line), set()).add(nodeid)
    repo = TaskRepo(out_dir / "repos" / name, files)
    rows, tried = [], 0
    for path in sorted(p for p in files if p.endswith(".py") and not guarded(p, {}) and not p.endswith("setup.py")):
        try:
            fns = functions(files[path])
        except SyntaxError:
            continue
        for fn in fns:
            tests = covering.get((path, first_line(fn)))
            if not tests or len(rows) >= max_tasks:
                continue
            kept, candidates = 0, mutations(files[path], fn)
            random.Random(f"{_SALT}:{name}:{path}:{fn.lineno}").shuffle(candidates)  # a mix of kinds
            for kind, mutant in candidates:
                if kept >= per_function or len(rows) >= max_tasks:
                    break
                tried += 1
                record = _try(pool, repo, name, tree, path, fn, kind, mutant, tests, passed, timeout_s)
                if record is not None:
                    rows.append(record)
                    kept += 1
    seconds = time.monotonic() - t0
    log(f"{name}: {tried} mutants tried, {len(rows)} tasks kept in {seconds:.0f} s")
    return {"project": name, "tests": len(baseline["results"]), "passing": len(passed), "tried": tried,
            "tasks": len(rows), "seconds": round(seconds, 1)}, rows


def _try(pool, repo: TaskRepo, name: str, tree: Tree, path: str, fn, kind: str, mutant: str, tests: set[str],
         passed: set[str], timeout_s: float) -> dict | None:
    """The task of one mutant, or None when the tests do not catch it (or it hangs)."""
    targets = sorted({t.split("::")[0] for t in tests})
    files, mutated = tree.files, {**tree.files, path: mutant}
    run = run_suite(pool, tree, mutated, targets, False, timeout_s)
    if run is None:
        return None
    results = run["results"]
    f2p = sorted(t for t in results if t in passed and results[t][0] != "passed" and _SAFE_ID.match(t))
    p2p = sorted(t for t in results if t in passed and results[t][0] == "passed" and _SAFE_ID.match(t))
    if not f2p or not p2p:
        return None
    # The verdict runs exactly these ids: a test whose outcome depends on what ran before it (six's
    # test_lazy) may differ there, so both trees are run that way and only agreeing ids are kept.
    gold = run_suite(pool, tree, files, f2p + p2p, False, timeout_s)
    bug = run_suite(pool, tree, mutated, f2p + p2p, False, timeout_s)
    if gold is None or bug is None:
        return None
    ok = {t for t, (o, _) in gold["results"].items() if o == "passed"}
    still = {t for t, (o, _) in bug["results"].items() if o == "passed"}
    f2p = [t for t in f2p if t in ok and t not in still]
    p2p = [t for t in p2p if t in ok and t in still]
    if not f2p or not p2p or too_slow(gold["seconds"], bug["seconds"]):
        return None
    commit, fix = repo.commit_change(path, mutant, f"{kind} in {path}:{fn.name}")
    return {"instance_id": f"{name}__{path}:{fn.name}:{kind}:{commit[:8]}", "repo": name, "base_commit": commit,
            "patch": fix, "test_patch": "", "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
            "problem_statement": problem_statement({t: results[t][1] for t in f2p}),
            "repo_path": str(repo.folder.resolve()), "mutation": {"path": path, "function": fn.name, "kind": kind}}
