"""Checkpoints: one format, one save, one resume, at any world size.

``checkpoints/step-N/`` holds

* a consolidated Hugging Face folder (``config.json``, safetensors, tokenizer) that
  ``from_pretrained`` loads unchanged, written by rank 0 from weights gathered one parameter at a
  time (a LoRA model is merged, its adapter also kept under ``adapter/``);
* ``dcp/``: every trainable model and its optimizer state, sharded, written by all ranks with
  ``torch.distributed.checkpoint``. DCP re-shards on load, so a run saved by 2 ranks resumes on 1
  or 4 (and a single process writes the same format, without a process group);
* ``trainer_state.pt``: the run's own state (step, schedules, data position, RL prompt ledger and
  curriculum, ...), written by rank 0; ``rng/rank-K.pt``: each rank's RNG.

A save goes to ``step-N.tmp`` and is renamed when complete, so a run killed mid-save never leaves a
half-written ``step-N``; the next completed save removes the stale ``.tmp``.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

from posttrain.core.dist import World, current_world
from posttrain.core.fsdp import export_state_dict, full_state_dict, is_sharded
from posttrain.errors import UserError


def _state_dicts(trainables: dict) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out = {}
    for name, (model, optimizer) in trainables.items():
        msd, osd = get_state_dict(model, optimizer)
        out[name] = {"model": msd, "optim": osd}
    return out


def save_checkpoint(run_dir: str | Path, step: int, *, trainables: dict, export_model, tokenizer, state: dict,
                    keep_last: int = 2, world: World | None = None, extra_exports: dict | None = None) -> Path:
    """Write ``step-N`` (see the module docstring); every rank calls it.

    ``trainables``: name -> (model, optimizer) saved to ``dcp/``; ``export_model`` becomes the HF
    folder; ``extra_exports``: subfolder -> model also exported as an HF folder (e.g. a critic).
    """
    import torch.distributed.checkpoint as dcp

    world = world or current_world()
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step-{step}", root / f"step-{step}.tmp"
    if world.main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    world.barrier()
    with warnings.catch_warnings():  # one process without a process group is a supported DCP layout
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(_state_dicts(trainables), checkpoint_id=str(tmp / "dcp"))
    torch.save(rng_state(), tmp / "rng" / f"rank-{world.rank}.pt")
    _export(export_model, tokenizer, tmp, world)
    for sub, model in (extra_exports or {}).items():
        _export(model, None, tmp / sub, world)
    if world.main:
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _prune(root, keep_last)
    world.barrier()
    return final


def _export(model, tokenizer, out: Path, world: World) -> None:
    """The consolidated HF folder (rank 0 writes; every rank takes part in the gather)."""
    from posttrain.models.hf import is_lora

    raw = full_state_dict(model, world) if is_sharded(model) else None  # one gather serves both files
    weights = export_state_dict(model, world, raw=raw)
    if not world.main:
        return
    out.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model() if is_lora(model) else model
    base.config.save_pretrained(out)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(out)
    from safetensors.torch import save_file

    tied = getattr(base.config, "tie_word_embeddings", False)
    weights = {k: v.contiguous() for k, v in weights.items() if not (tied and k == "lm_head.weight")}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if is_lora(model):  # a sharded model's adapter comes from the gathered weights, not its shards
        model.save_pretrained(out / "adapter", **({"state_dict": raw} if raw is not None else {}))
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def _prune(root: Path, keep_last: int) -> None:
    for stale in root.glob("step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last <= 0:
        return
    done = sorted((p for p in root.glob("step-*") if not p.name.endswith(".tmp")), key=lambda p: int(p.name[5:]))
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt: str | Path, *, trainables: dict, world: World | None = None) -> dict:
    """Restore every trainable (re-sharded to this world size) and this rank's RNG; returns the run state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    world, ckpt = world or current_world(), Path(ckpt)
    sd = _state_dicts(trainables)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(sd, checkpoint_id=str(ckpt / "dcp"))
        except (Exception, CheckpointException) as e:  # dcp's own type is a BaseException; its text holds the cause
            if "Missing key" not in str(e):
                raise
            raise UserError(f"{ckpt}: holds other weights than this run trains (written with other settings: LoRA "
                            f"or full weights, another model or algorithm); use a new out_dir, or resume=false") from None
    for name, (model, optimizer) in trainables.items():
        set_state_dict(model, optimizer, model_state_dict=sd[name]["model"], optim_state_dict=sd[name]["optim"])
    rng = ckpt / "rng" / f"rank-{world.rank}.pt"
    set_rng_state(torch.load(rng if rng.exists() else ckpt / "rng" / "rank-0.pt", weights_only=False))
    return load_trainer_state(ckpt)


def load_trainer_state(ckpt: str | Path) -> dict:
    return torch.load(Path(ckpt) / "trainer_state.pt", weights_only=False)


def rng_state() -> dict:
    import random

    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
