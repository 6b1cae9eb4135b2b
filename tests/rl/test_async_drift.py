"""Async mode reports the engine's mismatch apart from the policy's drift (`posttrain.rl.drift`):
``mismatch/*`` compares the sampler with the trainer at the version that sampled each row,
``staleness/drift_*`` the trainer now with itself then."""

import pytest
import torch

from posttrain.rl.drift import BehaviourWeights, split_mismatch


def _async_rows(rl_overrides, reward_plugin, **extra):
    from posttrain.config import load_config
    from posttrain.jsonl import read_jsonl
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    over = {"mode": "async", "max_staleness": 1, "num_steps": 3, "optim.lr": 3e-3} | extra
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **over))
    run_rl(cfg, printer=lambda *_: None)
    return [m for _, m in read_jsonl(f"{cfg.out_dir}/metrics.jsonl") if m.get("step", 0) > 0]


@pytest.mark.slow
def test_stale_steps_show_drift_but_no_engine_mismatch_and_a_planted_gap_shows_in_mismatch(
        rl_overrides, reward_plugin, tmp_path):
    rows = _async_rows(rl_overrides, reward_plugin)
    stale = [m for m in rows if m["async/staleness_mean"] > 0]
    assert stale, [m["async/staleness_mean"] for m in rows]
    for m in stale:  # float32 engine: the same numbers as the trainer at the sampler's version
        assert m["mismatch/logprob_abs_diff_max"] < 1e-5 and m["mismatch/kl"] < 1e-10
        assert m["staleness/drift_logprob_abs_diff_max"] > 1e-3 and m["staleness/drift_kl"] > 1e-8
    bf16 = _async_rows(rl_overrides, reward_plugin, out_dir=tmp_path / "bf16", **{"rollout.engine_dtype": "bfloat16",
                                                       "asynchrony.self_test_max_kl": 1e-3})
    for m in bf16:
        assert m["mismatch/logprob_abs_diff_mean"] > 1e-4  # the planted precision gap, stale steps included


def _batch(old, sampler, versions):
    from posttrain.rl.batch import RLBatch

    n, t = old.shape
    return RLBatch(input_ids_BT=torch.zeros(n, t + 1, dtype=torch.long), attention_mask_BT=torch.ones(n, t + 1),
                   mask_BT=torch.ones(n, t, dtype=torch.bool), sampler_logp_BT=sampler,
                   prompt_idx_B=torch.zeros(n, dtype=torch.long), rewards_B=torch.zeros(n),
                   valid_B=torch.ones(n, dtype=torch.bool), policy_version_B=torch.tensor(versions),
                   old_logp_BT=old)


def test_split_by_hand():
    # row 0 fresh (version 5): sampler -1.0 vs trainer -1.1; row 1 sampled by version 4: the trainer then
    # gave -2.0 (sampler -2.0, no engine error), now -2.5 (drift 0.5); row 2 by version 3, no longer held
    old = torch.tensor([[-1.1], [-2.5], [-3.0]])
    sampler = torch.tensor([[-1.0], [-2.0], [-9.0]])
    at_sampler = torch.tensor([[0.0], [-2.0], [0.0]])
    m = split_mismatch(_batch(old, sampler, [5, 4, 3]), 5, at_sampler, torch.tensor([False, True, False]))
    assert m["mismatch/logprob_abs_diff_max"] == pytest.approx(0.1)  # row 2's 6.0 is left out
    assert m["mismatch/logprob_abs_diff_mean"] == pytest.approx(0.05)
    assert m["staleness/drift_logprob_abs_diff_max"] == pytest.approx(0.5)
    assert m["staleness/drift_kl"] == pytest.approx(torch.expm1(torch.tensor(-0.5)).item() + 0.5)


def test_behaviour_weights_hold_a_version_and_give_the_model_back():
    model = torch.nn.Linear(2, 2)
    keep = BehaviourWeights(max_staleness=1)
    keep.record(0, model)
    first = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    keep.record(1, model)
    with keep.holding(0, model):
        torch.testing.assert_close(model.weight, first)
    torch.testing.assert_close(model.weight, first + 1.0)
    keep.record(2, model)
    assert sorted(keep.saved) == [1, 2]  # version 0 is outside the bound now
