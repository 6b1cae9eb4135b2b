"""PPO with a critic: token rewards and GAE by hand, four roles wired, frozen models, critic learns, resume."""

import json
from pathlib import Path

import pytest
import torch

from posttrain.algos import gae
from posttrain.cli import main
from posttrain.config import load_config
from posttrain.rl.batch import RLBatch
from posttrain.rl.config import RLConfig
from posttrain.rl.ppo import ppo_targets, token_rewards


def tiny_batch(rewards, mask, old=None, ref=None):
    mask = torch.tensor(mask, dtype=torch.bool)
    n, t = mask.shape
    return RLBatch(input_ids_BT=torch.zeros(n, t + 1, dtype=torch.long), attention_mask_BT=torch.ones(n, t + 1),
                   mask_BT=mask, sampler_logp_BT=torch.zeros(n, t), prompt_idx_B=torch.arange(n),
                   rewards_B=torch.tensor(rewards), valid_B=torch.ones(n, dtype=torch.bool),
                   policy_version_B=torch.zeros(n, dtype=torch.long),
                   old_logp_BT=None if old is None else torch.tensor(old),
                   ref_logp_BT=None if ref is None else torch.tensor(ref))


def cfg_with(*overrides):
    return load_config(RLConfig, None, ["algorithm=ppo", "model.path=x", "data.path=x", *overrides])


def test_token_rewards_by_hand():
    # Row 0: completion tokens at columns 1..2; row 1: column 0 only. KL k1 = old - ref.
    batch = tiny_batch([1.0, -2.0], [[0, 1, 1], [1, 0, 0]],
                       old=[[0.0, -1.0, -2.0], [-0.5, 0.0, 0.0]], ref=[[0.0, -1.5, -1.0], [-0.5, 0.0, 0.0]])
    cfg = cfg_with("kl.coef=0.1", "kl.mode=reward", "kl.estimator=k1")
    r, m = token_rewards(cfg, batch)
    # row 0: kl = [0, 0.5, -1.0] -> -0.1*kl = [0, -0.05, 0.1]; +1.0 on the last token
    torch.testing.assert_close(r, torch.tensor([[0.0, -0.05, 1.1], [-2.0, 0.0, 0.0]]))
    assert m["kl/from_start"] == pytest.approx((-0.5 + 0.0) / 2)
    assert m["kl/ref"] == pytest.approx(-0.5 / 3)


def test_gae_gamma_lambda_one_zero_values_is_reward_to_go_of_token_rewards():
    batch = tiny_batch([1.0, 3.0], [[1, 1, 1, 0], [0, 1, 1, 1]],
                       old=[[-1.0, -2.0, -0.5, 0.0], [0.0, -1.0, -1.0, -1.0]],
                       ref=[[-1.5, -1.0, -0.5, 0.0], [0.0, -2.0, -1.0, -0.5]])
    cfg = cfg_with("kl.coef=0.2", "kl.mode=reward", "kl.estimator=k1", "critic.gamma=1.0", "critic.lam=1.0",
                   "critic.whiten_advantages=false")
    targets, _ = ppo_targets(cfg, batch, torch.zeros(2, 4))
    r, _ = token_rewards(cfg, batch)
    mask = batch.train_mask_BT
    to_go = torch.stack([torch.tensor([float((r[b, t:] * mask[b, t:]).sum()) if mask[b, t] else 0.0
                                       for t in range(4)]) for b in range(2)])
    torch.testing.assert_close(targets.adv_BT, to_go)
    torch.testing.assert_close(targets.returns_BT, to_go)


