"""`posttrain demo --task code --model smollm2 --profile quick --arms direct,reasoning`: the seed's two arms on
SmolLM2-135M-Instruct and the real benchmark files, two RL steps each (the real lane; the full run is
docs/seed.md's)."""

import json
import subprocess
import sys

import pytest

from posttrain.data.records import load_records
from posttrain.eval.decontam import build_index, record_texts
from posttrain.eval.results import read_eval_json

pytestmark = pytest.mark.real

BENCHES = (("HumanEval", "humaneval"), ("HumanEval+", "humaneval_plus"), ("MBPP", "mbpp"), ("MBPP+", "mbpp_plus"))
COLUMNS = [("direct", "greedy"), ("reasoning", "t0.6")]


def _demo(out, *more):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "demo", "--task", "code", "--model", "smollm2",
                           "--profile", "quick", "--arms", "direct,reasoning", "--out", str(out), *more],
                          capture_output=True, text=True)


def test_quick_real_seed_demo_trains_and_tables_the_real_benchmarks(tmp_path, smollm2_dir):
    out = tmp_path / "demo"
    r = _demo(out, "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"]) == ["prepare", "sft_reasoning", "rl_direct", "eval_direct", "rl_reasoning",
                                       "eval_reasoning"]
    # the seed's direct recipe on the real model: GRPO, LoRA r=32, non-thinking, the sandbox's reward
    config = (out / "direct" / "config.yaml").read_text()
    assert "algorithm: grpo" in config and "r: 32" in config and "thinking: false" in config
    assert "micro_batch_tokens: 2048" in config  # the update's memory on a laptop (posttrain.demo.code_real)
    # the reasoning recipe from the trace SFT's checkpoint: Dr. GRPO + 0.05 x code_format, thinking
    config = (out / "reasoning" / "config.yaml").read_text()
    assert "algorithm: dr_grpo" in config and "format_reward: code_format" in config and "thinking: true" in config
    assert "micro_batch_tokens: 2048" in config and f"path: {out / 'sft-reasoning' / 'checkpoints' / 'step-2'}" in config
    sft = (out / "sft-reasoning" / "config.yaml").read_text()
    assert "num_steps: 2" in sft and "schedule: constant" in sft and "sft_thinking.clean.jsonl" in sft
    for arm in ("direct", "reasoning"):
        steps = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2] and all("outcomes/PASS_frac" in s for s in steps)
    # the training problems and the traces share no 13-gram with the benchmarks they are evaluated on
    index = build_index([f"tests/data/realbench/{b}" for b in ("HumanEvalPlus.jsonl.gz", "MbppPlus.jsonl.gz")])
    train = load_records(out / "data" / "train.jsonl")
    assert len(train) > 600 and not any(index.contaminated([rec["question"]]) for rec in train)
    traces = load_records(out / "data" / "sft_thinking.clean.jsonl")
    assert len(traces) > 400 and not any(index.contaminated(t for _, t in record_texts(rec, None, "trace"))
                                               for rec in traces)
    # the four evalplus rows hold each arm's eval files' pass@1; LiveCodeBench has no file here, so no row
    table = summary["table"]
    assert summary["columns"] == [f"{arm} · {profile}" for arm, profile in COLUMNS]
    assert list(table) == [title for title, _ in BENCHES]
    for col, (arm, profile) in enumerate(COLUMNS):
        for title, name in BENCHES:
            for label in ("before", "after"):
                res = {x.benchmark: x for x in read_eval_json(out / arm / "evals" / label / "eval.json")}
                assert res[name].profile == profile
                assert table[title][col][label] == pytest.approx(100 * res[name].pass_at_k[0].mean)
                assert table[title][col]["problems"] == 2
    # the run as seed 0 of `--seeds`: finished, so not run again; the combined report holds its table
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "seed-0").symlink_to(out)
    r = _demo(seeds, "--seeds", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "seed 0: finished" in r.stdout and "[demo] rl_" not in r.stdout and "[demo] sft_" not in r.stdout
    combined = json.loads((seeds / "summary.json").read_text())
    for col, (arm, profile) in enumerate(COLUMNS):
        held = combined["held_out"][f"{arm} · {profile}"]
        assert held["same_start"] and list(held["rows"]) == list(table)
        for title, row in held["rows"].items():
            assert row["seeds"]["0"]["after"] == table[title][col]["after"] == pytest.approx(
                row["seeds"]["0"]["before"] + row["mean_change"])
        steps = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert combined["reward"][arm]["0"]["reward"] == [s["reward/mean"] for s in steps]
    assert combined["seconds"]["0"] == summary["seconds"] and "## Training reward per RL step" in r.stdout
