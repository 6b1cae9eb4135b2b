"""Run under torchrun: shard a model (plain with activation checkpointing, and with LoRA) and compare
`export_buckets` with the whole gather (`full_state_dict`, merged the way `export_state_dict`
merges a gathered dict).

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/core/bucket_ranks.py MODEL``

Each rank prints one JSON line per case: how many buckets it iterated, the largest bucket's bytes,
and on rank 0 whether the joined buckets equal the reference exactly (names and values).
"""

from __future__ import annotations

import json
import os
import sys

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

BUCKET_MB = 0.05


def main(model_dir: str) -> None:
    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import export_buckets, export_state_dict, full_state_dict, shard_model
    from posttrain.models.hf import LoraConfig, ModelConfig, load_model, quiet_transformers

    quiet_transformers()
    world = init_world("cpu")
    rows = []
    for case, cfg in [("plain", ModelConfig(path=model_dir, activation_checkpointing=True)),
                      ("lora", ModelConfig(path=model_dir, lora=LoraConfig(enabled=True, r=4)))]:
        torch.manual_seed(0)
        model = load_model(cfg)
        if case == "lora":  # B starts at zero: give it values so the merge shows
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.1)
        model = shard_model(model, world, activation_checkpointing=cfg.activation_checkpointing)
        raw = full_state_dict(model, world)
        for adapter in ([False, True] if case == "lora" else [False]):
            reference = ({k.replace(".default.", "."): v for k, v in raw.items() if ".lora_" in k}
                         if adapter else export_state_dict(model, world, raw=raw))
            buckets = list(export_buckets(model, world, BUCKET_MB, adapter=adapter))
            joined = {k: v for b in buckets for k, v in b.items()}
            same = (joined.keys() == reference.keys()
                    and all(torch.equal(joined[k], reference[k]) for k in reference))
            rows.append(({"rank": world.rank, "case": case + ("-adapter" if adapter else ""),
                              "buckets": len(buckets), "names": len(joined),
                              "largest": max(sum(t.numel() * t.element_size() for t in b.values()) for b in buckets),
                              "same": same}))
    for rank in range(world.world_size):  # one rank at a time: the lines of two ranks can interleave
        if rank == world.rank:
            print("\n".join(json.dumps(row) for row in rows), flush=True)
        world.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    from posttrain.core.dist import exit_rank

    exit_rank(0)  # as `python -m posttrain` leaves a rank: gloo threads must not abort it at exit
