"""Run under torchrun: shard the tiny Mistral (sliding window 64) with FSDP2, plain and with LoRA,
and compare the packed forward's log-probs with the padded forward's on rows longer than the window.

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/rl/packed_ranks.py MODEL``

Each rank prints one JSON line per case: whether the model is sharded and the largest
|padded - packed| log-prob over the batch's target tokens.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests package, as pytest sees it


def main(model_dir: str) -> None:
    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import is_sharded, shard_model
    from posttrain.models.hf import LoraConfig, ModelConfig, load_model, quiet_transformers
    from tests.rl.test_packed import _ragged, padded_and_packed_logp

    quiet_transformers()
    world = init_world("cpu")
    rows = []
    for case, lora in [("plain", LoraConfig()), ("lora", LoraConfig(enabled=True, r=4))]:
        torch.manual_seed(0)
        model = shard_model(load_model(ModelConfig(path=model_dir, lora=lora)), world)
        mb = _ragged(model.config.get_text_config().vocab_size)
        padded, packed = padded_and_packed_logp(model, mb)
        rows.append({"rank": world.rank, "case": case, "sharded": is_sharded(model),
                     "max_abs_diff": float((padded - packed)[mb.mask_BT].abs().max())})
    for rank in range(world.world_size):  # one rank at a time: the lines of two ranks can interleave
        if rank == world.rank:
            print("\n".join(json.dumps(row) for row in rows), flush=True)
        world.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    from posttrain.core.dist import exit_rank

    exit_rank(0)  # as `python -m posttrain` leaves a rank: gloo threads must not abort it at exit
