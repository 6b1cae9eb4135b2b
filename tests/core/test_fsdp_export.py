"""FSDP2 under torchrun (2 gloo ranks): each rank holds half of the parameters, gradients and AdamW
state, and exporting the full weights materialises them on rank 0 only; the chunked head's
gradients are the one-process gradients."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).with_name("export_ranks.py")


@pytest.fixture(scope="module")
def ranks(nano_model_dir, tmp_path_factory):
    """export_ranks.py, bucket_ranks.py and head_grad_ranks.py in one launch of 2 ranks: (their JSON
    lines, the weights rank 0 exported, the chunked head's gradients rank 0 saved, the ranks' stderr)."""
    out = tmp_path_factory.mktemp("export") / "exported.safetensors"
    grads = out.with_name("grads.safetensors")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), str(nano_model_dir), str(out), "--buckets", "--head-grads", str(grads)]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")], out, grads, r.stderr


def test_shards_are_halves_and_only_rank0_gets_the_full_weights(nano_model_dir, ranks):
    lines, out = ranks[:2]
    rows = sorted((x for x in lines if "case" not in x), key=lambda x: x["rank"])
    assert [x["rank"] for x in rows] == [0, 1] and all(x["world_size"] == 2 for x in rows)
    total = rows[0]["total"]
    assert total > 100_000
    for x in rows:
        # dim-0 shards: halves up to the rounding of odd first dimensions
        assert x["params"] == pytest.approx(total / 2, rel=0.02), x
        assert x["grads"] == x["params"], x
        assert x["optim_state"] == 2 * x["params"], x  # AdamW: exp_avg and exp_avg_sq per element
    assert sum(x["params"] for x in rows) == total
    assert rows[0]["exported"] == total
    assert rows[1]["exported"] == 0, "only rank 0 may materialise the full weights"
    exported = load_file(str(out))
    original = load_file(str(Path(nano_model_dir) / "model.safetensors"))
    assert exported.keys() == original.keys()
    for k in original:
        torch.testing.assert_close(exported[k], original[k], rtol=0, atol=0, msg=k)


def test_export_buckets_stream_the_whole_gather_from_the_shards(nano_model_dir, ranks):
    # Buckets of 0.05 MB over a sharded model (activation checkpointing on; and with LoRA, merged or
    # the adapter alone): joined they are exactly the whole gather, and no bucket is near the model's size.
    rows = [x for x in ranks[0] if "case" in x]
    main = {x["case"]: x for x in rows if x["rank"] == 0}
    other = {x["case"]: x for x in rows if x["rank"] == 1}
    assert set(main) == {"plain", "lora", "lora-adapter"}
    model_bytes = 4 * sum(t.numel() for t in load_file(str(Path(nano_model_dir) / "model.safetensors")).values())
    for case, x in main.items():
        assert x["same"], case
        if case != "lora-adapter":  # the adapter is smaller than one bucket
            assert x["buckets"] >= 4, x
            assert x["largest"] < model_bytes / 3, (x, model_bytes)
        assert other[case]["buckets"] == x["buckets"] and other[case]["names"] == 0, other[case]


def test_two_ranks_give_the_one_process_head_gradients_without_the_view_warning(nano_model_dir, ranks):
    """The chunked-head path under FSDP2 (the root module returns the final hidden states, the head
    is applied outside it): 2 gloo ranks give the one-process gradients, and torch's warning about a
    root that returns a view is not printed."""
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers
    from tests.core.head_grad_ranks import batch, head_loss

    _, _, grads, stderr = ranks
    assert "returned a view tensor" not in stderr, stderr[-2000:]
    quiet_transformers()
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    head_loss(model, batch(model.config.vocab_size)).backward()
    got = load_file(str(grads))
    assert got.keys() == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert p.grad.abs().max() > 0, name  # every weight is reached, the head's among them
        torch.testing.assert_close(got[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_lora_models_export_merges_without_copying_the_model(nano_model_dir):
    # The weight sync exports a LoRA model every step: the merge must equal peft's merge_and_unload
    # exactly, leave the adapter as it was, and not copy the weights the adapters leave alone.
    import copy

    from posttrain.core.dist import World
    from posttrain.core.fsdp import export_state_dict
    from posttrain.models.hf import LoraConfig, ModelConfig, load_model

    model = load_model(ModelConfig(path=str(nano_model_dir), lora=LoraConfig(enabled=True, r=4, alpha=8)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peft starts B at 0, which would make the merge a no-op
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    adapter = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    got = export_state_dict(model, World())
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0, msg=k)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in adapter.items())
    embed = model.get_input_embeddings().weight
    assert got["model.embed_tokens.weight"].data_ptr() == embed.data_ptr(), "the untouched weights were copied"
