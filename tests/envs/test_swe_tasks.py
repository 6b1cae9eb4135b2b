"""`posttrain make-env-data swe`: mutations worked out by hand, and tasks made from a small project
built here (its own suite run in the sandbox): each kept mutant is caught by its FAIL_TO_PASS tests,
its statement names tests and errors but never the code, the split is by file within one project
and by whole project across several (`--from` twice), a root conftest.py
and mutants that make the tests slow are left out, and the tasks' gold patch passes while
submitting the bug unchanged does not."""

from __future__ import annotations

import json
import tarfile

import pytest

from posttrain.cli import main
from posttrain.envs.audit import IN_PROCESS, swe_policies
from posttrain.envs.swe import SweEnv, load_task
from posttrain.envs.swe_tasks import _split, functions, mutations, project_splits, split_notes, split_of
from posttrain.envs.tools import format_call
from posttrain.outcome import OutcomeClass
from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
from posttrain.sandbox.worker import SandboxConfig

SOURCE = '''def f(xs, k=2):
    """Doc: 1 + 1 is not mutated."""
    out = 0  # kept comment
    for x in xs:
        if x > k and x != 3:
            out += x * 2
    g(xs, k)
    return out is not None
'''


def test_each_mutation_changes_only_its_tokens():
    (fn,) = functions(SOURCE)
    got = {}
    for kind, text in mutations(SOURCE, fn):
        changed = [(a, b) for a, b in zip(SOURCE.splitlines(), text.splitlines()) if a != b]
        assert len(changed) == 1 and len(text.splitlines()) == len(SOURCE.splitlines()), (kind, text)
        got.setdefault(kind, []).append(changed[0][1].strip())
    assert got == {
        "statement": ["pass  # kept comment", "pass", "pass"],
        "off_by_one": ["out = 1  # kept comment", "if x > k and x != 4:", "out += x * 3"],
        "condition": ["if x > k:"],
        "comparison": ["if x >= k and x != 3:", "if x > k and x == 3:", "return out is None"],
        "operator": ["out += x // 2"],
        "arguments": ["g(k, xs)"],
    }


PROJECT = {
    "shapes/__init__.py": "",
    "shapes/geometry.py": ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
                           "def is_square(w, h):\n    return w == h and w > 0\n"),
    "shapes/words.py": ("def shout(s):\n    return s.upper() + '!'\n\n\n"
                        "def vowels(s):\n    return sum(1 for c in s if c in 'aeiou')\n"),
    "tests/test_geometry.py": ("from shapes.geometry import area, is_square, perimeter\n\n\n"
                               "def test_area():\n    assert area(2, 3) == 6\n\n\n"
                               "def test_perimeter():\n    assert perimeter(2, 3) == 10\n\n\n"
                               "def test_square():\n    assert is_square(2, 2) and not is_square(2, 3)"
                               " and not is_square(0, 0)\n"),
    "tests/test_words.py": ("from shapes.words import shout, vowels\n\n\n"
                            "def test_shout():\n    assert shout('hi') == 'HI!'\n\n\n"
                            "def test_vowels():\n    assert vowels('banana') == 3\n"),
    "setup.cfg": "[tool:pytest]\ntestpaths = tests\n",
    # A helper in the root conftest.py that tests call: the verdict restores conftest.py, so a bug
    # there could never be fixed; it must not be mutated.
    "conftest.py": "import pytest\n\n\ndef twice(x):\n    return x + x\n\n\n@pytest.fixture\ndef make_twice():\n"
                   "    return twice\n",
    "tests/test_helpers.py": ("def test_twice(make_twice):\n    assert make_twice(3) == 6\n\n\n"
                              "def test_no_helper():\n    assert len('ab') == 2\n"),
    # Every mutant of clamp that the tests catch takes 1.5 s more than the original: too slow, dropped.
    "shapes/timing.py": "import time\n\n\ndef clamp(x):\n    if x < 0:\n        time.sleep(1.5)\n        return -1\n"
                        "    return x\n",
    "tests/test_timing.py": ("from shapes.timing import clamp\n\n\ndef test_clamp():\n    assert clamp(0) == 0\n\n\n"
                             "def test_clamp_positive():\n    assert clamp(5) == 5\n"),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    folder = root / "shapes-1.0"
    for path, text in PROJECT.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    sdist = root / "shapes-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(folder, arcname="shapes-1.0")
    out = root / "data"
    code = main(["make-env-data", "swe", str(out), "--from", str(sdist), "--max-tasks", "8", "--per-function", "1",
                 "--timeout", "30"])
    if code == 2:
        pytest.skip("no sandbox here")
    tasks = {split: [json.loads(line) for line in (out / f"tasks_{split}.jsonl").read_text().splitlines()]
             for split in ("train", "eval")}
    return out, tasks


