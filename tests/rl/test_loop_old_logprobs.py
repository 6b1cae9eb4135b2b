"""One update a step: the update's own forward gives the old log-probs of the rows that train
(`posttrain.rl.loop.defers_old_logprobs`), and the step equals the one that scores them first."""

import pytest
import torch

from posttrain.config import load_config
from posttrain.rl import loop
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import rl_step, setup
from posttrain.tracking import StageTimer


def _count_rows_without_grad(run) -> list[int]:
    """Rows of each policy forward that runs without autograd (a scoring forward)."""
    seen, target_logits = [], run.policy._target_logits

    def counting(*args):
        t = target_logits(*args)
        if not t.logits_BXV.requires_grad:
            seen.append(t.packed or t.logits_BXV.shape[0])
        return t

    run.policy._target_logits = counting
    return seen


def _two_steps(overrides: list[str], defer: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not defer:  # the path that scores every row before the update
            m.setattr(loop, "defers_old_logprobs", lambda *a: False)
        run = setup(load_config(RLConfig, None, overrides))
        scored = _count_rows_without_grad(run)
        batches, train_step = [], run.policy.train_step
        run.policy.train_step = lambda batch, loss_fn, **kw: batches.append(batch) or train_step(batch, loss_fn, **kw)
        metrics = [rl_step(run, step, StageTimer()) for step in (1, 2)]
    # what the step leaves in its batch (callers read it after the update)
    left = [(b.old_logp_BT, b.is_weights_BT) for b in batches]
    return metrics, scored, [p.detach().clone() for p in run.policy.model.parameters()] + left


# micro_batch_tokens=40: the 16 rows (up to 18 tokens) run in several micro-batches, so the old
# path cannot keep the scoring forward's graph and runs every trained row twice
@pytest.mark.parametrize("extra", [{}, {"correction.kind": "truncated", "correction.level": "sequence"},
                                   {"correction.kind": "icepop", "skip_zero_variance_backward": False}])
def test_the_update_forward_gives_the_old_logprobs_and_the_same_step(rl_overrides, reward_plugin, monkeypatch,
                                                                        extra):
    overrides = rl_overrides(verifier=f"{reward_plugin}:half_flat", **{
        "optim.lr": 1e-2, "optim.eps": 1e-5, "micro_batch_tokens": 40, "kl.track": False, **extra})
    (new, scored_new, w_new), (old, scored_old, w_old) = (_two_steps(overrides, d, monkeypatch) for d in (True, False))
    for a, b in zip(new, old):
        assert a["reward/mean"] == b["reward/mean"] and 0 < a["groups/zero_variance_frac"] < 1
        for key in ("loss", "grad_norm", "entropy", "mismatch/kl", "mismatch/logprob_abs_diff_max",
                    "is/ratio_mean", "policy/clip_frac"):
            assert key in a and key in b, key
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(w_new, w_old):  # weights, then each step's old log-probs and importance weights
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the rows that train are never scored apart: only flat groups' stand-ins run without autograd
    trained = sum(round(16 * (1 - m["groups/zero_variance_frac"])) for m in new)
    flat = 2 * 16 - trained
    stand_ins = flat // 4 if extra.get("skip_zero_variance_backward", True) else 0
    assert sum(scored_new) == stand_ins
    assert sum(scored_old) == (stand_ins + trained if stand_ins else 2 * 16)


@pytest.mark.parametrize("extra", [{"kl.track": True, "kl.track_every": 1}, {"mini_batches": 2}])
def test_steps_that_need_the_old_logprobs_first_still_score_every_row(rl_overrides, reward_plugin, extra):
    """The reference forward's steps (its KL reads the old log-probs before the update) and steps of
    several updates (the second sees moved weights) keep the scoring forward."""
    run = setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **{
        "micro_batch_tokens": 40, "skip_zero_variance_backward": False, **extra})))
    scored = _count_rows_without_grad(run)
    m = rl_step(run, 1, StageTimer())
    assert sum(scored) >= 16 and "entropy" in m and "mismatch/kl" in m
