"""The lanes' selection (tests/conftest.py): a `release` test runs only when a marker expression
asks for `release`, even where its file's module mark puts it in a CI lane too."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILE = "tests/test_demo_code.py"  # a slow file (module mark) holding a release test


def _collected(markexpr: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-n", "0", "-p", "no:cacheprovider",
                        "-m", markexpr, FILE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_a_release_test_stays_out_of_the_slow_lane_and_runs_when_asked():
    slow, release = _collected("slow"), _collected("release")
    assert slow and not any("full_code_demo" in t for t in slow), slow
    assert any("full_code_demo" in t for t in release), release


CASES = '''
import pytest

def test_passes(tmp_path):
    (tmp_path / "x").write_text("1")

def test_fails(tmp_path):
    (tmp_path / "x").write_text("1")
    assert False

@pytest.mark.vllm
def test_against_vllm_passes(tmp_path):
    (tmp_path / "x").write_text("1")
'''


def test_a_passing_tests_folder_goes_a_failing_ones_and_vllm_ones_stay(tmp_path):
    """tests/conftest.py's tmp_path: removed when its test passes, kept when it fails, and kept for the
    session in a test marked vllm (the shared server may read an adapter from it later)."""
    case = tmp_path / "case"
    case.mkdir()
    (case / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (case / "test_cases.py").write_text(CASES)
    base = tmp_path / "base"
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(case),
                        "-n", "0", "-m", "", "-p", "no:cacheprovider", "--basetemp", str(base), str(case)],
                       capture_output=True, text=True, timeout=120)
    assert "1 failed, 2 passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    kept = sorted(p.name for p in base.iterdir() if not p.is_symlink() and (p / "x").exists())
    assert kept == ["test_against_vllm_passes0", "test_fails0"], sorted(p.name for p in base.iterdir())
