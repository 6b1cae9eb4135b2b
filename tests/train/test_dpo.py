"""DPO: loss = log 2 at step 0 (dropout off), reference log-probs computed once, hand-worked losses
through the trainer, IPO's averaged log-ratios, learning, the checkpoint is the policy, bad input."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.train import dpo
from posttrain.train.dpo import DPOConfig, run_dpo


@pytest.fixture(scope="module")
def add_pairs_dir(tmp_path_factory):
    from posttrain.tasks.arithmetic import write_arithmetic

    out = tmp_path_factory.mktemp("dpo_pairs")
    write_arithmetic(out, digits=2, ops="+", n_train=40, n_eval=30, seed=1)
    return out


def dpo_args(model_dir, data_dir, out, *extra):
    return [f"model.path={model_dir}", f"data.path={data_dir / 'pairs_train.jsonl'}",
            f"data.eval_path={data_dir / 'pairs_eval.jsonl'}", "batch_pairs=8", "micro_batch_pairs=8",
            "optim.lr=1e-3", "optim.warmup_steps=0", "logging.progress=false", "data.use_chat_template=false",
            f"out_dir={out}", *extra]


def rows(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def capture_policy(monkeypatch) -> list:
    """Make `run_dpo` keep the policy it trains (the trainable model it loads) for inspection."""
    policies, real_load = [], dpo.load_model

    def load(cfg, trainable=True, **kw):
        model = real_load(cfg, trainable=trainable, **kw)
        if trainable:
            policies.append(model)
        return model

    monkeypatch.setattr(dpo, "load_model", load)
    return policies


def merged_state_dict(model) -> dict:
    """The reference full-model weights: peft's own merge on a copy (LoRA merged, the adapter untouched)."""
    from posttrain.models.hf import is_lora

    if not is_lora(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    import copy

    return {k: v.detach() for k, v in copy.deepcopy(model).merge_and_unload().state_dict().items()}


def assert_checkpoint_is_policy(ckpt, policy, start_dir):
    """The saved folder reloads as the trained policy (weights and logits), not as the start."""
    from transformers import AutoModelForCausalLM

    from posttrain.models.hf import load_tokenizer

    saved = AutoModelForCausalLM.from_pretrained(ckpt)
    got, want = saved.state_dict(), merged_state_dict(policy)
    start = AutoModelForCausalLM.from_pretrained(start_dir).state_dict()
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6, msg=key)
    assert any(not torch.equal(want[k], start[k]) for k in want), "training did not move the weights"
    # Logits against the policy's own forward (a LoRA policy unmerged), so a bad merge shows too.
    ids = torch.tensor([load_tokenizer(str(start_dir))("Solve: 12 + 34\nAnswer: 46")["input_ids"]])
    policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(saved(input_ids=ids).logits, policy(input_ids=ids).logits, rtol=0, atol=1e-4)


def test_loss_is_log2_at_step_0_and_reference_is_scored_once(nano_model_dir, add_pairs_dir, tmp_path, monkeypatch):
    # A separate reference folder, so its forward passes can be counted apart from the policy's.
    calls = []
    real_load = dpo.load_model

    def counting_load(cfg, trainable=True, **kw):
        model = real_load(cfg, trainable=trainable, **kw)
        if not trainable:
            model.register_forward_hook(lambda *_: calls.append(1))
        return model

    monkeypatch.setattr(dpo, "load_model", counting_load)
    cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "run", "num_steps=2",
                                                f"ref_path={nano_model_dir}", "eval_every=0"))
    run_dpo(cfg, printer=lambda *_: None)
    n_train = sum(1 for _ in (add_pairs_dir / "pairs_train.jsonl").open())
    n_eval = sum(1 for _ in (add_pairs_dir / "pairs_eval.jsonl").open())
    assert len(calls) == math.ceil(n_train / 8) + math.ceil(n_eval / 8), "reference scored more than once"
    r = rows(tmp_path / "run")
    assert r[0]["step"] == 0 and r[0]["eval/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert r[1]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert r[1]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracy", "logps/chosen", "logps/rejected",
                "eval/rewards/accuracy", "eval/rewards/margin", "time/step_s", "time/update_s"):
        assert key in r[-1]


