"""Run under torchrun: the gradients of the chunked-head loss (the model's forward returns its final
hidden states, `hidden_head`; the head is applied outside it, `head_token_logprobs`) on a model
sharded with `shard_model`, gathered whole, saved by rank 0.

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/core/head_grad_ranks.py MODEL OUT``

Every rank takes the same batch, so FSDP's averaged gradients are the one-process gradients.
"""

from __future__ import annotations

import os
import sys

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def head_loss(model, ids: torch.Tensor) -> torch.Tensor:
    from posttrain.algos.head import head_of, head_token_logprobs, hidden_head

    with hidden_head(model):
        hidden = model(input_ids=ids[:, :-1]).logits
    return -head_token_logprobs(hidden, *head_of(model), ids[:, 1:], chunk_rows=7).mean()


def batch(vocab_size: int) -> torch.Tensor:
    return torch.randint(3, vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))


def main(model_dir: str, out: str) -> None:
    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import shard_model
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers

    quiet_transformers()
    world = init_world("cpu")
    model = shard_model(load_model(ModelConfig(path=model_dir)), world)
    head_loss(model, batch(model.config.vocab_size)).backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # collective: every rank
    if world.main:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in grads.items()}, out)
    world.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:3])
    from posttrain.core.dist import exit_rank

    exit_rank(0)
