"""Rows of zero-variance groups left out of the backward (``train_rows``): the step equals the one
that differentiates every row (loss, gradient norm, weights, scoring metrics), every denominator
stays the whole mini-batch's, and the backward really sees fewer rows."""

import pytest
import torch

from posttrain.algos.advantages import grpo_advantages
from posttrain.core.optim import OptimConfig, build_scheduler
from posttrain.models.hf import ModelConfig, load_model
from posttrain.rl.batch import build_batch
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import score_weights
from posttrain.rl.losses import make_loss_fn
from posttrain.rl.policy import Policy
from posttrain.rollout import Rollouts, SamplingParams

G = 4
# Groups 0 and 2 are zero-variance (all equal rewards), 1 and 3 informative; row 6 (group 1) is a
# TASK_FAIL, masked from the loss but counted in no denominator.
REWARDS = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0]
VALID = [True] * 6 + [False] + [True] * 9


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: a second thread only waits at barriers on a loaded machine
    yield
    torch.set_num_threads(before)


def _batch():
    """4 groups of 4 rows: prompts of 3, 6, 4 and 5 tokens, completions of 1-7 tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (3, 6, 4, 5)]
    lengths = [4, 2, 5, 1, 3, 6, 2, 4, 7, 3, 1, 5, 2, 6, 4, 3]
    completions = [torch.randint(5, 200, (n,), generator=g).tolist() for n in lengths]
    ro = Rollouts(prompt_idx=[i // G for i in range(16)], prompt_ids=[prompts[i // G] for i in range(16)],
                  completion_ids=completions, logprobs=[[-1.0] * len(c) for c in completions],
                  finish_reason=["length"] * 16, policy_version=[0] * 16, sampling=SamplingParams())
    batch = build_batch(ro, REWARDS, VALID, pad_id=0)
    batch.group_size = G
    adv_PG, metrics = grpo_advantages(batch.rewards_B.view(-1, G), batch.valid_B.view(-1, G))
    batch.adv_B = adv_PG.flatten()
    train_rows = ~metrics["zero_variance_P"].repeat_interleave(G)
    assert train_rows.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    # importance weights that differ per token, as the sampler->trainer correction gives
    batch.is_weights_BT = 0.5 + torch.rand(batch.mask_BT.shape, generator=g)
    return batch, train_rows


def _policy(model_dir, micro_batch_tokens: int, reuse: bool, weight_decay: float = 0.0):
    model = load_model(ModelConfig(path=str(model_dir)))
    cfg = OptimConfig(lr=0.1, warmup_steps=0, schedule="constant")
    # SGD: the weights then differ by lr x the gradient difference (Adam's first step turns rounding
    # noise in near-zero gradients into lr-sized steps); momentum and weight decay move the weights
    # on a zero gradient as Adam's moments do, and not at all without one.
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=weight_decay)
    policy = Policy(model, opt, build_scheduler(opt, cfg, 10), temperature=0.7, grad_clip=1.0,
                    micro_batch_tokens=micro_batch_tokens, reuse_score_forward=reuse)
    seen = []  # rows of each log-prob tensor the backward reaches
    target_logits = policy._target_logits

    def counting(*args):
        t = target_logits(*args)
        if t.logits_BXV.requires_grad:  # a packed forward holds its rows in one sequence
            rows = t.packed or t.logits_BXV.shape[0]
            t.logits_BXV.register_hook(lambda grad: seen.append(rows))
        return t

    policy._target_logits = counting
    return policy, seen


def _step(policy, skip: bool, aggregation: str, mini_batches: int, batch=None):
    batch, train_rows = batch or _batch()
    rows = train_rows if skip else None
    batch.old_logp_BT, batch.ref_logp_BT, scored = policy.score(batch, train_rows=rows)
    m = policy.train_step(batch, make_loss_fn(RLConfig()), aggregation=aggregation, mini_batches=mini_batches,
                          norm_constant=8.0, seed=3, train_rows=rows)
    return m, scored, batch.old_logp_BT


def _assert_same_weights(a: Policy, b: Policy):
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5), name


# micro_batch_tokens 1000: the whole batch is one micro-batch (with reuse, the scoring forward is
# differentiated); 40: several micro-batches of 2-4 rows. mini_batches=2: two optimizer steps, the
# second against old log-probs that are no longer the weights' (ratios off 1, clips active).
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("micro_batch_tokens, mini_batches, reuse", [(1000, 1, True), (1000, 2, False),
                                                                     (40, 1, False), (40, 2, False)])
def test_skipping_zero_variance_rows_takes_the_same_step(nano_model_dir, aggregation, micro_batch_tokens,
                                                          mini_batches, reuse):
    full, full_seen = _policy(nano_model_dir, micro_batch_tokens, reuse, weight_decay=0.01)
    skip, skip_seen = _policy(nano_model_dir, micro_batch_tokens, reuse, weight_decay=0.01)
    for _ in range(2):  # the second step starts from momentum and, with reuse, a new kept forward
        m_full, s_full, old_full = _step(full, False, aggregation, mini_batches)
        m_skip, s_skip, old_skip = _step(skip, True, aggregation, mini_batches)
        assert m_full["grad_norm"] > 0 and m_full["loss"] != 0
        for key in ("loss", "grad_norm"):
            assert m_skip[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-7), key
        assert s_skip["entropy"] == pytest.approx(s_full["entropy"], rel=1e-6)
        if mini_batches == 1:  # on-policy: every ratio is 1, and the metric is a mean over the trained tokens
            assert m_skip["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        torch.testing.assert_close(old_skip, old_full, rtol=1e-5, atol=1e-6)  # frozen rows scored all the same
    _assert_same_weights(full, skip)
    assert sum(full_seen) == 2 * 16 and sum(skip_seen) == 2 * 8  # 2 steps x the rows that train


def test_denominators_are_the_whole_mini_batch(nano_model_dir):
    """The loss of the trained rows alone, divided by the whole batch's 15 valid sequences: over the
    8 trained rows' 7 it would be 15/7 times larger (the bug a skip must not have)."""
    policy, _ = _policy(nano_model_dir, 1000, reuse=False)
    batch, train_rows = _batch()
    batch.old_logp_BT, _, _ = policy.score(batch)
    trained = batch.select(torch.nonzero(train_rows).flatten())
    with torch.no_grad():
        logp, _ = policy._forward(policy.model, trained)
        loss_BT, _ = make_loss_fn(RLConfig())(logp, trained)
    per_seq = ((loss_BT * trained.train_mask_BT).sum(1) / trained.train_mask_BT.sum(1).clamp(min=1)).sum()
    m = policy.train_step(batch, make_loss_fn(RLConfig()), aggregation="seq_mean_token_mean", train_rows=train_rows)
    assert m["loss"] == pytest.approx(float(per_seq) / 15, rel=1e-5)


