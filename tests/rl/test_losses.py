"""Wiring of the RL loss inside `learn`: what the optimizer sees, computed by hand from the batch.

The pure functions of `posttrain.algos` have their own numeric tests; these check that the pieces
reach the loss: importance weights, the KL term in the loss, KL in the reward, the estimator's
advantages, the aggregation and Dr. GRPO's normalising constant, and the behaviour distribution
under top-p. The expected loss is written here from the formulas, with the trainer's log-probs
from a plain forward of the model (not the shared-prefix path `learn` uses).
"""

import math

import pytest
import torch

from posttrain.config import load_config
from posttrain.outcome import Outcome
from posttrain.rl.batch import outcome_batch
from posttrain.rl.config import CorrectionConfig, RLConfig
from posttrain.rl.config import sampling_params
from posttrain.rl.loop import learn, setup
from posttrain.rl.losses import importance_weights
from posttrain.tracking import StageTimer

G = 4
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0]  # group 2 is zero-variance


@pytest.fixture(scope="module")
def ref_model_dir(tmp_path_factory):
    from posttrain.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("ref"), "nano", seed=1)  # a reference unlike the policy


def _plain_logp(model, batch, temperature):
    out = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT,
                position_ids=batch.position_ids_BT())
    logp = torch.log_softmax(out.logits[:, :-1].float() / temperature, -1)
    return logp.gather(-1, batch.input_ids_BT[:, 1:, None]).squeeze(-1)


def _step_inputs(run, seed=3):
    """Three groups of real samples whose sampler log-probs are nudged (so IS weights are not 1)."""
    prompts = [run.train_prompts[i] for i in range(3)]
    ro = run.engine.generate(prompts, G, sampling_params(run.cfg, seed))
    ro.logprobs = [[lp + d for lp, d in zip(row, _nudges(i, len(row)))] for i, row in enumerate(ro.logprobs)]
    return ro, [Outcome.model_fail(reward=r) for r in REWARDS]


def _nudges(row: int, n: int) -> list[float]:
    return (0.4 * torch.randn(n, generator=torch.Generator().manual_seed(row))).tolist()


def _hand_advantages(rewards_PG, algorithm, lengths_PG):
    mean = rewards_PG.mean(1, keepdim=True)
    centred = rewards_PG - mean
    if algorithm == "grpo":
        adv = centred / (rewards_PG.std(1, keepdim=True) + 1e-6)
    elif algorithm == "dr_grpo":
        adv = centred
    else:  # reinforce_pp: whiten the centred rewards over every loss token of the batch
        tokens = torch.repeat_interleave(centred.flatten(), lengths_PG.flatten())
        adv = (centred - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8)
    return adv


def _expected_loss(run, ro, cfg):
    """The step's loss from the formulas: ratio 1 on-policy, so each token contributes -A·w (+ β·KL)."""
    batch = outcome_batch(ro, [Outcome.model_fail(reward=r) for r in REWARDS], run.tokenizer.pad_token_id)
    mask, T = batch.train_mask_BT, cfg.rollout.temperature
    with torch.no_grad():
        logp = _plain_logp(run.policy.model, batch, T)
        ref = _plain_logp(run.policy.ref_model, batch, T) if run.policy.ref_model is not None else logp
    d = ref - logp
    kl_tok = {"k3": torch.expm1(d) - d, "k2": 0.5 * d**2, "k1": -d}[cfg.kl.estimator] * mask
    rewards = torch.tensor(REWARDS).view(-1, G)
    zero_var = rewards.amax(1) == rewards.amin(1)
    if cfg.kl.mode == "reward":
        rewards = rewards - cfg.kl.coef * kl_tok.sum(1).view(-1, G)
    adv = _hand_advantages(rewards, cfg.algorithm, mask.sum(1).view(-1, G))
    adv = torch.where(zero_var[:, None], 0.0, adv).flatten()
    w = torch.exp(logp - batch.sampler_logp_BT).clamp(max=cfg.correction.cap) * mask
    loss_tok = -adv[:, None] * w
    if cfg.kl.mode == "loss":
        loss_tok = loss_tok + cfg.kl.coef * kl_tok
    loss_tok = loss_tok * mask
    if cfg.aggregation_mode == "token_mean":
        return float(loss_tok.sum() / mask.sum())
    if cfg.aggregation_mode == "seq_mean_token_mean":
        return float((loss_tok.sum(1) / mask.sum(1)).mean())
    return float((loss_tok.sum(1) / cfg.rollout.max_new_tokens).mean())  # Dr. GRPO: a constant, not the length


