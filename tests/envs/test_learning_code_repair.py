"""Learning in the code-repair environment (tests/envs/learning.py has the design)."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.envs.config import EnvConfig
from posttrain.outcome import OutcomeClass
from posttrain.tracking import latest_checkpoint
from tests.envs.learning import EXAMPLES, episodes, success, warm_start


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_code_repair_passes_more_after_the_last_turn_than_after_the_first(tmp_path):
    sft, data = warm_start(tmp_path, "code_repair", 500, "--n-train", "1000", "--n-eval", "40")
    assert main(["rl", str(EXAMPLES / "grpo_code_repair.yaml"), f"model.path={sft}",
                 f"data.path={data / 'prompts_train.jsonl'}", "data.eval_path=", "num_steps=6", "kl.track=false",
                 "save_every=0", "logging.progress=false", f"out_dir={tmp_path / 'rl'}"]) == 0
    held_out = [json.loads(line) for line in (data / "prompts_eval.jsonl").read_text().splitlines()]
    eps = episodes(latest_checkpoint(tmp_path / "rl"), held_out, EnvConfig(name="code_repair", max_turns=3,
                                                                          max_total_tokens=256), 16, 1.0, 32)
    first = sum(bool(e.turn_rewards) and e.turn_rewards[0] >= 1.0 for e in eps) / len(eps)
    last = success(eps)
    print(f"code repair held-out pass (T=1, {len(held_out)} x 16): after the first turn {first:.3f}, "
          f"after the last {last:.3f}; turns per episode {sum(e.turns for e in eps) / len(eps):.2f}")
    assert not any(e.outcome.cls is OutcomeClass.INFRA_FAIL for e in eps)
    assert last > first