def test_a_step_where_no_row_trains_still_steps_the_optimizer(nano_model_dir):
    """Every group zero-variance: no backward at all, and the weights move as a zero gradient moves
    them (momentum, weight decay), the schedule steps, the update is counted."""
    full, _ = _policy(nano_model_dir, 1000, reuse=True, weight_decay=0.01)
    skip, skip_seen = _policy(nano_model_dir, 1000, reuse=True, weight_decay=0.01)
    _step(full, False, "token_mean", 1)  # an informative step first: momentum to carry on
    _step(skip, True, "token_mean", 1)
    before = [p.detach().clone() for p in skip.model.parameters()]
    seen_before = len(skip_seen)
    for policy, skip_rows in ((full, False), (skip, True)):
        batch, _ = _batch()
        batch.adv_B = torch.zeros_like(batch.adv_B)
        m, _, _ = _step(policy, skip_rows, "token_mean", 1, batch=(batch, torch.zeros(16, dtype=torch.bool)))
        assert m["grad_norm"] == 0.0 and m["loss"] == 0.0
    assert len(skip_seen) == seen_before  # nothing was differentiated
    assert skip.core.updates == full.core.updates == 2
    assert skip.scheduler.state_dict() == full.scheduler.state_dict()
    assert not all(torch.equal(a, b) for a, b in zip(before, skip.model.parameters()))
    _assert_same_weights(full, skip)


def test_rows_with_a_nonzero_advantage_cannot_be_skipped(nano_model_dir):
    policy, _ = _policy(nano_model_dir, 1000, reuse=False)
    batch, train_rows = _batch()
    batch.old_logp_BT, _, _ = policy.score(batch)
    train_rows[5] = False  # an informative row
    with pytest.raises(ValueError, match="advantage of exactly 0"):
        policy.train_step(batch, make_loss_fn(RLConfig()), aggregation="token_mean", train_rows=train_rows)


# ------------------------------------------------------------------ zero-variance rows scored by sample


