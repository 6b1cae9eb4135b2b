"""`posttrain sandbox check|audit|humaneval`: JSON lines out, exit codes, bad input named, audit flags."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.outcome import Outcome
from posttrain.sandbox.audit import audit, trivial_jobs
from posttrain.sandbox.records import to_job

TESTS = "def check(candidate):\n    assert candidate(3) == 9\n"
GOOD = {"id": "sq", "program": "def f(x):\n    return x * x\n", "tests": TESTS, "entry_point": "f"}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_check_prints_one_line_per_record(make_pool, tmp_path, capsys):
    make_pool().close()  # skips where the machine has no sandbox
    recs = [GOOD, dict(GOOD, id="wrong", program="def f(x):\n    return x\n"),
            {"id": "io", "program": "print(int(input()) + 1)", "io": [{"stdin": "1\n", "stdout": "2\n"}]}]
    assert main(["sandbox", "check", write(tmp_path / "r.jsonl", recs), "--workers", "1"]) == 0
    out = lines(capsys.readouterr().out)
    assert [(o["id"], o["outcome"], o["reason"]) for o in out] == [
        ("sq", "PASS", ""), ("wrong", "MODEL_FAIL", "wrong_answer"), ("io", "PASS", "")]
    assert all(isinstance(o["time_s"], float) and o["time_s"] > 0 for o in out)


@pytest.mark.parametrize("content, message", [
    ('{"id": 1, "program": "x", "tests": "y"}\n', ":1: missing key 'entry_point'"),
    ('{"program": "x", "io": [{"stdin": ""}]}\n', ":1: missing key 'id'"),
    ('{"id": 1, "program": "x", "io": [{"stdin": ""}]}\n', ":1: io[0]: missing key 'stdout'"),
    ('{"id": 1, "program": 5, "tests": "", "entry_point": "f"}\n', ":1: key 'program' must be a string"),
])
def test_bad_records_exit_2_naming_the_line(make_pool, tmp_path, capsys, content, message):
    make_pool().close()
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert main(["sandbox", "check", str(path)]) == 2
    assert capsys.readouterr().err == f"posttrain sandbox: error: {path}{message}\n"


@pytest.mark.parametrize("action", ["check", "audit"])
@pytest.mark.parametrize("content, message", [
    ('\n{not json\n', ":2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('{"id": 1}\n["id", 2]\n', ":2: expected a JSON object, got an array"),
    ("", ": no records (the file is empty)"),
    (None, ": no such file or folder"),  # FILE may be JSONL, Parquet or a datasets folder
])
def test_unreadable_jsonl_exits_2_as_file_line_what(tmp_path, capsys, action, content, message):
    """Read before any sandbox starts, so no pool (nor bubblewrap) is needed to refuse it."""
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    extra = ["--out", str(tmp_path / "audit")] if action == "audit" else []
    assert main(["sandbox", action, str(path), *extra]) == 2
    assert capsys.readouterr().err == f"posttrain sandbox: error: {path}{message}\n"
    assert not (tmp_path / "audit").exists()


def test_audit_flags_and_cleaned_dataset(make_pool, tmp_path, capsys):
    make_pool().close()
    recs = [dict(GOOD, reference=GOOD["program"]),
            dict(GOOD, id="broken_ref", reference="def f(x):\n    return x + 1\n"),
            dict(GOOD, id="hole", tests="def check(candidate):\n    candidate(3)\n"),
            {"id": "io_hole", "reference": "print('')", "io": [{"stdin": "", "stdout": ""}]}]
    out = tmp_path / "audit"
    assert main(["sandbox", "audit", write(tmp_path / "d.jsonl", recs), "--out", str(out), "--workers", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 4 and summary["clean"] == 1
    assert summary["flagged_ids"] == {"false_negative": ["broken_ref"], "false_positive": ["hole", "io_hole"]}
    clean = lines((out / "clean.jsonl").read_text())
    assert [r["id"] for r in clean] == ["sq"] and "_line" not in clean[0]
    rows = {r["id"]: r for r in lines((out / "audit.jsonl").read_text())}
    assert rows["sq"]["runs"] == {"reference_1": "PASS", "reference_2": "PASS", "pass": "MODEL_FAIL/wrong_answer",
                                  "return_none": "MODEL_FAIL/wrong_answer", "raise": "MODEL_FAIL/runtime_error"}
    assert json.loads(capsys.readouterr().out)["clean"] == 1


class ScriptedPool:
    """Answers in a fixed order, to check the audit's flag logic without running programs."""

    def __init__(self, outcomes):
        self.outcomes = outcomes

    def run(self, jobs):
        assert len(jobs) == len(self.outcomes)
        return self.outcomes


def test_disagreeing_reference_runs_are_flaky():
    p, w = Outcome.passed(), Outcome.model_fail("wrong_answer")
    rows = audit([dict(GOOD, reference=GOOD["program"])], ScriptedPool([p, w, w, w, w]), "x.jsonl")
    assert rows[0]["flags"] == ["false_negative", "flaky"]


def test_trivial_programs_keep_the_prelude():
    job = to_job(dict(GOOD, prelude="import math\n"), "x")
    trivial = trivial_jobs(job)
    assert sorted(trivial) == ["pass", "raise", "return_none"]
    assert all(t.program.startswith("import math\n") and t.tests == TESTS for t in trivial.values())


def test_humaneval_export_then_check(make_pool, tmp_path, capsys):
    make_pool().close()
    path = tmp_path / "he.jsonl"
    assert main(["sandbox", "humaneval", str(path), "--body", "empty"]) == 0
    assert main(["sandbox", "check", str(path)]) == 0
    out = lines(capsys.readouterr().out)
    assert len(out) == 164 and {o["outcome"] for o in out} == {"MODEL_FAIL"}
