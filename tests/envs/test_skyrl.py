"""An external package's environments (SkyRL-gym's gsm8k, single- and multi-turn, offline) through
`posttrain rl`, `posttrain eval` and `posttrain report`, end to end."""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.cli import main
from posttrain.data.records import write_jsonl
from posttrain.envs import EpisodeLimits, run_episodes
from posttrain.envs.skyrl import SkyRLEnv
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many?", "7"), ("What is 6 times 7?", "42"),
             ("A box holds 5 pens; how many in 3 boxes?", "15"), ("12 minus 5?", "7")]


def test_the_adapter_drives_skyrl_gsm8k_multi_turn(nano_tokenizer, scripted):
    def script(prompt, i):  # wrong, then right
        return "#### 8" if "Please provide" not in prompt else "#### 7"

    eps = run_episodes(scripted(script), nano_tokenizer, lambda: SkyRLEnv("gsm8k_multi_turn", max_turns=3),
                       [{"prompt": QUESTIONS[0][0], "answer": "7"}], 2, SamplingParams(), EpisodeLimits(max_turns=3))
    for e in eps:
        assert e.outcome.cls is OutcomeClass.PASS and e.turns == 2
        assert e.turn_rewards[0] < 1.0 and e.turn_rewards[-1] == 1.0  # SkyRL's per-turn rewards come through
        assert "Please provide your step-by-step reasoning" in e.messages[2]["content"]


def test_skyrl_env_through_rl_eval_and_report(nano_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "gsm.jsonl", [{"prompt": q, "answer": a} for q, a in QUESTIONS])
    run = tmp_path / "run"
    assert main(["rl", str(EXAMPLES / "grpo_skyrl_gsm8k.yaml"), f"model.path={nano_model_dir}", f"data.path={data}",
                 f"data.eval_path={data}", "num_steps=2", "prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "env.max_total_tokens=160", "logging.progress=false",
                 f"out_dir={run}"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and rows[-1]["env/turns_mean"] >= 1.0
    assert "eval/heldout/greedy/pass@1" in rows[-1]

    out = tmp_path / "eval"
    assert main(["eval", "benchmarks=[{kind: env, name: gsm8k, path: " + str(data) + ", env: {name: 'skyrl:gsm8k_multi_turn', "
                 "max_turns: 2, max_total_tokens: 160}}]", "profiles=[{name: sampled, temperature: 1.0, n: 2, "
                 "max_new_tokens: 8}]", f"model={run}", f"out_dir={out}", "--no-progress"]) == 0
    (result,) = json.loads((out / "eval.json").read_text())["results"]
    assert result["n"] == 2 and result["num_problems"] == 4 and [p["k"] for p in result["pass_at_k"]] == [1, 2]
    assert set(result["env"]) == {"env/turns_mean", "env/tool_calls_mean", "env/tool_error_frac"}
    assert 1.0 <= result["env"]["env/turns_mean"] <= 2.0
    samples = [json.loads(line) for line in (out / "samples" / "gsm8k.sampled.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(1 <= s["turns"] <= 2 for s in samples)

    (run / "evals").mkdir()
    (run / "evals" / "gsm8k.json").write_text((out / "eval.json").read_text())
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "turns / episode" in page and "<h3>Episodes</h3>" in page
