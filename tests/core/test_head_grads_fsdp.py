"""The chunked-head path under FSDP2 (the root module returns the final hidden states, the head is
applied outside it): 2 gloo ranks give the one-process gradients, and torch's warning about a root
that returns a view is not printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.core.head_grad_ranks import batch, head_loss

SCRIPT = Path(__file__).with_name("head_grad_ranks.py")


def test_two_ranks_give_the_one_process_gradients_without_the_view_warning(nano_model_dir, tmp_path):
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers

    out = tmp_path / "grads.safetensors"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(SCRIPT), str(nano_model_dir), str(out)], check=False, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    assert "returned a view tensor" not in r.stderr, r.stderr[-2000:]
    quiet_transformers()
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    head_loss(model, batch(model.config.vocab_size)).backward()
    got = load_file(str(out))
    assert got.keys() == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert p.grad.abs().max() > 0, name  # every weight is reached, the head's among them
        torch.testing.assert_close(got[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
