"""Learning in the calculator environment (tests/envs/learning.py has the design)."""

from __future__ import annotations

import pytest

from tests.envs.learning import RELEASE, Schedule, calculator_run, success, tool_use, trained_rows, worst_mismatch


@pytest.mark.release
@pytest.mark.timeout(2400)  # ~9 min on 2 idle cores: 1000 SFT steps, 60 more, 25 GRPO steps, 2 x 256 episodes
def test_grpo_raises_calculator_episode_success(tmp_path):
    before, after, rows = calculator_run(tmp_path, RELEASE)
    # Both must move: the tool call (the behaviour GRPO rewards) and the episodes it solves. Measured:
    # tool use 0.43 -> 1.00, success 0.42 -> 0.99 (256 episodes each; +0.05 is over two standard
    # errors of the difference at any success rate here).
    assert tool_use(after) >= tool_use(before) + 0.3
    assert success(after) >= success(before) + 0.05
    assert worst_mismatch(rows) < 1e-4  # measured up to 4.9e-5 over 25 steps of ~5,500 model tokens


# CI's calculator run: the nano model (a step costs about an eighth of the tiny one's) at lr 3e-3 after
# 20 warmup steps learns the copying by SFT step ~250 (at the tiny model's lr 1e-3 not in 300 steps).
SHORT_CALC = Schedule(sft_steps=300, grpo_steps=6, held_out=32, size="nano", sft_lr=3e-3, sft_warmup=20)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~1.5 min on a core
def test_a_short_grpo_run_raises_calculator_tool_use_and_success(tmp_path):
    before, after, rows = calculator_run(tmp_path, SHORT_CALC)
    trained = trained_rows(tmp_path / "rl")
    assert len(trained) == SHORT_CALC.grpo_steps
    assert all(r["outcomes/PASS_frac"] + r["outcomes/MODEL_FAIL_frac"] == pytest.approx(1.0) for r in trained)
    # The same held-out prompts and sampling seeds before and after, so a learner that does not move
    # the weights scores the same twice. Measured (128 episodes each): tool use 0.36 -> 0.67, success
    # 0.18 -> 0.43; at lr 0 both stayed where they were, and with the advantages' sign flipped they
    # fell (tool use 0.08, success 0.06 after 5 steps).
    assert tool_use(after) >= tool_use(before) + 0.15
    assert success(after) >= success(before) + 0.12
    assert worst_mismatch(rows) < 1e-4
