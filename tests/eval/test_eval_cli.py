"""`posttrain eval`'s printed lines: an eval whose samples were mostly not graded says so."""

import argparse

from posttrain.eval import eval_cli
from posttrain.eval.results import SampleRecord, summarize


def _print_for(monkeypatch, capsys, tmp_path, outcomes):
    samples = [SampleRecord(problem_id=str(i // 2), sample_index=i % 2, completion="", outcome=o, reason="",
                            reward=0.0, completion_tokens=1, finish_reason="eos") for i, o in enumerate(outcomes)]
    result = summarize(samples, benchmark="judged", profile="sampled", model="m")
    monkeypatch.setattr(eval_cli, "run_eval", lambda cfg, show_progress: [result])
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    assert eval_cli.run(parser.parse_args([f"out_dir={tmp_path}"])) == 0
    return capsys.readouterr().out


def test_a_mostly_ungraded_eval_is_marked(monkeypatch, capsys, tmp_path):
    out = _print_for(monkeypatch, capsys, tmp_path, ["INFRA_FAIL", "INFRA_FAIL", "TASK_FAIL", "PASS"])
    assert "judged sampled: n=2 problems=2 pass@1=0.250" in out
    assert "MOSTLY UNGRADED: 3 of 4 samples were not graded (INFRA_FAIL 2, TASK_FAIL 1;" in out


def test_a_graded_eval_is_not(monkeypatch, capsys, tmp_path):
    out = _print_for(monkeypatch, capsys, tmp_path, ["INFRA_FAIL", "MODEL_FAIL", "MODEL_FAIL", "PASS"])
    assert "UNGRADED" not in out
