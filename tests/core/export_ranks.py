"""Run under torchrun: shard a model with `shard_model`, take one AdamW step, export its weights.

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/core/export_ranks.py MODEL OUT [--buckets] [--head-grads GRADS]``

Each rank prints one JSON line: its rank, the parameter count of the whole model, the elements of
parameters / gradients / optimizer state it holds locally (its shards), and the number of elements
`export_state_dict` handed it. Rank 0 also saves what it got to ``OUT`` (safetensors). With
``--buckets``, the same ranks then run bucket_ranks.py's cases (its lines carry a "case"); with
``--head-grads GRADS``, head_grad_ranks.py's gradients go to GRADS: one launch for all, as a
launch's imports cost more than any of them.
"""

from __future__ import annotations

import json
import os
import sys

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def local_numel(t) -> int:
    return (t.to_local() if hasattr(t, "to_local") else t).numel()


def main(model_dir: str, out: str) -> None:
    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import export_state_dict, shard_model
    from posttrain.core.optim import OptimConfig, build_optimizer
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers

    quiet_transformers()
    world = init_world("cpu")
    torch.manual_seed(0)
    model = load_model(ModelConfig(path=model_dir))
    total = sum(p.numel() for p in model.parameters())
    model = shard_model(model, world)
    optimizer = build_optimizer(model.parameters(), OptimConfig(lr=0.0, warmup_steps=0))
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = sum(local_numel(p.grad) for p in model.parameters() if p.grad is not None)
    optimizer.step()  # lr 0: the weights stay those of MODEL, so the export can be compared to it
    optim_state = sum(local_numel(v) for s in optimizer.state.values() for v in s.values()
                      if isinstance(v, torch.Tensor) and v.dim() > 0)
    weights = export_state_dict(model, world)
    exported = sum(v.numel() for v in weights.values())
    if world.main:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, out)
    row = {"rank": world.rank, "world_size": world.world_size, "total": total,
           "params": sum(local_numel(p) for p in model.parameters()), "grads": grads,
           "optim_state": optim_state, "exported": exported}
    for rank in range(world.world_size):  # one rank at a time: the lines of two ranks can interleave
        if rank == world.rank:
            print(json.dumps(row), flush=True)
        world.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:3])
    if "--buckets" in sys.argv[3:]:
        import bucket_ranks  # beside this file, on sys.path as the script's folder

        bucket_ranks.main(sys.argv[1])
    if "--head-grads" in sys.argv[3:]:
        import head_grad_ranks

        head_grad_ranks.main(sys.argv[1], sys.argv[sys.argv.index("--head-grads") + 1])
    from posttrain.core.dist import exit_rank

    exit_rank(0)  # as `python -m posttrain` leaves a rank: gloo threads must not abort it at exit
