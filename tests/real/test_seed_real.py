"""`posttrain demo --task code --model smollm2 --profile quick`: the seed's direct arm on SmolLM2-135M-Instruct
and the real benchmark files, two RL steps (the real lane; the full run is docs/seed.md's)."""

import json
import subprocess
import sys

import pytest

from posttrain.data.records import load_records
from posttrain.eval.decontam import build_index
from posttrain.eval.results import read_eval_json

pytestmark = pytest.mark.real


def test_quick_real_seed_demo_trains_and_tables_the_real_benchmarks(tmp_path, smollm2_dir):
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "demo", "--task", "code", "--model", "smollm2",
                        "--profile", "quick", "--out", str(out), "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"]) == ["prepare", "rl_direct", "eval_direct"]
    # the seed's direct recipe on the real model: GRPO, LoRA r=32, non-thinking, the sandbox's reward
    config = (out / "direct" / "config.yaml").read_text()
    assert "algorithm: grpo" in config and "r: 32" in config and "thinking: false" in config
    assert "micro_batch_tokens: 2048" in config  # the update's memory on a laptop (posttrain.demo.code_real)
    steps = [json.loads(line) for line in (out / "direct" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all("outcomes/PASS_frac" in s for s in steps)
    # the training problems share no 13-gram with the benchmarks they are evaluated on
    index = build_index([f"tests/data/realbench/{b}" for b in ("HumanEvalPlus.jsonl.gz", "MbppPlus.jsonl.gz")])
    train = load_records(out / "data" / "train.jsonl")
    assert len(train) > 600 and not any(index.contaminated([rec["question"]]) for rec in train)
    # the four evalplus rows hold the eval files' pass@1; LiveCodeBench has no file here, so no row
    table = summary["table"]
    assert list(table) == ["HumanEval", "HumanEval+", "MBPP", "MBPP+"]
    for title, name in (("HumanEval", "humaneval"), ("HumanEval+", "humaneval_plus"), ("MBPP", "mbpp"),
                        ("MBPP+", "mbpp_plus")):
        for label in ("before", "after"):
            res = {x.benchmark: x for x in read_eval_json(out / "direct" / "evals" / label / "eval.json")}
            assert table[title][0][label] == pytest.approx(100 * res[name].pass_at_k[0].mean)
            assert table[title][0]["problems"] == 2
    # the run as seed 0 of `--seeds`: finished, so not run again; the combined report holds its table
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "seed-0").symlink_to(out)
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "demo", "--task", "code", "--model", "smollm2",
                        "--profile", "quick", "--seeds", "0", "--out", str(seeds)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "seed 0: finished" in r.stdout and "[demo] rl_direct" not in r.stdout
    combined = json.loads((seeds / "summary.json").read_text())
    direct = combined["held_out"]["direct"]
    assert direct["same_start"] and list(direct["rows"]) == list(table)
    for title, row in direct["rows"].items():
        assert row["seeds"]["0"]["after"] == table[title][0]["after"] == pytest.approx(row["seeds"]["0"]["before"]
                                                                                        + row["mean_change"])
    assert combined["reward"]["direct"]["0"]["reward"] == [s["reward/mean"] for s in steps]
    assert combined["seconds"]["0"] == summary["seconds"] and "## Training reward per RL step" in r.stdout
