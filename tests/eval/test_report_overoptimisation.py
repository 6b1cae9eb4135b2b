"""The report's gold-and-proxy-vs-KL plot appears exactly when a run logs all three metrics."""

import json

from posttrain.eval.report import find_runs, plot_overoptimisation, render_html


def write_run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_only_with_gold_proxy_and_kl(tmp_path):
    write_run(tmp_path / "ppo", [{"step": s, "kl/from_start": 0.5 * s, "reward/gold": 0.1 * s,
                                  "reward/proxy": s} for s in range(1, 5)])
    write_run(tmp_path / "grpo", [{"step": 1, "reward/mean": 0.3}])
    assert plot_overoptimisation(find_runs([tmp_path / "grpo"])) is None
    assert plot_overoptimisation(find_runs([tmp_path / "ppo"])) is not None
    page = render_html(find_runs([tmp_path / "ppo", tmp_path / "grpo"]))
    assert "Gold and proxy vs KL" in page and "Gold and proxy reward" in page
