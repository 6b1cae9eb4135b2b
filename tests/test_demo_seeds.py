"""`posttrain demo --task code --seeds ...`: the seeds' combined report from hand-written seed folders,
finished seeds skipped, the start built lazily and once, changed settings and bad --seeds refused."""

import argparse
import json

import pytest

from posttrain.demo.seeds import Demo, parse_seeds, run_seeds, write_combined
from posttrain.errors import UserError
from posttrain.eval.results import SampleRecord, summarize, write_eval_json

PROBLEMS = ("p1", "p2", "p3", "p4")


def _eval(path, bench, profile, label, model, passes: dict[str, int], n: int = 1):
    """An eval.json where problem P passed passes.get(P, 0) of its n samples."""
    samples = [SampleRecord(problem_id=p, sample_index=i, completion="",
                            outcome="PASS" if i < passes.get(p, 0) else "MODEL_FAIL", reason="wrong_answer")
               for p in PROBLEMS for i in range(n)]
    write_eval_json(path / "evals" / label / "eval.json",
                    [summarize(samples, benchmark=bench, profile=profile, model=model, ks=[1], label=label)])


TRACKED = "eval/train_fixed/t1/pass@1"


def _metrics(path, rewards, passes, tracked: dict[int, float] | None = None):
    """One row a step; ``tracked``: the run's own evaluation's pass@1 by step (step 0: before RL)."""
    rows = [{"step": i + 1, "reward/mean": r, "outcomes/PASS_frac": p, "groups/zero_variance_frac": 0.5 - i / 100,
             "entropy": 1 - i / 10} for i, (r, p) in enumerate(zip(rewards, passes))]
    for row in rows[:-1:7]:  # the KL to the start, measured every 7 steps: at steps 1 and 8
        row["kl/ref"] = 0.001 * row["step"]
    rows = [{"step": 0}] + rows
    for step, value in (tracked or {}).items():
        rows[step][TRACKED] = value
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _fake_seed(out, seed, after_direct, before_reasoning, seconds, tracked=None):
    """seed-S with a greedy ``direct`` arm (start passes p1) and a sampled ``reasoning`` arm."""
    d = out / f"seed-{seed}"
    direct, reasoning = d / "direct", d / "reasoning"
    _eval(direct, "humaneval", "greedy", "before", "starts/direct", {"p1": 1})
    _eval(direct, "humaneval", "greedy", "after", "direct", after_direct)
    _eval(reasoning, "humaneval", "t0.6", "before", "starts/reasoning", before_reasoning, n=2)
    _eval(reasoning, "humaneval", "t0.6", "after", "reasoning", {"p1": 2, "p2": 2}, n=2)
    rewards = [0.1 * (i + 1) for i in range(9)]  # 0.1 ... 0.9
    _metrics(direct, rewards, rewards, tracked)
    _metrics(reasoning, [r + 0.05 for r in rewards], rewards)  # a format bonus on top of the pass fraction
    (d / "summary.json").write_text(json.dumps({"seconds": seconds, "stages": {
        "rl_direct": {"wall_s": 120.0, "cpu_s": 1}, "eval_direct": {"wall_s": 60.0, "cpu_s": 1}}}))


