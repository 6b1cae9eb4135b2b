"""`posttrain study compare`: the smoke profile end to end, and the table it prints."""

import json

import pytest

from posttrain.cli import main
from posttrain.study.compare import ARMS, PROFILES, format_table


def test_format_table_states_both_questions_and_the_numbers():
    rows = [{"run": "distill", "trajectory": "student", "signal": "teacher per-token reverse KL", "tokens": 12345,
             "seconds": 61.2, "greedy_pass@1": 0.5, "sampled_pass@1": 0.25, "pass@8": 0.875, "trace_nll": 0.4321},
            {"run": "teacher", "trajectory": "-", "signal": "-", "tokens": None, "seconds": None,
             "greedy_pass@1": 1.0, "sampled_pass@1": 0.9, "pass@8": 1.0, "trace_nll": 0.1}]
    lines = format_table({"rows": rows}).splitlines()
    assert lines[0] == ("| run | trajectory from | signal | tokens | train s | greedy pass@1 | sampled pass@1 "
                        "| pass@8 | trace NLL |")
    assert lines[2] == "| distill | student | teacher per-token reverse KL | 12,345 | 61 | 0.500 | 0.250 | 0.875 | 0.432 |"
    assert lines[3] == "| teacher | - | - | - | - | 1.000 | 0.900 | 1.000 | 0.100 |"


def test_unknown_profile_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["study", "compare", "--profile", "huge"])
    assert e.value.code == 2 and "huge" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_profile_end_to_end(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "compare", "--profile", "smoke", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["run"]: r for r in summary["rows"]}
    assert list(rows) == ["start", *ARMS, "teacher"]
    budget = PROFILES["smoke"]["budget"]
    for arm in ARMS:
        # Each arm stops at the budget; it may overshoot by at most its last step.
        assert budget <= rows[arm]["tokens"] < 2 * budget
        for key in ("greedy_pass@1", "sampled_pass@1", "pass@2"):
            assert 0.0 <= rows[arm][key] <= 1.0
        assert 0.0 < rows[arm]["trace_nll"] < 10.0
        curve = [json.loads(line) for line in (out / "curves" / arm / "metrics.jsonl").read_text().splitlines()]
        assert curve[0]["step"] == 0 and curve[-1]["step"] == rows[arm]["tokens"] and len(curve) >= 3
        assert (out / "evals" / arm / "eval.json").is_file()
    assert "| distill | student | teacher per-token reverse KL |" in printed
    assert (out / "study.md").read_text().startswith("| run |")
    html = (out / "report.html").read_text()
    assert "Held-out accuracy" in html and "curves/distill" in html


def test_a_study_directory_refuses_another_teacher(tmp_path):
    from posttrain.errors import UserError
    from posttrain.study.compare import check_same_teacher

    record = tmp_path / "teacher_used.json"
    check_same_teacher(record, "t/step-200")
    check_same_teacher(record, "t/step-200")  # the same teacher: its finished arms are reused
    with pytest.raises(UserError, match="use a new --out"):
        check_same_teacher(record, "t/step-600")


def test_unknown_arm_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["study", "compare", "--arms", "grpo,ppo"])
    assert e.value.code == 2 and "ppo" in capsys.readouterr().err


def test_grpo_arm_alone_builds_no_teacher(tmp_path):
    from posttrain.study.compare import run_compare

    out = tmp_path / "study"
    summary = run_compare(out, "smoke", progress=False, printer=lambda *_: None, arms=("grpo",))
    assert [r["run"] for r in summary["rows"]] == ["start", "grpo"]
    assert not (out / "teacher").exists() and not (out / "arms" / "sft").exists()
    assert summary["rows"][1]["tokens"] >= PROFILES["smoke"]["budget"]
    assert [json.loads(line)["step"] for line in (out / "curves" / "grpo" / "metrics.jsonl").read_text().splitlines()][0] == 0
