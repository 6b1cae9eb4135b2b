"""Policy forwards: each shared prompt run once gives the full forward's log-probs and gradients;
reusing the scoring forward for a single update gives the same step as running the model again."""

import pytest
import torch

from posttrain.core.dist import World
from posttrain.core.fsdp import shard_model
from posttrain.models.hf import ModelConfig, load_model
from posttrain.rl.batch import build_batch
from posttrain.rl import policy as policy_module
from posttrain.rl.config import RLConfig
from posttrain.rl.losses import make_loss_fn
from posttrain.rl.policy import Policy, has_active_dropout
from posttrain.rl.shared_prefix import TargetLogits, completion_logits
from posttrain.rollout import Rollouts, SamplingParams
from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny kernels: on a loaded machine a second OpenMP thread makes each one wait at a barrier
    (these tests took 10-14 s each with two threads at load 6, 0.1 s with one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _policy(model_dir, reuse: bool, micro_batch_tokens: int = 1000,
            checkpointing: bool = False, chunked_head: bool = True, pack_rows: bool = True) -> tuple[Policy, list[int]]:
    model = shard_model(load_model(ModelConfig(path=str(model_dir))), World(), activation_checkpointing=checkpointing)
    cfg = OptimConfig(lr=0.1, warmup_steps=0, schedule="constant")
    # plain SGD: the weights then differ by lr x the gradient difference (Adam's first step is
    # about lr x sign(grad), which turns rounding noise in near-zero gradients into lr-sized steps)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    policy = Policy(model, opt, build_scheduler(opt, cfg, 10), temperature=0.7, grad_clip=1.0,
                    micro_batch_tokens=micro_batch_tokens, reuse_score_forward=reuse, chunked_head=chunked_head,
                    pack_rows=pack_rows)
    calls = []  # one entry per policy forward over a micro-batch
    target_logits = policy._target_logits
    policy._target_logits = lambda *a: calls.append(1) or target_logits(*a)
    return policy, calls


