"""report.html: fake run directories with synthetic metrics and evals, rendered and inspected."""

import argparse
import base64
import json
import math
import re
import shutil
import subprocess

import pytest

from posttrain.errors import UserError
from posttrain.eval import report_cli
from posttrain.eval.report import find_runs, render_html, series_for, PANELS, stage_times, write_report
from posttrain.eval.results import SampleRecord, summarize, write_eval_json

PNG_MAGIC = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()[:10]


def eval_result(passes, label, step):
    samples = [SampleRecord(problem_id=f"p{p}", sample_index=i, completion="x",
                            outcome="PASS" if i < c else "MODEL_FAIL", reason="" if i < c else "wrong_answer",
                            completion_tokens=5) for p, c in enumerate(passes) for i in range(8)]
    return summarize(samples, benchmark="arithmetic", profile="sampled", model="tiny", label=label, step=step)


def write_rl(run, steps=6, reward_slope=0.1):
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("algo: grpo\ngroup_size: 8\n")
    rows = []
    for s in range(steps):
        rows.append({"step": s, "time/step_s": 1.0, "time/rollout_s": 0.6, "time/reward_s": 0.1,
                     "time/update_s": 0.3, "reward/mean": reward_slope * s, "kl/ref": 0.01 * s,
                     "entropy": 2.0 - 0.1 * s, "response_length/mean": 20 + s,
                     "groups/zero_variance_frac": 0.5, "mismatch/kl": 1e-4, "mismatch/logprob_abs_diff_max": 0.02,
                     "outcomes/PASS_frac": 0.1 * s, "outcomes/MODEL_FAIL_frac": 1 - 0.1 * s,
                     "outcomes/MODEL_FAIL/wrong_answer_frac": 0.5, "eval/arithmetic/greedy/pass@1": 0.05 * s,
                     "note": "strings are ignored", "nan_value": math.nan})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "rew')
    write_eval_json(run / "evals" / "eval.json", [eval_result([0, 1, 2, 8], "before", 0),
                                                  eval_result([2, 4, 6, 8], "after", steps)])


def write_sft(run):
    run.mkdir(parents=True)
    rows = [{"step": s, "loss": 3.0 / (s + 1), "lr": 1e-3, "tokens_per_s": 900.0, "time/step_s": 0.2,
             **({"eval/loss": 3.5 / (s + 1)} if s % 2 == 0 else {})} for s in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def demo(tmp_path):
    root = tmp_path / "demo"
    write_sft(root / "sft")
    write_rl(root / "rl")
    return root


def images(page):
    return re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)


def test_nested_runs_found_and_torn_line_noted(demo):
    runs = find_runs([demo])
    assert [r.name for r in runs] == ["demo/rl", "demo/sft"]
    rl = runs[0]
    assert len(rl.metrics) == 6 and len(rl.evals) == 2
    assert any("torn last line" in n for n in rl.notes)
    assert stage_times(rl) == pytest.approx({"rollout": 0.6, "reward": 0.1, "update": 0.3})


def test_series_by_panel(demo):
    runs = find_runs([demo])
    outcome_panel = next(p for p in PANELS if p.title == "Outcome classes")
    plots = series_for(outcome_panel, runs)
    assert set(plots) == {"outcomes"}
    assert set(plots["outcomes"]) == {"demo/rl · PASS", "demo/rl · MODEL_FAIL"}
    loss = series_for(next(p for p in PANELS if p.title == "SFT loss"), runs)
    xs, ys = loss["SFT loss"]["demo/sft · eval/loss"]
    assert xs == [0, 2, 4] and ys == pytest.approx([3.5, 3.5 / 3, 3.5 / 5])


def test_report_has_every_chart(demo):
    out = write_report([demo], demo / "report.html")
    page = out.read_text()
    imgs = images(page)
    # pass@k (one benchmark/profile) + every metric panel but the two preference ones + stage timing.
    assert len(imgs) == 1 + len(PANELS) - 2 + 1
    assert all(b.startswith(PNG_MAGIC) for b in imgs)
    for title in ("Reward", "Held-out accuracy", "Sampler/trainer mismatch", "Stage timing", "SFT loss"):
        assert f"<h3>{title}</h3>" in page, title
    assert sorted(re.findall(r"<li>([^:<]+): no metric matching", page)) == ["Gold and proxy reward",
                                                                            "Preference accuracy"]
    assert "http://" not in page and "https://" not in page  # self-contained
    assert "algo: grpo" in page


def test_missing_metrics_are_notes_not_errors(tmp_path):
    write_sft(tmp_path / "sft")
    page = render_html(find_runs([tmp_path / "sft"]))
    assert "<h3>SFT loss</h3>" in page and "<h3>Reward</h3>" not in page
    assert "Not in these runs" in page
    assert "<li>Reward: no metric matching" in page
    assert "Evaluations" not in page


def test_several_runs_on_one_chart(tmp_path):
    write_rl(tmp_path / "a")
    write_rl(tmp_path / "b", reward_slope=0.2)
    runs = find_runs([tmp_path / "a", tmp_path / "b"])
    reward = series_for(PANELS[0], runs)
    assert set(reward["reward/mean"]) == {"a", "b"}
    page = render_html(runs)
    # pass@k + every panel but SFT loss, learning rate, throughput and the two preference ones + timing.
    assert len(images(page)) == 1 + len(PANELS) - 5 + 1
    assert "<h3>Learning rate</h3>" not in page
    assert page.count("TASK_FAIL/INFRA_FAIL") == 0


def test_bad_run_dirs(tmp_path):
    with pytest.raises(UserError, match="run directory not found"):
        find_runs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no run here"):
        find_runs([tmp_path / "empty"])


def test_cli_default_out(demo, capsys):
    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser)
    assert report_cli.run(parser.parse_args([str(demo)])) == 0
    assert (demo / "report.html").is_file()
    assert "report:" in capsys.readouterr().out


def test_cli_several_runs_write_into_the_first_runs_folder_not_the_working_one(demo, tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert report_cli.run(parser.parse_args([str(demo / "sft"), str(demo / "rl")])) == 0
    assert (demo / "sft" / "report.html").is_file() and list(work.iterdir()) == []


def test_report_renders_in_headless_chromium(demo, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    page = write_report([demo], demo / "report.html")
    shot = tmp_path / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,3000",
           page.resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.is_file(), "chromium wrote no screenshot"
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(shot)[..., :3]
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8) // 16, axis=0)
    assert len(colours) > 20, f"screenshot looks blank ({len(colours)} distinct colours)"