@pytest.mark.slow
def test_dpo_raises_held_out_preference_accuracy_and_margin(nano_model_dir, add_pairs_dir, tmp_path, monkeypatch):
    policies = capture_policy(monkeypatch)
    cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "run", "num_steps=15",
                                                "eval_every=15", "beta=0.1"))
    summary = run_dpo(cfg, printer=lambda *_: None)
    first, last = rows(tmp_path / "run")[0], rows(tmp_path / "run")[-1]
    assert last["eval/rewards/accuracy"] >= 0.9 and last["eval/rewards/margin"] > 1.0
    assert last["eval/loss"] < first["eval/loss"] - 0.3
    assert_checkpoint_is_policy(summary["checkpoint"], policies[0], nano_model_dir)


def test_checkpoint_is_the_trained_lora_policy(nano_model_dir, add_pairs_dir, tmp_path, monkeypatch):
    policies = capture_policy(monkeypatch)
    cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "run", "num_steps=2",
                                                "data.eval_path=", "model.lora.enabled=true"))
    summary = run_dpo(cfg, printer=lambda *_: None)
    assert_checkpoint_is_policy(summary["checkpoint"], policies[0], nano_model_dir)


def test_dropout_is_off_so_the_first_loss_is_log2(nano_model_dir, add_pairs_dir, tmp_path, monkeypatch):
    # Attention dropout in the model's config (as many checkpoints have) plus LoRA dropout. The reference
    # is scored in eval mode, the policy in train mode; LoRA's B = 0 at init hides LoRA's own dropout at
    # step 1, so it is the model's dropout that would move the loss off log 2 (by ~2e-3). A separate
    # reference model, so that turning dropout off in the reference alone does not pass.
    model_dir = tmp_path / "model"
    shutil.copytree(nano_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"attention_dropout": 0.1}))
    policies = capture_policy(monkeypatch)
    cfg = load_config(DPOConfig, None, dpo_args(model_dir, add_pairs_dir, tmp_path / "run", "num_steps=1",
                                                "data.eval_path=", "model.lora.enabled=true",
                                                "model.lora.dropout=0.1", f"ref_path={model_dir}"))
    run_dpo(cfg, printer=lambda *_: None)
    step1 = next(r for r in rows(tmp_path / "run") if r["step"] == 1)
    assert step1["loss"] == pytest.approx(math.log(2), abs=1e-6)
    dropouts = [m for m in policies[0].modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)  # LoRA's too, for the steps after the first


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# Through the trainer's pair_loss on real pairs, with a reference set so that every pair has chosen
# log-ratio 1.5 and rejected −1, i.e. h = 2.5. Also fixes which reduction (mean or sum) each config
# scores replies with: the reference is built with the expected one, so the other gives another h.
@pytest.mark.parametrize("extra,mean,want", [
    (["beta=0.5"], False, -math.log(sigmoid(1.25))),
    (["beta=0.5", "label_smoothing=0.2"], False, -0.8 * math.log(sigmoid(1.25)) - 0.2 * math.log(sigmoid(-1.25))),
    (["beta=0.5", "logp_mean=true"], True, -math.log(sigmoid(1.25))),
    (["loss=ipo", "beta=0.25"], True, (2.5 - 2) ** 2),  # IPO averages by default
    (["loss=ipo", "beta=0.25", "logp_mean=false"], False, (2.5 - 2) ** 2),
])
def test_pair_loss_hand_worked(nano_model_dir, add_pairs_dir, tmp_path, extra, mean, want):
    from posttrain.data.preference import collate_pairs, load_tokenized_pairs
    from posttrain.models.hf import load_model, load_tokenizer

    cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path, *extra))
    tok = load_tokenizer(cfg.model.path)
    pairs = load_tokenized_pairs(cfg.data, tok, cfg.data.path)[:3]
    batch = collate_pairs(pairs, [2, 0], tok.pad_token_id)  # out of order: ref rows go by pair index
    model = load_model(cfg.model).eval()
    with torch.no_grad():
        logps = dpo.sequence_logps(model, batch, mean=mean)
        chosen, rejected = logps[:2], logps[2:]
        ref_N2 = torch.full((3, 2), 100.0)  # pair 1 is not in the batch
        ref_N2[batch.pair_idx_B] = torch.stack([chosen - 1.5, rejected + 1.0], dim=1)
        loss_B, metrics = dpo.pair_loss(cfg, model, batch, ref_N2)
    torch.testing.assert_close(loss_B, torch.full((2,), want), rtol=0, atol=1e-5)
    assert metrics["logps/chosen"].item() == pytest.approx(chosen.mean().item(), abs=1e-5)


def test_logp_mean_must_be_true_false_or_auto(nano_model_dir, add_pairs_dir, tmp_path, capsys):
    assert main(["dpo", *dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "out"), "logp_mean=maybe"]) == 2
    assert "logp_mean: must be true, false or auto" in capsys.readouterr().err


