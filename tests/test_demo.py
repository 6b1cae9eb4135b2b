"""`posttrain demo --profile quick`: the whole pipeline end to end, and its evals reproducible."""

import json
import subprocess
import sys


def _posttrain(*args):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *map(str, args)], capture_output=True, text=True)


def test_quick_demo_runs_end_to_end_and_its_eval_reproduces(tmp_path):
    out = tmp_path / "demo"
    r = _posttrain("demo", "--profile", "quick", "--out", out, "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    metrics = [row["metric"] for row in summary["table"]]
    assert metrics == ["greedy pass@1", "sampled pass@1", "sampled pass@2"]
    assert all(0.0 <= row[k] <= 1.0 for row in summary["table"] for k in ("before", "after"))
    assert "after GRPO" in r.stdout and "bootstrap" in r.stdout
    # every stage is timed, and the stages account for the run's time
    stages = summary["stages"]
    assert list(stages) == ["prepare", "sft", "eval_before", "rl", "eval_after"]
    assert all(s["wall_s"] >= 0 and s["cpu_s"] >= 0 for s in stages.values())
    assert stages["sft"]["wall_s"] > 0 and stages["rl"]["wall_s"] > 0
    assert summary["seconds"] - 1 <= sum(s["wall_s"] for s in stages.values()) <= summary["seconds"] + 0.5
    assert "[demo] rl:" in r.stdout
    # a smoke run says it is one, before it starts and under its table
    assert r.stdout.count("not expected to learn") == 2 and r.stdout.index("not expected to learn") < r.stdout.index("[demo] sft:")
    for stage in ("sft", "rl"):
        assert (out / stage / "config.yaml").is_file() and (out / stage / "metrics.jsonl").is_file()
    html = (out / "report.html").read_text()
    assert "pass@k" in html and "<img" in html

    # `posttrain eval` with the config the demo saved gives the demo's numbers
    again = tmp_path / "again"
    r = _posttrain("eval", out / "evals" / "before" / "config.yaml", f"out_dir={again}")
    assert r.returncode == 0, r.stderr[-2000:]
    mine = json.loads((again / "eval.json").read_text())
    theirs = json.loads((out / "evals" / "before" / "eval.json").read_text())
    # the printed intervals are the eval's bootstrap intervals, around the means they go with
    sampled = next(x for x in theirs["results"] if x["profile"] == "sampled")["pass_at_k"][0]
    row = summary["table"][1]
    assert row["before_ci"] == [sampled["low"], sampled["high"]] and sampled["low"] <= row["before"] <= sampled["high"]
    pick = lambda d: [(x["profile"], [p["mean"] for p in x["pass_at_k"]]) for x in d["results"]]  # noqa: E731
    assert pick(mine) == pick(theirs)