def _batch(lengths=(4, 2, 5, 1, 3, 6, 2, 4)):
    """Rows 0-3 complete a 3-token prompt, rows 4-7 a 6-token one, with completions of ``lengths``."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (3, 6)]
    rows = [(i // 4, torch.randint(5, 200, (n,), generator=g).tolist()) for i, n in enumerate(lengths)]
    ro = Rollouts(prompt_idx=[i for i, _ in rows], prompt_ids=[prompts[i] for i, _ in rows],
                  completion_ids=[c for _, c in rows], logprobs=[[-1.0] * len(c) for _, c in rows],
                  finish_reason=["length"] * len(rows), policy_version=[0] * len(rows), sampling=SamplingParams())
    batch = build_batch(ro, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [True] * 8, pad_id=0)
    batch.adv_B = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0])
    return batch


def _plain_logits(model, mb):
    out = model(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT, position_ids=mb.position_ids_BT())
    return TargetLogits.full(out.logits[:, :-1], mb.input_ids_BT[:, 1:])


def _masked_logp_grads(model, t: TargetLogits, mb):
    logp = t.place(t.logits_BXV.log_softmax(-1).gather(-1, t.targets_BX[..., None]).squeeze(-1))
    model.zero_grad()
    (logp * mb.mask_BT).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def test_shared_prompts_give_the_full_forward_logprobs_and_gradients(nano_model_dir):
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    mb = _batch().select(torch.tensor([5, 0, 7, 2, 1, 6, 3, 4]))  # groups interleaved, prompts of 3 and 6 tokens
    plain_logp, plain_grads = _masked_logp_grads(model, _plain_logits(model, mb), mb)
    positions = []  # tokens each model forward runs
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: positions.append(args[0].numel()))
    shared = completion_logits(model, mb, torch.device("cpu"))
    # the 2 prompts once (6 columns each, left-padded), then 8 rows x the longest completion (6)
    # less its last token, which predicts nothing
    assert positions == [2 * 6, 8 * 5]
    assert shared is not None and shared.logits_BXV.shape == (8, 6, model.config.vocab_size)
    shared_logp, shared_grads = _masked_logp_grads(model, shared, mb)
    assert shared_logp.shape == mb.mask_BT.shape
    assert torch.allclose(shared_logp[mb.mask_BT], plain_logp[mb.mask_BT], atol=1e-5)
    assert (shared_logp[~mb.mask_BT] == 0).all()
    for a, b in zip(plain_grads, shared_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_one_token_completions_still_run_two_forwards(nano_model_dir):
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    mb = _batch(lengths=(1,) * 8)
    plain_logp, plain_grads = _masked_logp_grads(model, _plain_logits(model, mb), mb)
    positions = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: positions.append(args[0].numel()))
    shared_logp, shared_grads = _masked_logp_grads(model, completion_logits(model, mb, torch.device("cpu")), mb)
    assert positions == [2 * 6, 8 * 1]  # a sharded model's ranks must all make the same two calls
    assert torch.allclose(shared_logp[mb.mask_BT], plain_logp[mb.mask_BT], atol=1e-5)
    for a, b in zip(plain_grads, shared_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefix_falls_back_when_nothing_is_shared_or_prompts_disagree(nano_model_dir):
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    batch = _batch()
    assert completion_logits(model, batch.select([0, 4]), torch.device("cpu")) is None  # one row per prompt
    batch.input_ids_BT[1, 0] += 1  # row 1 claims prompt 0 but its first token differs
    assert completion_logits(model, batch.select([0, 1]), torch.device("cpu")) is None


def test_shared_prefix_is_taken_only_when_every_rank_can_take_it(nano_model_dir):
    """Sharded ranks run forwards in lock step: a rank that could share its prompts still falls back
    when a peer cannot (``agree`` says no), and a rank that cannot is never told to."""
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    batch = _batch()
    asked = []
    peers_disagree = lambda ok: asked.append(ok) and False  # noqa: E731
    assert completion_logits(model, batch.select([0, 1]), torch.device("cpu"), agree=peers_disagree) is None
    assert completion_logits(model, batch.select([0, 4]), torch.device("cpu"), agree=lambda ok: asked.append(ok) or ok) is None
    assert asked == [True, False]


def _step(policy: Policy, mini_batches: int = 1) -> dict:
    batch = _batch()
    batch.old_logp_BT, batch.ref_logp_BT, _ = policy.score(batch)
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


# 8 rows of 4-12 tokens: a budget of 60 tokens splits them in two micro-batches (rows 0-4: 5 x 9,
# rows 5-7: 3 x 12) and nothing is kept (2 scoring + 2 update forwards); with 2 mini-batches the
# kept forward covers neither half (1 scoring + 2 update forwards).
@pytest.mark.parametrize("micro_batch_tokens, mini_batches, forwards", [(60, 1, 4), (1000, 2, 3)])
def test_no_reuse_across_micro_or_mini_batches(nano_model_dir, micro_batch_tokens, mini_batches, forwards):
    slow, _ = _policy(nano_model_dir, reuse=False, micro_batch_tokens=micro_batch_tokens)
    fast, fast_calls = _policy(nano_model_dir, reuse=True, micro_batch_tokens=micro_batch_tokens)
    assert _step(slow, mini_batches)["grad_norm"] > 0
    _step(fast, mini_batches)
    assert len(fast_calls) == forwards
    _assert_same_weights(slow, fast)


@pytest.mark.parametrize("reuse", [False, True])
def test_activation_checkpointing_takes_the_same_steps_through_the_shared_prompts(nano_model_dir, reuse):
    """Each checkpointed layer runs again in backward with the cache it was given: the prompt pass
    must not append its keys twice nor the completion pass store its own, and the completions'
    gradient must still reach the one prompt pass. Same loss, gradient norm and weights as the shared
    forward without checkpointing, and (to summation order) as the full forward, which has no prompt
    pass whose gradient could go missing in both."""
    plain, _ = _policy(nano_model_dir, reuse=reuse)
    full, _ = _policy(nano_model_dir, reuse=reuse)
    ckpt, _ = _policy(nano_model_dir, reuse=reuse, checkpointing=True)
    positions = []  # tokens per model forward: the shared path runs the 2 prompts (6 columns) alone
    ckpt.model.model.embed_tokens.register_forward_hook(lambda m, args, out: positions.append(args[0].numel()))
    for _ in range(2):
        m_plain, m_ckpt = _step(plain), _step(ckpt)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(policy_module, "completion_logits", lambda *a, **k: None)
            m_full = _step(full)
        assert m_plain["grad_norm"] > 0
        assert m_ckpt["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-6)
        assert m_ckpt["loss"] == pytest.approx(m_plain["loss"], rel=1e-6, abs=1e-7)
        assert m_ckpt["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-4)
    assert positions.count(2 * 6) >= 2
    for (name, p), q, f in zip(plain.model.named_parameters(), ckpt.model.parameters(), full.model.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6, msg=name)
        torch.testing.assert_close(q, f, atol=1e-5, rtol=1e-4, msg=name)


def test_dropout_turns_reuse_off(nano_model_dir):
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    assert not has_active_dropout(model)
    model.config.attention_dropout = 0.1
    assert has_active_dropout(model)
    opt = build_optimizer(model.parameters(), OptimConfig())
    policy = Policy(model, opt, build_scheduler(opt, OptimConfig(), 1), temperature=1.0, grad_clip=1.0,
                    micro_batch_tokens=1000, reuse_score_forward=True)
    assert not policy.reuse_score_forward


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_chunked_head_takes_the_steps_full_logits_take(nano_model_dir, shared, checkpointing, monkeypatch):
    """Hidden states out of the forward and the head applied in chunks (the default) against the
    model's own logits: the same scores, losses, gradient norms and weights, through the shared-prompt
    forward and the full one, with activation checkpointing too."""
    if not shared:
        monkeypatch.setattr(policy_module, "completion_logits", lambda *a, **k: None)
    full, _ = _policy(nano_model_dir, reuse=True, checkpointing=checkpointing, chunked_head=False)
    chunked, _ = _policy(nano_model_dir, reuse=True, checkpointing=checkpointing)
    head_calls = []
    original = policy_module.head_token_logprobs
    monkeypatch.setattr(policy_module, "head_token_logprobs", lambda *a, **k: head_calls.append(1) or original(*a, **k))
    assert_same_steps(full, chunked)
    assert head_calls  # the chunked path ran


def assert_same_steps(reference: Policy, other: Policy, steps: int = 2) -> None:
    """Two policies built alike score the same batches alike and take the same steps: log-probs,
    entropy, loss, gradient norm and, at the end, weights."""
    for _ in range(steps):
        batch = _batch()
        old_ref, _, m_ref_score = reference.score(batch)
        old_other, _, m_other_score = other.score(batch)
        torch.testing.assert_close(old_other, old_ref, atol=1e-6, rtol=1e-6)
        assert m_other_score["entropy"] == pytest.approx(m_ref_score["entropy"], rel=1e-5)
        m_ref, m_other = _step(reference), _step(other)
        assert m_ref["grad_norm"] > 0
        assert m_other["grad_norm"] == pytest.approx(m_ref["grad_norm"], rel=1e-5)
        assert m_other["loss"] == pytest.approx(m_ref["loss"], rel=1e-5, abs=1e-7)
    _assert_same_weights(reference, other)


def test_the_entropy_metric_adds_no_matmul_through_the_head(nano_model_dir, monkeypatch):
    """The entropy comes from the log-probs' own chunks of logits: as many products with the head's
    weight with it as without it, and the same log-probs."""
    policy, _ = _policy(nano_model_dir, reuse=False)
    weight = policy.model.get_output_embeddings().weight
    calls, linear = [], torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, *a: calls.append(w is weight) or linear(x, w, *a))
    mb = _batch().select(torch.arange(8))
    with torch.no_grad():
        logp, _ = policy._forward(policy.model, mb)
        without = sum(calls)
        logp_ent, ent = policy._forward(policy.model, mb, with_entropy=True)
    assert without >= 1 and sum(calls) == 2 * without
    assert torch.equal(logp_ent, logp) and torch.isfinite(ent).all() and ent.abs().sum() > 0
