"""`posttrain sandbox check --farm N`: the same lines as in-process, on sandbox actors; bad farm options exit 2."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main

TESTS = "def check(candidate):\n    assert candidate(3) == 9\n"
RECORDS = [
    {"id": "sq", "program": "def f(x):\n    return x * x\n", "tests": TESTS, "entry_point": "f"},
    {"id": "wrong", "program": "def f(x):\n    return x\n", "tests": TESTS, "entry_point": "f"},
    {"id": "loop", "program": "def f(x):\n    while True:\n        pass\n", "tests": TESTS, "entry_point": "f"},
    {"id": "io", "program": "print(int(input()) + 1)", "io": [{"stdin": "1\n", "stdout": "2\n"}]},
] * 3


def judged(capsys) -> list[tuple]:
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [(r["id"], r["outcome"], r["reason"]) for r in rows]


def test_check_on_the_farm_prints_what_the_local_pool_prints(ray_cluster, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    if main(["sandbox", "check", str(path), "--workers", "2", "--timeout", "0.5"]) == 2:
        pytest.skip("no sandbox on this machine")
    local = judged(capsys)
    assert main(["sandbox", "check", str(path), "--farm", "2", "--cpus", "1", "--timeout", "0.5"]) == 0
    assert judged(capsys) == local
    assert local[:4] == [("sq", "PASS", ""), ("wrong", "MODEL_FAIL", "wrong_answer"),
                         ("loop", "MODEL_FAIL", "timeout"), ("io", "PASS", "")]


@pytest.mark.parametrize("extra, message", [
    (["--farm", "2", "--workers", "3"], "with --farm use --cpus"),
    (["--farm", "-1"], "--farm must be >= 0"),
    (["--farm", "1", "--cpus", "0"], "--cpus >= 1"),
])
def test_bad_farm_options_are_one_line_exit_2(tmp_path, capsys, extra, message):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n")
    assert main(["sandbox", "check", str(path), *extra]) == 2
    assert message in capsys.readouterr().err
