"""DPO: loss = log 2 at step 0, reference log-probs computed once, learning, IPO, bad input."""

import json
import math
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
def test_dpo_raises_held_out_preference_accuracy_and_margin(nano_model_dir, add_pairs_dir, tmp_path):
    cfg = load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / "run", "num_steps=15",
                                                "eval_every=15", "beta=0.1"))
    summary = run_dpo(cfg, printer=lambda *_: None)
    first, last = rows(tmp_path / "run")[0], rows(tmp_path / "run")[-1]
    assert last["eval/rewards/accuracy"] >= 0.9 and last["eval/rewards/margin"] > 1.0
    assert last["eval/loss"] < first["eval/loss"] - 0.3
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(summary["checkpoint"]) is not None


def test_ipo_and_label_smoothing_run(nano_model_dir, add_pairs_dir, tmp_path):
    for name, extra in (("ipo", ["loss=ipo", "logp_mean=true"]), ("cdpo", ["label_smoothing=0.1"])):
        run_dpo(load_config(DPOConfig, None, dpo_args(nano_model_dir, add_pairs_dir, tmp_path / name, "num_steps=1",
                                                      "data.eval_path=", *extra)), printer=lambda *_: None)
        assert math.isfinite(rows(tmp_path / name)[-1]["loss"])


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