def test_score_weights_pick_each_zero_variance_groups_first_episode():
    batch, train_rows = _batch()
    assert score_weights(batch, train_rows).tolist() == [4, 0, 0, 0, 1, 1, 1, 1, 4, 0, 0, 0, 1, 1, 1, 1]
    assert score_weights(batch, None) is None  # a loss that trains every row scores every row
    batch.episode_B = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 10, 11, 12])  # multi-turn: rows per episode
    batch.group_size = 4
    rows = torch.tensor([False] * 3 + [True] * 13)
    # episode 0 (rows 0-1) stands for group 0; group 2 is episodes 8-11, episode 8 is row 9
    assert score_weights(batch, rows).tolist() == [4, 4, 0] + [1] * 13


def test_sampled_scoring_runs_fewer_rows_and_keeps_the_step_and_the_entropy_estimate(nano_model_dir):
    """The zero-variance groups 0 and 2 scored by their first rows: 10 rows run instead of 16, the
    scored rows' log-probs and the update are the full scoring's, the others carry the sampler's
    log-probs, and the entropy is the weighted mean of the per-token entropies (by hand)."""
    full, _ = _policy(nano_model_dir, 40, reuse=False)
    sampled, _ = _policy(nano_model_dir, 40, reuse=False)
    forwarded = []
    target_logits = sampled._target_logits
    sampled._target_logits = lambda model, mb: forwarded.append(len(mb)) or target_logits(model, mb)
    batch, train_rows = _batch()
    with torch.no_grad():
        _, ent_BT = full._forward(full.model, batch, with_entropy=True)
    m_full, s_full, old_full = _step(full, True, "token_mean", 1)
    batch.score_weight_B = score_weights(batch, train_rows)
    m_s, s_s, old_s = _step(sampled, True, "token_mean", 1, batch=(batch, train_rows))
    assert sum(forwarded) == 10 + 8  # scoring 8 trained rows and 2 of the 8 frozen, then the update's 8
    scored = batch.score_weight_B > 0
    torch.testing.assert_close(old_s[scored], old_full[scored], rtol=1e-5, atol=1e-6)
    assert torch.equal(old_s[~scored], (batch.sampler_logp_BT * batch.mask_BT)[~scored])
    w_BT = batch.mask_BT * batch.score_weight_B[:, None]
    assert s_s["entropy"] == pytest.approx(float((ent_BT * w_BT).sum() / w_BT.sum()), rel=1e-5)
    assert s_s["entropy"] != pytest.approx(s_full["entropy"], rel=1e-6)  # an estimate, not the same number
    for key in ("loss", "grad_norm"):
        assert m_s[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-7), key
    _assert_same_weights(full, sampled)


def test_sampled_scoring_refuses_the_reference_forward_and_unscored_training_rows(nano_model_dir):
    policy, _ = _policy(nano_model_dir, 1000, reuse=False)
    policy.ref_model = policy.model
    batch, train_rows = _batch()
    batch.score_weight_B = score_weights(batch, train_rows)
    with pytest.raises(ValueError, match="reference forward scores every row"):
        policy.score(batch, with_ref=True, train_rows=train_rows)
    batch.score_weight_B[4] = 0.0
    with pytest.raises(ValueError, match="every row that trains must be scored"):
        policy.score(batch, with_ref=False, train_rows=train_rows)


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo"])
def test_extremes_are_the_steps_whatever_the_micro_batching(nano_model_dir, policy_loss):
    """``*_max`` metrics are the largest value over the whole step (two optimizer steps here, the
    second off-policy so that ratios leave 1), at one micro-batch as at many; a token-weighted sum
    of the micro-batches' maxima would shrink as the micro-batches do."""
    loss_fn = make_loss_fn(RLConfig(policy_loss=policy_loss))
    out = []
    for micro_batch_tokens in (1000, 40, 12):
        policy, _ = _policy(nano_model_dir, micro_batch_tokens, reuse=False)
        batch, _ = _batch()
        batch.old_logp_BT, batch.ref_logp_BT, _ = policy.score(batch)
        out.append(policy.train_step(batch, loss_fn, aggregation="token_mean", mini_batches=2, norm_constant=8.0,
                                     seed=3))
    keys = [k for k in out[0] if k.endswith("_max")]
    assert "policy/ratio_max" in keys and (policy_loss != "gspo" or "policy/seq_ratio_max" in keys)
    assert out[0]["policy/ratio_max"] > 1.0 + 1e-3  # the second update moved the ratios
    for m in out[1:]:
        for k in keys:
            assert m[k] == pytest.approx(out[0][k], rel=1e-5), k