def test_tasks_are_made_caught_by_their_tests_and_split_by_file(made):
    _, tasks = made
    rows = tasks["train"] + tasks["eval"]
    assert len(rows) == 5  # one per function: shout's mutants are caught too, vowels' and the rest
    assert {r["mutation"]["path"] for r in rows} == {"shapes/geometry.py", "shapes/words.py"}  # no conftest, no clamp
    for split, items in tasks.items():
        for r in items:
            assert split_of(r["repo"], r["mutation"]["path"]) == split and r["split_by"] == "file"
            assert r["FAIL_TO_PASS"] and r["PASS_TO_PASS"] and not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])
            assert all(t.startswith("tests/test_") for t in r["FAIL_TO_PASS"] + r["PASS_TO_PASS"])
            assert all(t in r["problem_statement"] for t in r["FAIL_TO_PASS"])
            removed = [line[1:].strip() for line in r["patch"].splitlines()
                       if line.startswith("-") and not line.startswith("---")]
            assert removed and not any(line in r["problem_statement"] for line in removed), r["problem_statement"]
    functions_of = {s: {(r["mutation"]["path"], r["mutation"]["function"]) for r in tasks[s]} for s in tasks}
    assert not functions_of["train"] & functions_of["eval"]


def test_made_tasks_oracle_passes_and_null_fails(made):
    _, tasks = made
    try:
        pool = SandboxPool(SandboxConfig(workers=1, timeout_s=30.0))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    with pool:
        for record in (tasks["train"] + tasks["eval"])[:2]:
            task = load_task(record)
            assert task["hidden"] == {} and task["files"] != {}
            env = SweEnv(pool=pool)
            env.reset(record)
            null = env.step(format_call("submit", {}))
            assert null.outcome.cls is OutcomeClass.MODEL_FAIL and null.info["scores"]["fail_to_pass"] == 0.0
            env = SweEnv(pool=pool)
            env.reset(record)
            for turn in swe_policies(task)["oracle"]:
                result = env.step(turn)
            assert result.outcome.cls is OutcomeClass.PASS, result.outcome


@pytest.mark.slow
def test_env_audit_of_made_tasks(made, tmp_path):
    """`posttrain env-audit` on tasks `make-env-data swe` made: oracle 100%, null and every forgery 0%."""
    out, tasks = made
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (tasks["train"] + tasks["eval"])[:2]))
    assert main(["env-audit", str(path), "--out", str(tmp_path / "audit"), "--workers", "1", "--timeout", "30"]) == 0
    rates = json.loads((tmp_path / "audit" / "summary.json").read_text())["pass_rate"]
    assert rates.pop("oracle") == 1.0 and set(IN_PROCESS) | {"null", "patch_pytest"} <= set(rates)
    assert all(r == 0.0 for r in rates.values()), rates