def test_ipo_loss_at_step_0_is_inverse_two_beta_squared(nano_model_dir, add_pairs_dir, tmp_path):
    run_dpo(load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "ipo", "num_steps=1",
                                                  "loss=ipo", "beta=0.5")), printer=lambda *_: None)
    assert rows(tmp_path / "ipo")[0]["eval/loss"] == pytest.approx((1 / (2 * 0.5)) ** 2, abs=1e-5)


@pytest.mark.parametrize("override,needle", [
    ("loss=hinge", "loss: must be one of sigmoid, ipo"),
    ("label_smoothing=0.7", "label_smoothing: must be in [0, 0.5)"),
    ("beta=0", "beta: must be > 0"),
    ("ref_path=/nonexistent/ref", "ref_path=/nonexistent/ref: model folder does not exist"),
])
def test_bad_config_exit_2_nothing_written(nano_model_dir, add_pairs_dir, tmp_path, capsys, override, needle):
    assert main(["dpo", *dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "out"), override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_sequence_logps_sum_only_reply_tokens(nano_model_dir):
    from posttrain.algos import token_logprobs
    from posttrain.data.preference import collate_pairs, tokenize_pairs
    from posttrain.data.records import PreferenceExample
    from posttrain.models.hf import ModelConfig, load_model, load_tokenizer

    tok = load_tokenizer(str(nano_model_dir))
    model = load_model(ModelConfig(path=str(nano_model_dir)), trainable=False)
    pairs, _ = tokenize_pairs([PreferenceExample("Solve: 1 + 2", "Answer: 3", "Answer: 30 or so")], tok,
                              max_len=64, use_chat_template=True)
    batch = collate_pairs(pairs, [0], tok.pad_token_id)
    got = dpo.sequence_logps(model, batch)
    ids = torch.tensor([pairs[0].chosen_ids])
    logp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0]
    want = sum(float(lp) for lp, m in zip(logp, pairs[0].chosen_mask[1:]) if m)
    assert float(got[0]) == pytest.approx(want, abs=1e-4)
    n_reply = sum(pairs[0].chosen_mask[1:])  # the mean is over reply tokens only, not the prompt
    assert float(dpo.sequence_logps(model, batch, mean=True)[0]) == pytest.approx(want / n_reply, abs=1e-5)


def test_the_chunked_head_takes_the_steps_full_logits_take(nano_model_dir, add_pairs_dir, tmp_path, monkeypatch):
    """The default (hidden states out of the forward, the head in chunks) against the model's own
    logits, for the reference table and the policy: the same reference log-probs, losses, gradient
    norms and weights over three steps of two micro-batches each."""
    from posttrain.core.trainer import TrainCore
    from posttrain.data.preference import load_tokenized_pairs
    from posttrain.models.hf import load_model, load_tokenizer
    from posttrain.train.pairwise import PairwiseRun, train_step

    head_calls = []
    original = dpo.head_token_logprobs
    monkeypatch.setattr(dpo, "head_token_logprobs", lambda *a, **k: head_calls.append(1) or original(*a, **k))
    runs = []
    for chunked in (False, True):
        cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path, "beta=0.5",
                                                    "micro_batch_pairs=2", f"chunked_head={chunked}"))
        tok = load_tokenizer(cfg.model.path)
        pairs = load_tokenized_pairs(cfg.data, tok, cfg.data.path)[:12]
        model = load_model(cfg.model)
        ref_N2 = dpo.reference_logps(model, pairs, batch_pairs=4, pad_id=tok.pad_token_id, mean=False,
                                     chunked=chunked)
        opt = torch.optim.SGD(model.parameters(), lr=0.005)
        core = TrainCore(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0), grad_clip=0)
        run = PairwiseRun(cfg=cfg, model=model, tokenizer=tok, train=pairs, name="dpo", eval_fn=dict,
                          loss_fn=lambda b, cfg=cfg, model=model, ref=ref_N2: dpo.pair_loss(cfg, model, b, ref))
        runs.append((ref_N2, [train_step(run, core, list(range(4 * s, 4 * s + 4))) for s in range(3)], model))
        assert bool(head_calls) == chunked
    (full_ref, full_steps, full_model), (ref, steps, model) = runs
    torch.testing.assert_close(ref, full_ref, atol=1e-5, rtol=0)
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # the policy is the reference at step 1
    for got, want in zip(steps, full_steps):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert steps[-1]["loss"] < steps[0]["loss"]  # the steps moved the policy
    for (name, p), q in zip(full_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
