"""`posttrain demo --task code --profile quick`: the seed's miniature end to end (slow lane)."""

import json
import subprocess
import sys

import pytest

from posttrain.eval.results import read_eval_json
from posttrain.eval.seed_table import SEED_ROWS

pytestmark = pytest.mark.slow


def test_quick_code_demo_runs_every_stage_and_tables_its_eval_files(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "demo", "--task", "code", "--profile", "quick",
                        "--out", str(out), "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"]) == ["prepare", "midtrain", "sft_direct", "rl_direct", "eval_direct",
                                       "sft_reasoning", "rl_reasoning", "eval_reasoning"]
    assert summary["columns"] == ["direct · greedy", "reasoning · t0.6"]
    assert list(summary["table"]) == [title for title, _ in SEED_ROWS]
    # each arm ran its own recipe: GRPO with the sandbox reward; Dr. GRPO with the format reward too
    direct = (out / "direct" / "config.yaml").read_text()
    reasoning = (out / "reasoning" / "config.yaml").read_text()
    assert "algorithm: grpo" in direct and "format_weight: 0.0" in direct
    assert "algorithm: dr_grpo" in reasoning and "format_reward: code_format" in reasoning
    check = [json.loads(line) for line in (out / "data" / "train_check_2.jsonl").read_text().splitlines()]
    train = {json.loads(line)["question_id"] for line in (out / "data" / "train_kodcode.jsonl").read_text().splitlines()}
    assert len(check) == 2 and {r["question_id"] for r in check} <= train  # a fixed draw of training problems
    for arm in ("direct", "reasoning"):
        steps = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert any("outcomes/MODEL_FAIL_frac" in s for s in steps)
        # the run tracked that draw itself: 8 samples a problem at T = 1, before RL and after its step
        assert [s["step"] for s in steps if "eval/train_fixed/t1/pass@8" in s] == [0, 1]
    # the table's numbers are the eval files' (pass@1 in percent), row by row
    names = dict(SEED_ROWS)
    for col, arm in enumerate(("direct", "reasoning")):
        evals = {label: {r.benchmark: r for r in read_eval_json(out / arm / "evals" / label / "eval.json")}
                 for label in ("before", "after")}
        for title, cells in summary["table"].items():
            for label, key in (("before", "before"), ("after", "after")):
                mean = next(x.mean for x in evals[label][names[title]].pass_at_k if x.k == 1)
                assert cells[col][key] == pytest.approx(100 * mean)
    # the held-out problems were read in their published formats
    config = (out / "direct" / "evals" / "after" / "config.yaml").read_text()
    assert all(f"kind: {kind}" in config for kind in ("evalplus", "mbpp", "livecodebench"))
    assert "| HumanEval+ |" in r.stdout and "| LiveCodeBench Hard |" in r.stdout
    assert (out / "report.md").read_text().startswith("| benchmark |")
    assert r.stdout.count("not expected to learn") == 2
    # the reasoning trace's markers survive decoding, so code_format and the program after </think> see them
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "reasoning" / "checkpoints" / "step-1")
    ids = tok("<think>plan</think>\n```python\nx = 1\n```")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True).startswith("<think>plan</think>")


def _window_means(metrics_path, key: str, width: int) -> tuple[float, float]:
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    values = [s[key] for s in steps if key in s]
    assert len(values) >= 2 * width, f"{metrics_path}: {len(values)} steps with {key}"
    return sum(values[:width]) / width, sum(values[-width:]) / width


@pytest.mark.release
def test_full_code_demo_raises_the_training_pass_rate_on_both_arms(tmp_path):
    """The default demo's RL learns its training task: on each arm the end's sampled pass rate on one
    fixed draw of 48 training problems (8 samples each at T = 1, paired by problem) is above the SFT
    start's, the run's own curve on that draw rises (its last three evaluations above its first
    three), and the last steps' pass fraction has not collapsed (at LoRA lr 1e-3 the direct arm's
    fell to 0). Not the per-step window alone: each step draws other problems, and on RL seeds 1 and
    2 the direct arm's last-4-step window fell while its pass rate on the fixed draw rose."""
    from posttrain.demo.code import PROFILES
    from posttrain.demo.code_check import describe, start_to_end, train_sample

    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "demo", "--task", "code", "--out", str(out),
                        "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    problems = train_sample(out / "data" / "train_kodcode.jsonl", tmp_path / "check", 48, seed=0)
    for arm in ("direct", "reasoning"):
        (start,) = (out / f"sft-{arm}" / "checkpoints").iterdir()
        tokens = PROFILES["full"]["reasoning_tokens" if arm == "reasoning" else "direct_tokens"]
        c = start_to_end(str(start), str(out / arm), problems, tmp_path / "check", arm, tokens, seed=0)
        assert c.change > 0 and c.after > 5, (arm, describe(c))
        _, last = _window_means(out / arm / "metrics.jsonl", "outcomes/PASS_frac", width=4)
        assert last > 0.05, (arm, last)
        # the run's own curve on the fixed draw (13 evaluations, 16 steps apart) rises along the run
        first, last = _window_means(out / arm / "metrics.jsonl", "eval/train_fixed/t1/pass@1", width=3)
        assert last > first, (arm, first, last)
