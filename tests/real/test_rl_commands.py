"""`posttrain rl` (GRPO, the sandbox's code reward, LoRA r=32, sync and async) and `posttrain distill`
on SmolLM2-135M-Instruct, two steps each through the command's entry point in this process.

What a wrong implementation would break: the metrics the contract names are there and finite, the
sampler's log-probs are the trainer's on every step (float32 rounding, ~3e-5: a stale lm_head or a
sync that never reached the sampler is off by nats; in sync mode step 2 samples after the first
push), the checkpoint's weights are not the starting model's (a step that updated nothing, or a
LoRA adapter that never merged, leaves them equal), the async run's samples are never older than
the bound, and distillation's reverse KL to the teacher is measured on every step.

The RL runs skip what other lanes check and would cost a second model here: the KL reference
(``kl.track=false``; the tracked KL is the default suite's) and the async start-up self-test
(``asynchrony.self_test=false``: its agreement check is what step 1's mismatch bound checks, and
its pushes of perturbed weights are tested on the tiny models)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from posttrain.cli import main

pytestmark = pytest.mark.real

TASKS = [("Write a Python function `add(a, b)` that returns the sum of a and b.", "add",
          "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"),
         ("Write a Python function `is_even(n)` that returns True when n is even.", "is_even",
          "def check(candidate):\n    assert candidate(4) is True\n    assert candidate(7) is False\n")]

CONTRACT = ("step", "time/step_s", "time/update_s", "time/sync_s", "reward/mean", "entropy",
            "response_length/mean", "groups/zero_variance_frac", "mismatch/kl", "mismatch/logprob_abs_diff_max")


@pytest.fixture(scope="session")
def code_prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("code") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "entry_point": e, "tests": t}) + "\n" for p, e, t in TASKS))
    return path


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rl_args(model_dir, prompts, out: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", f"data.path={prompts}", "verifier=code", "algorithm=grpo",
            "model.lora.enabled=true", "model.lora.r=32", "model.lora.alpha=64", "optim.lr=1e-3",
            "optim.warmup_steps=0", "rollout.group_size=4", "rollout.max_new_tokens=40", "rollout.temperature=1.0",
            "prompts_per_step=2", "num_steps=2", "eval_every=0", "save_every=0", "seed=3", "kl.track=false",
            "logging.progress=false", f"out_dir={out}", *extra]


def assert_trained_steps(metrics: list[dict]) -> None:
    steps = [r for r in metrics if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in CONTRACT:
            assert key in r and math.isfinite(r[key]), key
        assert r["outcomes/PASS_frac"] + r["outcomes/MODEL_FAIL_frac"] == pytest.approx(1.0)  # no sandbox failure
        assert r["mismatch/logprob_abs_diff_max"] < 1e-3, r["step"]  # the sampler holds the trainer's weights
    assert any(r["groups/zero_variance_frac"] < 1 for r in steps), "every group flat: nothing to learn from"


def assert_weights_moved(run_dir: Path, base) -> None:
    from transformers import AutoModelForCausalLM

    (ckpt,) = (run_dir / "checkpoints").iterdir()
    trained = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).state_dict()
    start = base.state_dict()
    moved = [k for k in start if not torch.equal(trained[k], start[k])]
    assert moved and all("proj" in k for k in moved)  # LoRA merges into the adapted linear layers only


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_grpo_code_reward_lora_r32(smollm2_dir, smollm2, code_prompts, tmp_path, mode):
    out = tmp_path / mode
    extra = ["asynchrony.self_test=false"] if mode == "async" else []
    assert main(["rl", *rl_args(smollm2_dir, code_prompts, out, f"mode={mode}", "max_staleness=1", *extra)]) == 0
    metrics = rows(out)
    assert_trained_steps(metrics)
    assert_weights_moved(out, smollm2[0])
    if mode == "async":
        staleness = [r["async/staleness_max"] for r in metrics if "async/staleness_max" in r]
        assert len(staleness) == 2 and all(0 <= s <= 1 for s in staleness)
    else:
        assert all(r["time/rollout_s"] > 0 for r in metrics if "reward/mean" in r)


def test_distill_from_itself_measures_zero_reverse_kl(smollm2_dir, code_prompts, tmp_path):
    """The teacher is the student's own starting weights: its per-token distribution at every state
    the student visited must equal the student's, so the reverse KL of step 1 is zero to float32
    rounding; a teacher scored on shifted tokens or other positions would be off by nats."""
    out = tmp_path / "distill"
    assert main(["distill", f"model.path={smollm2_dir}", f"teacher.path={smollm2_dir}", f"data.path={code_prompts}",
                 "verifier=code", "rollout.group_size=2", "rollout.max_new_tokens=24", "prompts_per_step=2",
                 "num_steps=2", "eval_every=0", "save_every=0", "optim.lr=1e-5", "logging.progress=false",
                 f"out_dir={out}"]) == 0
    steps = [r for r in rows(out) if "distill/reverse_kl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert abs(steps[0]["distill/reverse_kl"]) < 1e-5 and abs(steps[0]["distill/reverse_kl_sampled"]) < 1e-5
    assert all(math.isfinite(r["distill/teacher_logp"]) and r["distill/teacher_logp"] < 0 for r in steps)