def test_make_env_data_swe_needs_a_project(tmp_path, capsys):
    assert main(["make-env-data", "swe", str(tmp_path / "o")]) == 2
    assert "--from SDIST|FOLDER is required" in capsys.readouterr().err
    assert main(["make-env-data", "swe", str(tmp_path / "o"), "--from", str(tmp_path / "missing.tar.gz")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_a_plugin_option_in_addopts_is_named(tmp_path, capsys):
    folder = tmp_path / "covered"
    for path, text in {**PROJECT, "setup.cfg": "[tool:pytest]\naddopts = --cov=shapes -q\n"}.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    code = main(["make-env-data", "swe", str(tmp_path / "o"), "--from", str(folder), "--timeout", "30"])
    err = capsys.readouterr().err
    if code == 2 and "cannot" in err and "sandbox" in err and "--cov" not in err:
        pytest.skip("no sandbox here")
    assert code == 2 and "setup.cfg passes --cov (from pytest-cov" in err, err


def test_a_split_within_one_project_says_so_and_an_empty_one_warns():
    assert len(split_notes("p", {"train": 3, "eval": 2})) == 1
    assert "within one project" in split_notes("p", {"train": 3, "eval": 2})[0]
    notes = split_notes("p", {"train": 15, "eval": 0})
    assert len(notes) == 2 and notes[1].startswith("warning: p: no eval task")


def test_projects_split_by_a_stable_hash_with_one_at_least_on_each_side():
    # hashes under the held-out fraction: eta, theta; over it: alpha (0.70), beta (0.90), gamma (0.44)
    assert project_splits(["alpha", "eta", "gamma"]) == {"alpha": "train", "eta": "eval", "gamma": "train"}
    assert project_splits(["beta", "alpha"]) == {"alpha": "eval", "beta": "train"}  # the nearest moves
    assert project_splits(["eta", "theta"]) == {"eta": "eval", "theta": "train"}
    assert project_splits(["alpha"]) == {"alpha": "train"}
    names = [f"project{i}" for i in range(12)]
    assert project_splits(names) == project_splits(names[::-1])


def small_project(root, name: str, module: str):
    """A one-module project whose two functions each have a test (a mutant of one is caught by its
    test while the other's still passes)."""
    files = {f"{module}/__init__.py": "",
             f"{module}/ops.py": "def double(x):\n    return x * 2\n\n\ndef inc(x):\n    return x + 1\n",
             "tests/test_ops.py": (f"from {module}.ops import double, inc\n\n\n"
                                   "def test_double():\n    assert double(3) == 6\n\n\n"
                                   "def test_inc():\n    assert inc(3) == 4\n")}
    for path, text in files.items():
        (root / name / path).parent.mkdir(parents=True, exist_ok=True)
        (root / name / path).write_text(text)
    return str(root / name)


def test_tasks_from_two_projects_hold_out_a_whole_project(tmp_path, capsys):
    out = tmp_path / "data"
    code = main(["make-env-data", "swe", str(out), "--from", small_project(tmp_path, "alpha-1.0", "alpha"),
                 "--from", small_project(tmp_path, "beta-1.0", "beta"), "--max-tasks", "2", "--per-function", "1",
                 "--timeout", "30"])
    if code == 2:
        pytest.skip("no sandbox here")
    logged = capsys.readouterr().out
    tasks = {split: [json.loads(line) for line in (out / f"tasks_{split}.jsonl").read_text().splitlines()]
             for split in ("train", "eval")}
    assert {r["repo"] for r in tasks["train"]} == {"alpha-1.0"}  # every task of one project on each side
    assert {r["repo"] for r in tasks["eval"]} == {"beta-1.0"}
    assert all(r["split_by"] == "project" for r in tasks["train"] + tasks["eval"])
    assert "split by project" in logged and "within one project" not in logged
    summary = json.loads(logged.strip().splitlines()[-1])
    assert summary["split_by"] == "project" and [p["project"] for p in summary["projects"]] == ["alpha-1.0", "beta-1.0"]
    assert (summary["train"], summary["eval"]) == (len(tasks["train"]), len(tasks["eval"])) == (2, 2)


def test_the_same_project_twice_is_refused(tmp_path, capsys):
    folder = small_project(tmp_path, "alpha-1.0", "alpha")
    code = main(["make-env-data", "swe", str(tmp_path / "o"), "--from", folder, "--from", folder, "--max-tasks", "1",
                 "--timeout", "30"])
    err = capsys.readouterr().err
    if code == 2 and "cannot" in err and "sandbox" in err:
        pytest.skip("no sandbox here")
    assert code == 2 and "a second project named 'alpha-1.0'" in err, err


def test_with_one_project_that_gave_tasks_the_split_is_by_file_and_says_so():
    rows = [{"repo": "alpha", "mutation": {"path": f"alpha/m{i}.py"}} for i in range(6)]
    logged = []
    records = _split([({"project": "alpha"}, rows), ({"project": "beta"}, [])], logged.append)
    assert all(r["split_by"] == "file" for r in records["train"] + records["eval"])
    assert all(split_of("alpha", r["mutation"]["path"]) == s for s in records for r in records[s])
    assert any("within one project" in line for line in logged)
