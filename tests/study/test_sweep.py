"""`posttrain sweep`: grid expansion, resume, the report's numbers, bad input, and one real run."""

import json
import math

import pytest

from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.study.sweep import (DONE, Point, expand, format_table, interval, parse_grid, run_dir, run_metrics,
                                   run_sweep, summarise)


def test_grid_is_the_product_of_its_values_times_the_seeds():
    grid = parse_grid(["optim.lr=1e-4,1e-3", "rollout.group_size=4,8,16"])
    points = expand(grid, seeds=2)
    assert len(points) == 2 * 3 * 2
    assert points[0] == Point((("optim.lr", "1e-4"), ("rollout.group_size", "4")), 0)
    assert points[1] == Point((("optim.lr", "1e-4"), ("rollout.group_size", "4")), 1)
    assert points[2].setting == (("optim.lr", "1e-4"), ("rollout.group_size", "8"))
    assert points[-1] == Point((("optim.lr", "1e-3"), ("rollout.group_size", "16")), 1)
    assert len({(p.dirname, p.seed) for p in points}) == 12
    assert points[-1].overrides() == ["optim.lr=1e-3", "rollout.group_size=16", "seed=1"]
    assert expand([], seeds=3) == [Point((), 0), Point((), 1), Point((), 2)]


@pytest.mark.parametrize("item", ["optim.lr", "optim.lr=", "=1,2", "seed=1,2"])
def test_malformed_grid_items_are_refused(item):
    with pytest.raises(UserError):
        parse_grid([item])