def test_the_combined_report_holds_each_seeds_change_their_mean_and_reward_curves(tmp_path, monkeypatch):
    from posttrain.eval import report

    pages = []  # the page's plots are report.py's; which runs it is given is this module's
    monkeypatch.setattr(report, "render_html", lambda runs: pages.append([r.name for r in runs]) or "page")
    out = tmp_path / "out"
    # direct, greedy: the start passes p1 (25%) in both seeds; seed 0 after passes p1, p2 (50%, +25),
    # seed 1 after passes p2 only (25%, +0): mean change +12.5
    _fake_seed(out, 0, {"p1": 1, "p2": 1}, {"p1": 1}, 600, tracked={0: 0.20, 4: 0.25, 9: 0.30})
    _fake_seed(out, 1, {"p2": 1}, {"p1": 2}, 900, tracked={0: 0.20, 4: 0.35, 9: 0.40})
    markdown = write_combined(out, [0, 1], ("direct", "reasoning"), {"prepare": {"wall_s": 30.0, "cpu_s": 1}})
    summary = json.loads((out / "summary.json").read_text())
    assert markdown == (out / "report.md").read_text() and (out / "report.html").read_text() == "page"
    assert pages == [["seed-0/direct", "seed-0/reasoning", "seed-1/direct", "seed-1/reasoning"]]

    direct = summary["held_out"]["direct · greedy"]
    assert direct["same_start"] and direct["start_models"] == ["starts/direct"]
    row = direct["rows"]["HumanEval"]
    assert [row["seeds"][s]["after"] for s in ("0", "1")] == [50.0, 25.0]
    assert [row["seeds"][s]["change"] for s in ("0", "1")] == [25.0, 0.0]
    assert row["mean_change"] == pytest.approx(12.5)
    assert "| benchmark | start | seed 0: RL | seed 0: Δ pp [95% CI] | seed 1: RL |" in markdown
    assert "| HumanEval | 25.0 | 50.0 | +25.0 [" in markdown and markdown.count("| +12.5 [") == 1
    # pooled by problem: p1 (0 - 1) / 2 = -0.5, p2 (1 + 1) / 2 = +1, p3 and p4 0: mean +12.5, and a
    # resample's mean lies between -0.5 and +1 (-50 and +100 pp)
    pool = row["pooled"]
    assert (pool["change"], pool["problems"]) == (12.5, 4) and -50.0 <= pool["low"] < 12.5 < pool["high"] <= 100.0
    assert "Every seed starts from the same checkpoint (`starts/direct`) and its evaluation gave the same" in markdown

    # reasoning, sampled: the same start gave 1 of 8 samples (12.5%) under seed 0 and 2 of 8 (25%)
    # under seed 1: a start column per seed. After: 4 of 8 (50%): +37.5 and +25, mean +31.25
    reasoning = summary["held_out"]["reasoning · t0.6"]
    assert not reasoning["same_start"]
    assert [reasoning["rows"]["HumanEval"]["seeds"][s]["before"] for s in ("0", "1")] == [12.5, 25.0]
    assert reasoning["rows"]["HumanEval"]["mean_change"] == pytest.approx(31.25)
    assert "| benchmark | seed 0: start | seed 0: RL | seed 0: Δ pp [95% CI] | seed 1: start |" in markdown
    assert "but its evaluation differs between seeds" in markdown

    # training reward 0.1 ... 0.9: first 4 steps 0.25, last 4 0.75; zero-variance 0.42 and entropy 0.2
    # at step 9; the KL last measured at step 8
    curve = summary["reward"]["direct"]["0"]
    assert curve["reward_first"] == pytest.approx(0.25) and curve["reward_last"] == pytest.approx(0.75)
    assert curve["zero_variance_last"] == pytest.approx(0.42) and curve["kl_last"] == pytest.approx(0.008)
    assert ("| 0 | 0.10 | 0.20 | 0.30 | 0.40 | 0.50 | 0.60 | 0.70 | 0.80 | 0.90 | 0.25 | 0.75 | 0.42 | 0.20 "
            "| 0.0080 (8) |") in markdown
    # the reasoning arm's reward is not its pass fraction: both, the pass fraction in brackets
    assert summary["reward"]["reasoning"]["1"]["reward_last"] == pytest.approx(0.80)
    assert "| 1 | 0.15 (0.10) | 0.25 (0.20) |" in markdown and "0.30 (0.25) | 0.80 (0.75) |" in markdown
    # the direct arm's tracked pass@1 by step, each seed's and their mean; the reasoning arm tracked none
    assert summary["tracked"]["direct"][TRACKED]["mean"] == {"0": pytest.approx(0.2), "4": pytest.approx(0.3),
                                                            "9": pytest.approx(0.35)}
    assert "reasoning" not in summary["tracked"] and f"### direct: `{TRACKED}`" in markdown
    assert "| seed | step 0 | step 4 | step 9 | last − first |" in markdown
    assert "| 1 | 20.0 | 35.0 | 40.0 | +20.0 |" in markdown and "| mean | 20.0 | 30.0 | 35.0 | +15.0 |" in markdown
    # wall time from each seed's summary.json, and the shared start's
    assert summary["seconds"] == {"0": 600, "1": 900}
    assert "| 0 | 10.0 | 2.0 | 1.0 |" in markdown and "| 1 | 15.0 | 2.0 | 1.0 |" in markdown
    assert "prepare 0.5" in markdown


class FakeDemo:
    """Counts what the driver asks for; a seed's 'RL' writes the evaluations a real one would."""

    def __init__(self):
        self.starts, self.seeds = [], []

    def build_starts(self, out, p, args, stages):
        self.starts.append(args.seed)
        stages["prepare"] = {"wall_s": 6.0, "cpu_s": 6.0}
        return {"start": "S"}

    def run_seed(self, out, p, built, args, stages):
        assert built == {"start": "S"}
        self.seeds.append(args.seed)
        _eval(out / "direct", "humaneval", "greedy", "before", "S", {"p1": 1})
        _eval(out / "direct", "humaneval", "greedy", "after", "direct", {"p1": 1, "p2": args.seed % 2})
        _metrics(out / "direct", [0.5], [0.5])

    def demo(self):
        return Demo(arms=("direct",), build_starts=self.build_starts, run_seed=self.run_seed)


