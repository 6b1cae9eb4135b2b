"""Packed forwards: a micro-batch's rows end to end in one sequence, attention inside each row,
give the padded forward's log-probs and gradients for every family the engine runs (sliding
windows included, with rows longer than the window, also under peft's and FSDP2's wrappers), and
the policy takes the same steps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain.models import tiny
from posttrain.models.hf import LoraConfig, ModelConfig, load_model
from posttrain.rl import policy as policy_module
from posttrain.rl.batch import build_batch
from posttrain.rl.packed import install, packed_logits, packed_tokens, packs
from posttrain.rl.shared_prefix import TargetLogits
from posttrain.rollout import Rollouts, SamplingParams
from tests.rl.test_policy_forward import _batch, _policy, assert_same_steps


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {arch: tiny.build_tiny(root / arch, "nano", seed=0, arch=arch) for arch in tiny.ARCHS}


def _ragged(vocab: int, lengths=(150, 3, 71, 9, 1, 40)):
    """One row per prompt (nothing shared), prompts of 2-7 tokens, completions of ``lengths``:
    rows of 150 and 71 tokens pass the tiny models' 64-token sliding window."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, vocab, (2 + i,), generator=g).tolist() for i in range(len(lengths))]
    comps = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in lengths]
    ro = Rollouts(prompt_idx=list(range(len(lengths))), prompt_ids=prompts, completion_ids=comps,
                  logprobs=[[-1.0] * len(c) for c in comps], finish_reason=["length"] * len(comps),
                  policy_version=[0] * len(comps), sampling=SamplingParams())
    return build_batch(ro, [1.0] * len(comps), [True] * len(comps), pad_id=0)


def _logp(t: TargetLogits) -> torch.Tensor:
    return t.place(t.logits_BXV.float().log_softmax(-1).gather(-1, t.targets_BX[..., None]).squeeze(-1))


def padded_and_packed_logp(model, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """``mb``'s target log-probs from the padded forward and, after `install`, the packed one."""
    with torch.no_grad():
        out = model(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT, position_ids=mb.position_ids_BT())
        padded = _logp(TargetLogits.full(out.logits[:, :-1], mb.input_ids_BT[:, 1:]))
        assert install(model) and packs(model)
        return padded, _logp(packed_logits(model, mb, torch.device("cpu")))


def _logp_and_grads(model, t: TargetLogits, mb):
    logp = _logp(t)
    model.zero_grad()
    (logp * mb.mask_BT).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("arch", [a for a in tiny.ARCHS if a != "gemma2"])
def test_packed_rows_give_the_padded_forward(family_dirs, arch):
    model = load_model(ModelConfig(path=str(family_dirs[arch])))
    mb = _ragged(model.config.get_text_config().vocab_size)

    def padded():
        out = model(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT, position_ids=mb.position_ids_BT())
        return _logp_and_grads(model, TargetLogits.full(out.logits[:, :-1], mb.input_ids_BT[:, 1:]), mb)

    padded_logp, padded_grads = padded()  # the model's own attention
    assert install(model) and packs(model)
    again_logp, _ = padded()  # after install a call without packed rows is the model's own attention
    assert torch.equal(again_logp, padded_logp)
    positions = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: positions.append(args[0].shape))
    packed = packed_logits(model, mb, torch.device("cpu"))
    real = mb.attention_mask_BT.sum(1)
    assert positions == [(1, int((real - 1).sum()))] == [(1, packed_tokens(mb))]  # no padding, no last tokens
    packed_logp, packed_grads = _logp_and_grads(model, packed, mb)
    assert packed_logp.shape == mb.mask_BT.shape
    torch.testing.assert_close(packed_logp[mb.mask_BT], padded_logp[mb.mask_BT], atol=1e-5, rtol=1e-5)
    for a, b in zip(padded_grads, packed_grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_a_lora_model_packs_with_its_sliding_window(family_dirs):
    # peft's model class lives in peft, not in the modeling module that builds Mistral's sliding masks
    model = load_model(ModelConfig(path=str(family_dirs["mistral"]), lora=LoraConfig(enabled=True, r=4)))
    mb = _ragged(model.config.get_text_config().vocab_size)
    padded, packed = padded_and_packed_logp(model, mb)
    torch.testing.assert_close(packed[mb.mask_BT], padded[mb.mask_BT], atol=1e-5, rtol=1e-5)


def test_fsdp_ranks_pack_with_the_sliding_window(family_dirs):
    # FSDP2 swaps each sharded module's class for a subclass defined in torch; with LoRA, around peft's
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).with_name("packed_ranks.py")), str(family_dirs["mistral"])]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert sorted((x["case"], x["rank"]) for x in rows) == [("lora", 0), ("lora", 1), ("plain", 0), ("plain", 1)]
    for x in rows:
        assert x["sharded"] and x["max_abs_diff"] < 1e-5, x


def test_soft_capped_attention_and_broken_rows_keep_the_padded_forward(family_dirs):
    gemma2 = load_model(ModelConfig(path=str(family_dirs["gemma2"])))
    assert not install(gemma2) and not packs(gemma2)
    mb = _ragged(100)
    assert packed_tokens(mb) == int((mb.attention_mask_BT.sum(1) - 1).sum())
    mb.attention_mask_BT[0, int(mb.attention_mask_BT[0].int().argmax()) + 2] = 0  # a hole in row 0
    assert packed_tokens(mb) is None


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_policy_takes_the_steps_the_padded_forward_takes(nano_model_dir, checkpointing, monkeypatch):
    monkeypatch.setattr(policy_module, "completion_logits", lambda *a, **k: None)  # no shared prompts: pack or pad
    padded, _ = _policy(nano_model_dir, reuse=True, checkpointing=checkpointing, pack_rows=False)
    packed, _ = _policy(nano_model_dir, reuse=True, checkpointing=checkpointing)
    runs = []
    original = policy_module.packed_logits
    monkeypatch.setattr(policy_module, "packed_logits", lambda *a, **k: runs.append(1) or original(*a, **k))
    assert_same_steps(padded, packed)
    assert runs


def test_shared_prompts_or_packing_whichever_runs_fewer_positions(nano_model_dir):
    policy, _ = _policy(nano_model_dir, reuse=False)
    positions = []
    policy.model.model.embed_tokens.register_forward_hook(lambda m, args, out: positions.append(args[0].numel()))
    # two prompts of 3 and 6 tokens, G=4, completions of 1-6 tokens: sharing runs 2 x 6 + 8 x 5 = 52
    # positions, packing the 8 rows 57
    policy._target_logits(policy.model, _batch())
    assert positions == [12, 40]
    # one 40-token completion among 1-token ones: sharing pads every row to it (12 + 8 x 39), packing does not
    positions.clear()
    policy._target_logits(policy.model, _batch(lengths=(40, 1, 1, 1, 1, 1, 1, 1)))
    assert positions == [int((_batch(lengths=(40, 1, 1, 1, 1, 1, 1, 1)).attention_mask_BT.sum(1) - 1).sum())]