def fake_runner(calls, rewards=None):
    """Stands in for `posttrain rl`: records its argv and writes a metrics.jsonl with a held-out curve."""
    def run(argv, log_path):
        calls.append(argv)
        out = log_path.parent
        seed = int(next(a for a in argv if a.startswith("seed="))[5:])
        rows = [{"step": s, "reward/mean": 0.1 * s + seed, "eval/heldout/greedy/pass@1": 0.2 + 0.1 * s + seed}
                for s in range(4)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    return run


def test_a_finished_run_is_not_rerun_and_an_interrupted_one_is(tmp_path):
    calls = []
    grid = parse_grid(["optim.lr=1e-4,1e-3"])
    run_sweep("rl", None, [], grid, 2, tmp_path, runner=fake_runner(calls), progress=False)
    assert len(calls) == 4
    done = run_dir(tmp_path, Point((("optim.lr", "1e-3"),), 1)) / DONE
    mtime = done.stat().st_mtime_ns
    interrupted = run_dir(tmp_path, Point((("optim.lr", "1e-4"),), 0))
    (interrupted / DONE).unlink()  # as if that run had been killed before it finished
    calls.clear()
    run_sweep("rl", None, [], grid, 2, tmp_path, runner=fake_runner(calls), progress=False)
    assert len(calls) == 1 and f"out_dir={interrupted}" in calls[0]
    assert done.stat().st_mtime_ns == mtime


def test_a_failed_run_is_reported_and_left_unfinished(tmp_path):
    summary = run_sweep("rl", None, [], parse_grid(["optim.lr=1e-4"]), 1, tmp_path,
                        runner=lambda argv, log: 3, progress=False)
    assert len(summary["failed"]) == 1 and "exit 3" in summary["failed"][0]
    assert not (run_dir(tmp_path, Point((("optim.lr", "1e-4"),), 0)) / DONE).exists()


def test_a_finished_run_with_other_settings_is_refused(tmp_path):
    grid = parse_grid(["optim.lr=1e-4"])
    run_sweep("rl", None, ["num_steps=5"], grid, 1, tmp_path, runner=fake_runner([]), progress=False)
    with pytest.raises(UserError, match="other settings"):
        run_sweep("rl", None, ["num_steps=6"], grid, 1, tmp_path, runner=fake_runner([]), progress=False)


def write_metrics(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_table_numbers_come_from_the_metrics_files(tmp_path):
    a1, a2 = Point((("optim.lr", "1"),), 0), Point((("optim.lr", "1"),), 1)
    # seed 0: held-out 0.2 -> 0.6 -> 0.4 (final 0.4, best 0.6); seed 1: 0.9 at the start (not a
    # trained model, so not "best") -> 0.8 (final = best 0.8);
    # loss falls then rises (best is the lowest); rewards over 8 steps, quarters of 2 steps.
    write_metrics(run_dir(tmp_path, a1), [{"step": 0, "eval/acc": 0.2, "eval/loss": 2.0},
                                          {"step": 5, "eval/acc": 0.6, "eval/loss": 1.0},
                                          {"step": 9, "eval/acc": 0.4, "eval/loss": 1.5}])
    write_metrics(run_dir(tmp_path, a2), [{"step": 0, "eval/acc": 0.9, "eval/heldout/mean_length": 9.0},
                                          *({"step": s, "reward/mean": r} for s, r in
                                            enumerate([0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.6, 0.8], 1)),
                                          {"step": 9, "eval/acc": 0.8}])
    m = summarise([a1, a2], tmp_path)["settings"][0]["metrics"]
    assert m["eval/acc final"]["mean"] == pytest.approx(0.6) and m["eval/acc final"]["n"] == 2
    # two seeds: sd = 0.2828, t(0.975, 1) = 12.706 -> 12.706 * 0.2828 / sqrt(2) = 2.5412
    assert m["eval/acc final"]["half_width"] == pytest.approx(12.706 * 0.2 * math.sqrt(2) / math.sqrt(2))
    assert m["eval/acc best"]["mean"] == pytest.approx(0.7)
    assert m["eval/acc start"]["mean"] == pytest.approx(0.55)
    assert m["eval/loss best"] == {"mean": 1.0, "half_width": m["eval/loss best"]["half_width"], "n": 1}
    assert math.isnan(m["eval/loss best"]["half_width"]) and m["eval/loss final"]["mean"] == 1.5
    assert m["reward first quarter"]["mean"] == pytest.approx(0.2)
    assert m["reward last quarter"]["mean"] == pytest.approx(0.7)
    assert not any("mean_length" in k for k in m)


def test_reward_quarters_use_every_sampled_group_under_dynamic_sampling():
    # kept groups' reward/mean stays high while the first round's reward (all groups) falls
    rows = [{"step": s, "reward/mean": 0.5, "dynamic_sampling/sampled_reward_mean": r}
            for s, r in enumerate([0.4, 0.4, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1], 1)]
    m = run_metrics(rows)
    assert m["reward first quarter"] == pytest.approx(0.4) and m["reward last quarter"] == pytest.approx(0.1)


def test_interval_is_students_t_over_seeds():
    mean, half = interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert math.isnan(interval([0.5])[1])


def test_report_files_and_table_format(tmp_path):
    run_sweep("rl", None, [], parse_grid(["optim.lr=1e-4,1e-3"]), 2, tmp_path, runner=fake_runner([]),
              progress=False)
    summary = json.loads((tmp_path / "sweep.json").read_text())
    table = format_table(summary).splitlines()
    assert table[0] == ("| setting | seeds | eval/heldout/greedy/pass@1 start | eval/heldout/greedy/pass@1 final "
                        "| eval/heldout/greedy/pass@1 best | reward first quarter | reward last quarter |")
    # final held-out of seed s is 0.5 + s: mean 1.0 over seeds 0 and 1, half-width 12.706 * 0.7071 / 1.4142;
    # the start (step 0) is 0.2 + s
    assert table[2].startswith("| optim.lr=1e-4 | 2 | 0.700 ± 6.353 | 1.000 ± 6.353 | 1.000 ± 6.353 |")
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert "Student's t" in (tmp_path / "sweep.md").read_text()


def test_bad_grid_key_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "--grid", "optim.lr=1e-4,1e-3", "--grid", "optim.lrr=1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "optim.lrr" in err
    # the first value is fine, the second is not: still refused before anything runs
    assert main(["sweep", "--command", "sft", "--grid", "optim.lr=1e-3,-1", "--out", str(out)]) == 2
    assert "lr" in capsys.readouterr().err
    assert not out.exists()


def test_sft_sweep_end_to_end(tmp_path, nano_model_dir, arith_data_dir, capsys):
    """Two real `posttrain sft` runs in subprocesses, then a second call that runs nothing."""
    out = tmp_path / "sweep"
    args = ["sweep", "--command", "sft", f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'train.jsonl'}",
            f"data.eval_path={arith_data_dir / 'eval.jsonl'}", "data.tokens_per_batch=256", "num_steps=2",
            "eval_every=1", "--grid", "optim.lr=1e-3,1e-2", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "| optim.lr=1e-3 | 1 |" in table and "eval/loss final" in table
    assert len(list(out.glob("runs/*/seed-0/checkpoints/step-2"))) == 2
    mtimes = [p.stat().st_mtime_ns for p in out.glob("runs/*/seed-0/metrics.jsonl")]
    assert main(args) == 0
    assert [p.stat().st_mtime_ns for p in out.glob("runs/*/seed-0/metrics.jsonl")] == mtimes