def test_ppo_targets_use_algos_gae_and_whiten_over_tokens():
    batch = tiny_batch([1.0, 0.0], [[1, 1, 0], [1, 1, 1]])
    values = torch.tensor([[0.5, 0.2, 0.0], [0.1, -0.3, 0.4]])
    cfg = cfg_with("critic.gamma=0.9", "critic.lam=0.8")
    targets, m = ppo_targets(cfg, batch, values)
    raw, ret = gae(token_rewards(cfg, batch)[0], values, batch.train_mask_BT, 0.9, 0.8)
    torch.testing.assert_close(targets.returns_BT, ret)
    sel = batch.train_mask_BT
    torch.testing.assert_close(targets.adv_BT[sel], (raw[sel] - raw[sel].mean()) / (raw[sel].std(unbiased=False) + 1e-8))
    assert "critic/explained_variance" in m


@pytest.fixture
def rm_dir(nano_model_dir, tmp_path):
    """A reward-model checkpoint (an untrained head on the nano model is enough for wiring)."""
    from posttrain.models.heads import load_reward_model
    from posttrain.models.hf import ModelConfig, load_tokenizer

    torch.manual_seed(1)
    rm = load_reward_model(ModelConfig(path=str(nano_model_dir)))
    rm.save_pretrained(tmp_path / "rm")
    load_tokenizer(str(nano_model_dir)).save_pretrained(tmp_path / "rm")
    return tmp_path / "rm"


def ppo_overrides(rl_overrides, rm_dir, **extra):
    base = {"algorithm": "ppo", "reward_model.path": rm_dir, "kl.coef": 0.05, "kl.mode": "reward",
            "kl.estimator": "k1", "rollout.group_size": 2, "ppo_epochs": 2, "mini_batches": 2,
            "critic.optim.lr": 3e-3}
    return rl_overrides(**(base | extra))


