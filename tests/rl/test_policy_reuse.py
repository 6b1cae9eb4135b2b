"""Policy: reusing the scoring forward for a single update gives the same step as running the model again."""

import pytest
import torch

from posttrain.models.hf import ModelConfig, load_model
from posttrain.rl.batch import build_batch
from posttrain.rl.config import RLConfig
from posttrain.rl.losses import make_loss_fn
from posttrain.rl.policy import Policy, has_active_dropout
from posttrain.rollout import Rollouts, SamplingParams
from posttrain.train.optim import OptimConfig, build_optimizer, build_scheduler


def _policy(model_dir, reuse: bool, micro_batch_size: int = 8) -> tuple[Policy, list[int]]:
    model = load_model(ModelConfig(path=str(model_dir)))
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    cfg = OptimConfig(lr=0.1, warmup_steps=0, schedule="constant")
    # plain SGD: the weights then differ by lr x the gradient difference (Adam's first step is
    # about lr x sign(grad), which turns rounding noise in near-zero gradients into lr-sized steps)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    policy = Policy(model, opt, build_scheduler(opt, cfg, 10), temperature=0.7, grad_clip=1.0,
                    micro_batch_size=micro_batch_size, reuse_score_forward=reuse)
    return policy, calls


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (3, 6)]
    rows = [(i, torch.randint(5, 200, (n,), generator=g).tolist()) for i, n in
            [(0, 4), (0, 2), (0, 5), (0, 1), (1, 3), (1, 6), (1, 2), (1, 4)]]
    ro = Rollouts(prompt_idx=[i for i, _ in rows], prompt_ids=[prompts[i] for i, _ in rows],
                  completion_ids=[c for _, c in rows], logprobs=[[-1.0] * len(c) for _, c in rows],
                  finish_reason=["length"] * len(rows), policy_version=[0] * len(rows), sampling=SamplingParams())
    batch = build_batch(ro, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [True] * 8, pad_id=0)
    batch.adv_B = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0])
    return batch


def _step(policy: Policy, mini_batches: int = 1) -> dict:
    batch = _batch()
    policy.score(batch)
    return policy.train_step(batch, make_loss_fn(RLConfig()), aggregation="seq_mean_token_mean",
                             mini_batches=mini_batches, seed=3)


def _assert_same_weights(a: Policy, b: Policy):
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5), name


def test_single_update_reuses_the_scoring_forward_and_takes_the_same_step(nano_model_dir):
    slow, slow_calls = _policy(nano_model_dir, reuse=False)
    fast, fast_calls = _policy(nano_model_dir, reuse=True)
    for _ in range(2):  # the second step checks the kept forward follows the updated weights
        m_slow, m_fast = _step(slow), _step(fast)
        assert m_slow["grad_norm"] > 0
        assert m_fast["grad_norm"] == pytest.approx(m_slow["grad_norm"], rel=1e-5)
        assert m_fast["loss"] == pytest.approx(m_slow["loss"], rel=1e-5, abs=1e-7)
    assert len(slow_calls) == 4 and len(fast_calls) == 2  # score + update each step vs score only
    _assert_same_weights(slow, fast)


# 8 rows: in micro-batches of 4 nothing is kept (2 scoring + 2 update forwards); with 2 mini-batches
# the kept forward covers neither half (1 scoring + 2 update forwards).
@pytest.mark.parametrize("micro_batch_size, mini_batches, forwards", [(4, 1, 4), (8, 2, 3)])
def test_no_reuse_across_micro_or_mini_batches(nano_model_dir, micro_batch_size, mini_batches, forwards):
    slow, _ = _policy(nano_model_dir, reuse=False, micro_batch_size=micro_batch_size)
    fast, fast_calls = _policy(nano_model_dir, reuse=True, micro_batch_size=micro_batch_size)
    assert _step(slow, mini_batches)["grad_norm"] > 0
    _step(fast, mini_batches)
    assert len(fast_calls) == forwards
    _assert_same_weights(slow, fast)


def test_dropout_turns_reuse_off(nano_model_dir):
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    assert not has_active_dropout(model)
    model.config.attention_dropout = 0.1
    assert has_active_dropout(model)
    opt = build_optimizer(model.parameters(), OptimConfig())
    policy = Policy(model, opt, build_scheduler(opt, OptimConfig(), 1), temperature=1.0, grad_clip=1.0,
                    micro_batch_size=8, reuse_score_forward=True)
    assert not policy.reuse_score_forward