CASES = {
    "is_weights": {"correction.cap": 1.2, "kl.track": False},
    "kl_in_loss_k3": {"kl.coef": 0.5, "kl.mode": "loss"},
    "kl_in_loss_k2": {"kl.coef": 0.5, "kl.mode": "loss", "kl.estimator": "k2"},
    "kl_in_reward": {"kl.coef": 0.5, "kl.mode": "reward"},
    "dr_grpo_constant": {"algorithm": "dr_grpo", "kl.track": False},
    "reinforce_pp": {"algorithm": "reinforce_pp", "kl.coef": 0.2, "kl.mode": "reward"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_learn_optimises_the_hand_computed_loss(rl_overrides, ref_model_dir, case):
    over = {"kl.ref_path": ref_model_dir, "rollout.max_new_tokens": 12, "optim.lr": 0.0} | CASES[case]
    cfg = load_config(RLConfig, None, rl_overrides(**over))
    run = setup(cfg)
    ro, outcomes = _step_inputs(run)
    expected = _expected_loss(run, ro, cfg)
    m = learn(run, 1, StageTimer(), ro, outcomes, {})
    assert abs(expected) > 1e-4  # a policy term that cancels out would check nothing
    assert m["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert m["groups/zero_variance_frac"] == pytest.approx(1 / 3)


def test_kl_in_reward_leaves_zero_variance_groups_without_advantage(rl_overrides, ref_model_dir):
    """The KL is not a reason for a group with equal task rewards to train: it gets exactly 0."""
    from posttrain.rl.loop import advantages

    cfg = load_config(RLConfig, None, rl_overrides(**{"kl.ref_path": ref_model_dir, "kl.coef": 1.0,
                                                      "kl.mode": "reward"}))
    run = setup(cfg)
    ro, outcomes = _step_inputs(run)
    batch = outcome_batch(ro, outcomes, run.tokenizer.pad_token_id, G)
    batch.old_logp_BT, batch.ref_logp_BT, _ = run.policy.score(batch)
    adv_B, m = advantages(cfg, batch, run.world)
    assert torch.all(adv_B[4:8] == 0) and torch.all(adv_B[:4] != 0)
    assert m["groups/zero_variance_frac"] == pytest.approx(1 / 3)
    assert m["kl/ref_seq_mean"] > 0  # the reference differs, so the KL had something to add


def test_is_weights_correct_against_the_truncated_distribution_sampled(rl_overrides):
    """With top-p the tokens come from the renormalised nucleus: on-policy the weight is the mass
    the nucleus kept, π/π_nucleus, not 1; mismatch metrics still compare the full distributions."""
    cfg = load_config(RLConfig, None, rl_overrides(**{"rollout.top_p": 0.6, "kl.track": False}))
    run = setup(cfg)
    ro = run.engine.generate([run.train_prompts[i] for i in range(3)], G, sampling_params(cfg, 5))
    batch = outcome_batch(ro, [Outcome.model_fail(reward=0.0)] * len(ro), run.tokenizer.pad_token_id, G)
    batch.old_logp_BT, _, _ = run.policy.score(batch)
    weights, m = importance_weights(batch, CorrectionConfig(kind="truncated", cap=2.0))
    mask = batch.train_mask_BT
    kept_mass = torch.exp(batch.sampler_logp_BT - batch.truncated_logp_BT)
    torch.testing.assert_close(weights[mask], kept_mass[mask], rtol=1e-4, atol=1e-5)
    assert float(kept_mass[mask].min()) < 0.9  # the nucleus did cut somewhere
    assert m["mismatch/kl"] < 1e-6 and m["is/ratio_mean"] < 1.0


def test_sampler_trainer_metrics_average_over_the_scored_rows_only(rl_overrides):
    """Rows the trainer did not score carry the sampler's log-probs (a difference of 0): averaged in,
    they would shrink every mismatch and ratio figure by the share of rows left out."""
    cfg = load_config(RLConfig, None, rl_overrides(**{"kl.track": False}))
    run = setup(cfg)
    ro = run.engine.generate([run.train_prompts[i] for i in range(2)], G, sampling_params(cfg, 5))
    batch = outcome_batch(ro, [Outcome.model_fail(reward=0.0)] * len(ro), run.tokenizer.pad_token_id, G)
    batch.score_weight_B = torch.tensor([1.0] * G + [float(G)] + [0.0] * (G - 1))
    scored = batch.score_weight_B > 0
    batch.old_logp_BT = torch.where(scored[:, None], batch.sampler_logp_BT + 0.1, batch.sampler_logp_BT) * batch.mask_BT
    _, m = importance_weights(batch, CorrectionConfig(kind="truncated", cap=2.0))
    assert int(batch.mask_BT[~scored].sum()) > 0  # rows left out that have tokens
    assert m["mismatch/logprob_abs_diff_mean"] == pytest.approx(0.1, rel=1e-4)
    assert m["is/ratio_mean"] == pytest.approx(math.exp(0.1), rel=1e-4)


def test_without_truncation_the_batch_has_one_behaviour_distribution(rl_overrides):
    cfg = load_config(RLConfig, None, rl_overrides(**{"kl.track": False}))
    run = setup(cfg)
    ro = run.engine.generate([run.train_prompts[0]], G, sampling_params(cfg, 5))
    batch = outcome_batch(ro, [Outcome.model_fail(reward=0.0)] * G, run.tokenizer.pad_token_id)
    assert batch.truncated_logp_BT is None and batch.behaviour_logp_BT is batch.sampler_logp_BT


class _NullEngine:
    """Receives weights; async mode's `setup` leaves the engine to the run, so tests bring one."""

    version = 0

    def load_version(self, buckets, version, digest, probe=None, dtype=None):
        self.version = version


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_async_without_decoupled_ppo_clips_around_the_sampler(rl_overrides, algorithm):
    """decoupled_ppo=false: the ratio is formed against the behaviour log-probs for every algorithm
    (PPO once skipped it). Sampler log-probs nudged by δ give ratios e^-δ instead of 1."""
    from posttrain.rollout import TorchEngine

    over = {"mode": "async", "asynchrony.decoupled_ppo": False, "algorithm": algorithm, "kl.track": False,
            "rollout.max_new_tokens": 12}
    cfg = load_config(RLConfig, None, rl_overrides(**over))
    run = setup(cfg)
    run.engine = TorchEngine(cfg.model.path, tokenizer=run.tokenizer)
    ro, outcomes = _step_inputs(run)
    run.engine = _NullEngine()
    m = learn(run, 1, StageTimer(), ro, outcomes, {})
    # the GRPO family leaves the zero-variance group (rows 4-7) out of the backward and its metrics
    trained = range(len(ro)) if algorithm == "ppo" else [i for i in range(len(ro)) if i // G != 1]
    ratios = [math.exp(-d) for i in trained for d in _nudges(i, len(ro.logprobs[i]))]
    assert m["policy/ratio_mean"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-3)


@pytest.mark.parametrize("loss", ["ppo_clip", "pg"])
def test_async_without_decoupled_ppo_pg_keeps_the_importance_weight(rl_overrides, loss):
    """Anchoring on the sampler corrects only a loss with a ratio: `pg` has none, so it keeps the
    truncated weight exp(trainer - sampler); a ratio loss gets no second weight."""
    from posttrain.rl.losses import off_policy_correction
    from posttrain.rollout import TorchEngine

    cap = {"correction.cap": 1.2} if loss == "pg" else {}  # a ratio loss has no weight to cap (refused)
    cfg = load_config(RLConfig, None, rl_overrides(**{"mode": "async", "asynchrony.decoupled_ppo": False,
                                                      "policy_loss": loss, **cap}))
    run = setup(cfg)
    run.engine = TorchEngine(cfg.model.path, tokenizer=run.tokenizer)
    ro, _ = _step_inputs(run)
    batch = outcome_batch(ro, [Outcome.model_fail(reward=r) for r in REWARDS], run.tokenizer.pad_token_id)
    with torch.no_grad():
        batch.old_logp_BT = _plain_logp(run.policy.model, batch, cfg.rollout.temperature) * batch.mask_BT
    anchor, weights, _ = off_policy_correction(batch, cfg)
    if loss == "pg":
        mask = batch.train_mask_BT
        expected = torch.exp(batch.old_logp_BT - batch.sampler_logp_BT).clamp(max=1.2)
        assert anchor is batch.old_logp_BT and weights is not None
        assert torch.allclose(weights[mask], expected[mask], atol=1e-5) and bool((weights[mask] != 1).any())
    else:
        assert anchor is batch.behaviour_logp_BT and weights is None


def _expected_surrogate(run, ro, cfg, anchor_on_sampler: bool):
    """The step's GSPO or CISPO loss from the formulas (grpo advantages, seq_mean_token_mean).

    Sync (and async with decoupled PPO): the ratio's anchor is the trainer's own log-probs (ratio 1)
    and the truncated IS weight vs the sampler multiplies each token. Async without decoupled PPO:
    the anchor is the sampler's (nudged) log-probs and there is no separate weight."""
    batch = outcome_batch(ro, [Outcome.model_fail(reward=r) for r in REWARDS], run.tokenizer.pad_token_id)
    mask = batch.train_mask_BT
    with torch.no_grad():
        logp = _plain_logp(run.policy.model, batch, cfg.rollout.temperature)
    sampler = batch.sampler_logp_BT
    old = sampler if anchor_on_sampler else logp
    w = torch.ones_like(logp) if anchor_on_sampler else torch.exp(logp - sampler).clamp(max=cfg.correction.cap)
    rewards = torch.tensor(REWARDS).view(-1, G)
    zero_var = rewards.amax(1) == rewards.amin(1)
    adv = torch.where(zero_var[:, None], 0.0, _hand_advantages(rewards, "grpo", None)).flatten()[:, None]
    if cfg.policy_loss == "gspo":
        s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))[:, None]
        lo, hi = cfg.gspo_clip_low, cfg.gspo_clip_high
        loss_tok = torch.maximum(-adv * s, -adv * s.clamp(1 - lo, 1 + hi))
    else:
        lo, hi = cfg.cispo_clip_low, cfg.cispo_clip_high
        loss_tok = -torch.exp(logp - old).clamp(1 - lo, 1 + hi) * adv * logp
    loss_tok = loss_tok * w * mask
    return float((loss_tok.sum(1) / mask.sum(1)).mean())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_learn_optimises_the_hand_computed_gspo_and_cispo_loss(rl_overrides, loss, mode):
    """Each new loss through `learn`, on-policy with the sampler correction (sync), and anchored on a
    stale sampler without decoupled PPO (async): the ratio then differs from 1 and is what clips."""
    from posttrain.rollout import TorchEngine

    over = {"policy_loss": loss, "kl.track": False, "rollout.max_new_tokens": 12, "optim.lr": 0.0, "mode": mode,
            "asynchrony.decoupled_ppo": False, **({"correction.cap": 1.2} if mode == "sync" else {})}
    cfg = load_config(RLConfig, None, rl_overrides(**over))
    assert cfg.aggregation_mode == "seq_mean_token_mean"
    run = setup(cfg)
    if mode == "async":
        run.engine = TorchEngine(cfg.model.path, tokenizer=run.tokenizer)
    ro, outcomes = _step_inputs(run)
    if mode == "async":
        run.engine = _NullEngine()
    expected = _expected_surrogate(run, ro, cfg, anchor_on_sampler=mode == "async")
    m = learn(run, 1, StageTimer(), ro, outcomes, {})
    assert abs(expected) > 1e-4
    assert m["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    if mode == "async" and loss == "gspo":  # nudges of 0.4 move sequence ratios past 4e-4: some clip
        assert 0 < m["policy/clip_frac"] < 1


@pytest.mark.parametrize("override, key", [("policy_loss=gpso", "policy_loss"), ("cispo_clip_low=1.5", "cispo_clip_low"),
                                           ("gspo_clip_high=-1e-4", "gspo_clip_high")])
def test_bad_policy_loss_settings_are_refused_by_name(override, key):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=key):
        load_config(RLConfig, None, [override])