def metrics_of(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_ppo_smoke_four_roles_frozen_models_and_metrics(rl_overrides, rm_dir, tmp_path):
    from posttrain.rl.loop import setup

    cfg = load_config(RLConfig, None, ppo_overrides(rl_overrides, rm_dir))
    run = setup(cfg)
    trainable = {id(p) for g in run.policy.optimizer.param_groups for p in g["params"]}
    trainable |= {id(p) for g in run.ppo.critic.optimizer.param_groups for p in g["params"]}
    for frozen in (run.policy.ref_model, run.ppo.reward_model):
        assert not any(p.requires_grad for p in frozen.parameters())
        assert not any(id(p) in trainable for p in frozen.parameters())
    assert run.ppo.critic.model is not run.policy.model
    from posttrain.rl.run import run_rl

    run_rl(cfg, printer=lambda *_: None)
    last = metrics_of(tmp_path / "run")[-1]
    for key in ("reward/gold", "reward/proxy", "reward/mean", "kl/from_start", "kl/ref", "critic/loss",
                "critic/explained_variance", "critic/vf_clip_frac", "policy/clip_frac", "entropy",
                "time/values_s", "time/update_s", "time/step_s", "groups/zero_variance_frac"):
        assert key in last, key
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    assert (ckpt / "dcp").is_dir() and (ckpt / "critic" / "config.json").is_file()  # critic state sharded with the policy
    from transformers import AutoModelForTokenClassification

    assert AutoModelForTokenClassification.from_pretrained(ckpt / "critic").score.out_features == 1


def test_critic_loss_falls_on_a_fixed_batch(rl_overrides, rm_dir):
    """Repeated updates on one step's rollouts: the critic fits the GAE returns (policy held still)."""
    from posttrain.rl.batch import build_batch
    from posttrain.rl.loop import collect, setup
    from posttrain.rl.ppo import combine_rewards, ppo_update

    cfg = load_config(RLConfig, None, ppo_overrides(rl_overrides, rm_dir, **{
        "optim.lr": 0.0, "critic.value_clip": 0.0, "reward_model.weight": 5.0, "ppo_epochs": 1, "mini_batches": 1}))
    run = setup(cfg)
    ro, outcomes, _, _ = collect(run, 1)
    batch = build_batch(ro, [o.reward for o in outcomes], [o.is_reward for o in outcomes], run.tokenizer.pad_token_id)
    combine_rewards(run, batch)
    batch.old_logp_BT, batch.ref_logp_BT, _ = run.policy.score(batch)
    targets, _ = ppo_targets(cfg, batch, run.ppo.critic.values(batch, cfg.micro_batch_tokens))
    losses = [ppo_update(run, batch, targets, seed=i)["critic/loss"] for i in range(12)]
    assert losses[-1] < 0.3 * losses[0], losses


def test_ppo_resume_restores_the_critic(rl_overrides, rm_dir, tmp_path):
    from posttrain.rl.run import run_rl

    straight = ppo_overrides(rl_overrides, rm_dir, num_steps=2, save_every=1, out_dir=tmp_path / "a")
    run_rl(load_config(RLConfig, None, straight), printer=lambda *_: None)
    first = ppo_overrides(rl_overrides, rm_dir, num_steps=1, save_every=1, out_dir=tmp_path / "b")
    run_rl(load_config(RLConfig, None, first), printer=lambda *_: None)
    resumed = ppo_overrides(rl_overrides, rm_dir, num_steps=2, save_every=1, out_dir=tmp_path / "b")
    run_rl(load_config(RLConfig, None, resumed), printer=lambda *_: None)
    a, b = metrics_of(tmp_path / "a")[-1], metrics_of(tmp_path / "b")[-1]
    assert b["step"] == 2
    for key in ("critic/loss", "reward/proxy", "loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("override,needle", [
    ("reward_model.path=/nonexistent/rm", "reward_model.path=/nonexistent/rm: model folder does not exist"),
    ("critic.gamma=1.5", "critic.gamma: must be in [0, 1]"),
    ("critic.path=/nonexistent/critic", "critic.path=/nonexistent/critic: model folder does not exist"),
])
def test_bad_input_exit_2_nothing_written(rl_overrides, rm_dir, tmp_path, capsys, override, needle):
    assert main(["rl", *ppo_overrides(rl_overrides, rm_dir), override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_reward_model_needs_ppo(rl_overrides, rm_dir, capsys):
    assert main(["rl", *rl_overrides(**{"reward_model.path": rm_dir})]) == 2
    assert "reward_model.path: a reward model is used by algorithm=ppo only" in capsys.readouterr().err


def test_ppo_extremes_are_the_steps_whatever_the_micro_batching(rl_overrides, rm_dir):
    """``policy/ratio_max`` over PPO's updates (2 epochs x 2 mini-batches, the later ones off-policy)
    is the largest ratio of the step at one micro-batch per update as at many; a token-weighted sum
    of the micro-batches' maxima, averaged over the updates, shrinks with the micro-batches."""
    from posttrain.rl.batch import build_batch
    from posttrain.rl.loop import collect, setup
    from posttrain.rl.ppo import combine_rewards, ppo_update

    out = []
    for micro_batch_tokens in (8192, 16):
        cfg = load_config(RLConfig, None, ppo_overrides(rl_overrides, rm_dir, micro_batch_tokens=micro_batch_tokens,
                                                        **{"optim.lr": 1e-2, "reward_model.weight": 5.0}))
        run = setup(cfg)
        ro, outcomes, _, _ = collect(run, 1)
        batch = build_batch(ro, [o.reward for o in outcomes], [o.is_reward for o in outcomes],
                            run.tokenizer.pad_token_id)
        combine_rewards(run, batch)
        batch.old_logp_BT, batch.ref_logp_BT, _ = run.policy.score(batch)
        targets, _ = ppo_targets(cfg, batch, run.ppo.critic.values(batch, cfg.micro_batch_tokens))
        out.append(ppo_update(run, batch, targets, seed=0))
    assert out[0]["policy/ratio_max"] > 1.0 + 1e-3  # the later updates moved the ratios
    for k in [k for k in out[0] if k.endswith("_max")]:
        assert out[1][k] == pytest.approx(out[0][k], rel=1e-5), k