def _args(out, seeds):
    return argparse.Namespace(out=str(out), seeds=seeds, seed=0, model=None)


def test_finished_seeds_are_not_run_again_and_the_start_is_built_only_when_a_seed_needs_it(tmp_path, capsys,
                                                                                             monkeypatch):
    from posttrain.eval import report

    monkeypatch.setattr(report, "render_html", lambda runs: "")  # the page's plots are not what is tested
    out, fake, p = tmp_path / "out", FakeDemo(), {"steps": 2, "progress": True}
    run_seeds(_args(out, "3,2"), p, fake.demo())
    assert fake.starts == [3] and fake.seeds == [3, 2]  # the start once, with the first seed
    assert all((out / f"seed-{s}" / "summary.json").is_file() for s in (2, 3))
    # the fake's RL passes p2 on odd seeds: seed 3 +25, seed 2 +0
    assert json.loads((out / "summary.json").read_text())["held_out"]["direct"]["rows"]["HumanEval"]["mean_change"] \
        == pytest.approx(12.5)
    capsys.readouterr()
    run_seeds(_args(out, "3,2"), {**p, "progress": False}, fake.demo())  # finished: only the report again
    assert fake.starts == [3] and fake.seeds == [3, 2]
    assert "seed 2: finished" in capsys.readouterr().out
    (out / "report.md").unlink()
    run_seeds(_args(out, "2,3,4"), p, fake.demo())  # one new seed: the start again, with seed 3, then seed 4
    assert fake.starts == [3, 3] and fake.seeds == [3, 2, 4] and (out / "report.md").is_file()
    assert json.loads((out / "seeds.json").read_text())["start_stages"] == {"prepare": {"wall_s": 6.0, "cpu_s": 6.0}}
    # seeds run with other settings would make one table of two experiments
    with pytest.raises(UserError, match=r"seeds.json: the seeds in .* ran with other settings \(differing: steps\)"):
        run_seeds(_args(out, "5"), {**p, "steps": 3}, fake.demo())
    assert fake.seeds == [3, 2, 4]


@pytest.mark.parametrize("text, message", [("", "integers separated by commas"), ("0,,1", "integers separated"),
                                           ("0,x", "'x' is not an integer"), ("1.5", "'1.5' is not an integer"),
                                           ("2,0,2", "seed 2 is given twice")])
def test_bad_seeds_are_refused(text, message):
    with pytest.raises(UserError, match=message):
        parse_seeds(text)


def test_bad_seeds_exit_2_with_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from posttrain.cli import main
    from posttrain.demo import code

    monkeypatch.setattr(code, "prepare", lambda *a: pytest.fail("the demo started"))

    assert parse_seeds(" 0, 1,2") == [0, 1, 2]
    out = tmp_path / "out"
    assert main(["demo", "--task", "code", "--seeds", "1,1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "seed 1 is given twice" in err and not out.exists()
    assert main(["demo", "--seeds", "0,1", "--out", str(out)]) == 2  # the arithmetic demo has one seed
    assert "only --task code" in capsys.readouterr().err and not out.exists()


def test_a_long_runs_reward_is_tabled_as_block_means(tmp_path):
    """50 steps fill 17 columns of 3-step means (the last of 2 steps), not 50 columns; the first and
    last 4 steps' means stay per step."""
    from posttrain.demo.seeds import reward_section

    run = tmp_path / "seed-0" / "direct"
    run.mkdir(parents=True)
    rewards = [i / 100 for i in range(1, 51)]  # 0.01 ... 0.50
    _metrics(run, rewards, rewards)
    data, lines = reward_section(tmp_path, [0], ("direct",))
    head = next(line for line in lines if line.startswith("| seed |"))
    assert head.startswith("| seed | 1-3 | 4-6 |") and "| 49-50 | first 4 | last 4 |" in head
    row = next(line for line in lines if line.startswith("| 0 |"))
    # (0.01 + 0.02 + 0.03) / 3 = 0.02, then 0.05; the last block (0.49 + 0.50) / 2 = 0.495 -> 0.49 or 0.50
    assert row.startswith("| 0 | 0.02 | 0.05 | 0.08 |") and row.count("|") == 17 + 5 + 2
    assert data["direct"]["0"]["reward_last"] == pytest.approx(0.485)
    assert any("averaged over 3 steps a column" in line for line in lines)
