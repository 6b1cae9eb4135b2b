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
