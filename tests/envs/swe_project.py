"""A SWE-bench-format task built from a small git repository made on the spot (no download).

The project ``calc`` (a src layout, pytest configured in pyproject.toml, a conftest that imports
the package and has a fixture) has a bug in ``add``; the gold patch fixes it, the test patch adds the test that
catches it (FAIL_TO_PASS) next to the suite that already passes (PASS_TO_PASS). `UNITTEST` is the
same project written the unittest way (a flat layout, no pytest configuration, ``TestCase``
classes, the package imported by ``tests/__init__.py`` before any test module); `DOCTEST` the
pytest-style one with ``--doctest-modules`` and a doctest among the FAIL_TO_PASS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

FILES = {
    "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1"\n\n[tool.pytest.ini_options]\n'
                      'testpaths = ["tests"]\naddopts = "-ra"\n',
    "README.md": "# calc\n\nSmall arithmetic helpers.\n",
    "src/calc/__init__.py": "from calc.ops import add, mul, total\n",
    "src/calc/ops.py": ("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
                        "def total(xs):\n    out = 0\n    for x in xs:\n        out = add(out, x)\n    return out\n"),
    "tests/conftest.py": "import calc  # noqa: F401  (loaded with the fixtures)\nimport pytest\n\n\n"
                         "@pytest.fixture\ndef pair():\n    return (2, 3)\n",
    "tests/test_mul.py": ("from calc import mul\n\n\ndef test_mul(pair):\n    assert mul(*pair) == 6\n\n\n"
                          "def test_mul_zero():\n    assert mul(0, 5) == 0\n"),
}
FIX = {"src/calc/ops.py": FILES["src/calc/ops.py"].replace("return a - b", "return a + b")}
HIDDEN = {"tests/hidden/test_add.py": ("from calc import add, total\n\n\ndef test_add(pair):\n    assert add(*pair) == 5\n\n\n"
                                "def test_total():\n    assert total([1, 2, 3]) == 6\n")}
F2P = ["tests/hidden/test_add.py::test_add", "tests/hidden/test_add.py::test_total"]
P2P = ["tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_zero"]

_OPS = FILES["src/calc/ops.py"]
UNITTEST = {
    "files": {"calc/__init__.py": "from calc.ops import add, mul, total\n", "calc/ops.py": _OPS,
              "tests/__init__.py": "import calc  # noqa: F401  (imported before any test module)\n",
              "tests/test_mul.py": ("import unittest\n\nfrom calc import mul\n\n\nclass TestMul(unittest.TestCase):\n"
                                    "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n"
                                    "    def test_mul_zero(self):\n        self.assertEqual(mul(0, 5), 0)\n")},
    "fix": {"calc/ops.py": _OPS.replace("return a - b", "return a + b")},
    "hidden": {"tests/hidden/__init__.py": "",
               "tests/hidden/test_add.py": ("import unittest\n\nfrom calc import add, total\n\n\n"
                                            "class TestAdd(unittest.TestCase):\n"
                                            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
                                            "    def test_total(self):\n        self.assertEqual(total([1, 2, 3]), 6)\n")},
    "f2p": ["tests/hidden/test_add.py::TestAdd::test_add", "tests/hidden/test_add.py::TestAdd::test_total"],
    "p2p": ["tests/test_mul.py::TestMul::test_mul", "tests/test_mul.py::TestMul::test_mul_zero"],
}

# The pytest-style project with its doctests collected too (``--doctest-modules``): one of them
# is a FAIL_TO_PASS test.
_DOC_OPS = _OPS.replace("def add(a, b):\n", 'def add(a, b):\n    """\n    >>> add(2, 3)\n    5\n    """\n')
DOCTEST = {
    "files": {**FILES, "src/calc/ops.py": _DOC_OPS,
              "pyproject.toml": FILES["pyproject.toml"].replace('addopts = "-ra"', 'addopts = "-ra --doctest-modules"')},
    "fix": {"src/calc/ops.py": _DOC_OPS.replace("return a - b", "return a + b")},
    "f2p": [*F2P, "src/calc/ops.py::calc.ops.add"],
}


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def _diff(repo: Path, changes: dict[str, str]) -> str:
    """The git diff of ``changes`` against HEAD (the working tree is put back afterwards)."""
    for path, text in changes.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached", "HEAD")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    return diff


def make_record(root: Path, files: dict | None = None, fix: dict | None = None, hidden: dict | None = None,
                f2p: list | None = None, p2p: list | None = None) -> dict:
    """A git repository under ``root`` and its SWE-bench-format record (``repo_path`` set)."""
    repo = root / "calc-repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    for path, text in (files or FILES).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "LATER.md").write_text("a later commit the task must not see\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "later")
    _git(repo, "checkout", "-q", base)
    return {"instance_id": "calc__calc-1", "repo": "calc/calc", "base_commit": base,
            "patch": _diff(repo, fix or FIX), "test_patch": _diff(repo, hidden or HIDDEN),
            "FAIL_TO_PASS": list(f2p or F2P), "PASS_TO_PASS": list(P2P if p2p is None else p2p),
            "problem_statement": "add(2, 3) returns -1; it should return 5.", "repo_path": str(repo)}
