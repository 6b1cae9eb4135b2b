"""Checkpoints: ``checkpoints/step-N/`` is a plain Hugging Face folder plus ``trainer_state.pt``.

The HF part (merged weights + tokenizer) loads with `from_pretrained` unchanged. ``trainer_state.pt``
holds what resuming needs: optimizer and scheduler state, RNG states, the step, the data position,
and anything the stage adds (an RL ledger, say). A LoRA run also keeps its adapter under
``adapter/`` so resuming continues training the adapter, not a merged copy.

A checkpoint is written to ``step-N.tmp`` and renamed when complete, so a run killed mid-save
never leaves a half-written ``step-N`` behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from posttrain.models.hf import save_pretrained


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict, keep_last: int = 2) -> Path:
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"step-{step}"
    tmp = ckpt_root / f"step-{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_pretrained(model, tokenizer, tmp)
    torch.save(state, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _prune(ckpt_root, keep_last)
    return final


def _prune(ckpt_root: Path, keep_last: int) -> None:
    """Drop ``step-N.tmp`` left by a save killed half-way (garbage once a save has completed),
    then all but the newest ``keep_last`` checkpoints."""
    for stale in ckpt_root.glob("step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last <= 0:
        return
    done = sorted((p for p in ckpt_root.glob("step-*") if not p.name.endswith(".tmp")),
                  key=lambda p: int(p.name.split("-")[1]))
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def load_trainer_state(ckpt: str | Path) -> dict:
    return torch.load(Path(ckpt) / "trainer_state.pt", weights_only=False)


def restore_weights(model, ckpt: str | Path) -> None:
    """Load a checkpoint's trained weights into ``model`` (the adapter for a LoRA model)."""
    from safetensors.torch import load_file

    from posttrain.models.hf import is_lora

    ckpt = Path(ckpt)
    if is_lora(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(ckpt / "adapter" / "adapter_model.safetensors"))
        return
    state = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing means the checkpoint is not this model.
    real_missing = [k for k in missing if "lm_head" not in k]
    if real_missing or unexpected:
        raise RuntimeError(f"{ckpt}: checkpoint does not match the model (missing {real_missing[:3]}, "
                           f"unexpected {unexpected[:3]})")
