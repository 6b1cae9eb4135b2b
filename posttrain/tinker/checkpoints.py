"""Checkpoints of training clients: save, load, list, and sampler snapshots.

A checkpoint folder (``ROOT/RUN/weights/NAME`` or ``ROOT/RUN/sampler_weights/NAME``) holds
``adapter.safetensors`` (the LoRA tensors, named without the client's id so any client can load
them), ``meta.json`` (base model, LoRA layout, time) and, for training checkpoints,
``optimizer.pt`` (AdamW's state and step count, read back with ``weights_only=True``). A folder is
written under a temporary name and renamed into place, so a crash leaves no half checkpoint that
looks whole. Bit-identical round trip: tensors and optimizer state are stored in their own dtype.

Each function here runs on the server's worker thread (the model's only user).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from posttrain.tinker.losses import LossInputError
from posttrain.tinker.training import LoraSpec, Sampler


def _write(folder: Path, tensors: dict, meta: dict, optimizer: dict | None, overwrite: bool) -> None:
    if folder.exists() and not overwrite:
        raise FileExistsError(f"checkpoint {folder.name} exists; pass overwrite to replace it")
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "adapter.safetensors"))
        if optimizer is not None:
            torch.save(optimizer, tmp / "optimizer.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _meta(state, model_id: str) -> dict:
    base = state.bases[state.models[model_id]]
    return {"base_model": base.name, "lora": base.adapters[model_id].spec.as_dict(), "time": time.time()}


def save_weights(state, model_id: str, name: str, overwrite: bool) -> dict:
    base = state.bases[state.models[model_id]]
    folder = state.root / model_id / "weights" / name
    _write(folder, base.adapter_state(model_id), _meta(state, model_id), base.optimizer_state(model_id), overwrite)
    return {"type": "save_weights", "path": f"tinker://{model_id}/weights/{name}"}


def save_for_sampler(state, model_id: str, name: str | None) -> dict:
    """With a name: a sampler checkpoint on disk. Without: a sampling session over a snapshot of
    the weights as they are now (kept in memory, like the SDK's ephemeral sampler)."""
    base = state.bases[state.models[model_id]]
    adapter = base.adapter_state(model_id)
    if name is None:
        sampler = Sampler(base=base.name, label=f"snapshot-{uuid.uuid4().hex}", adapter=adapter, model_path=None,
                          session=model_id.split(":train:")[0])
        return {"type": "save_weights_for_sampler", "sampling_session_id": state.add_sampler(sampler)}
    _write(state.root / model_id / "sampler_weights" / name, adapter, _meta(state, model_id), None, overwrite=True)
    return {"type": "save_weights_for_sampler", "path": f"tinker://{model_id}/sampler_weights/{name}"}


def _read(folder: Path) -> tuple[dict, dict]:
    if not (folder / "meta.json").is_file() or not (folder / "adapter.safetensors").is_file():
        raise FileNotFoundError(f"no checkpoint at {folder.parent.name}/{folder.name}")
    return json.loads((folder / "meta.json").read_text()), load_file(str(folder / "adapter.safetensors"))


def read_sampler(state, folder: Path) -> tuple[str, dict]:
    """(base name, adapter tensors) of a sampler checkpoint."""
    meta, adapter = _read(folder)
    if meta["base_model"] not in state.bases:
        raise LossInputError(f"the checkpoint's base model {meta['base_model']!r} is not served here")
    return meta["base_model"], adapter


def load_weights(state, model_id: str, new: bool, folder: Path, path: str, with_optimizer: bool) -> dict:
    """Into training client ``model_id``; with ``new``, a client of that id made from the checkpoint
    (its id is reserved in ``state.models``, with the base the request named or None)."""
    try:
        meta, tensors = _read(folder)
        optimizer = torch.load(folder / "optimizer.pt", weights_only=True) if with_optimizer else None
        if new:
            name = state.models[model_id] or meta["base_model"]
            if name != meta["base_model"] or name not in state.bases:
                raise LossInputError(f"base_model {name!r}: the checkpoint was trained on {meta['base_model']!r}")
            state.models[model_id] = name
            state.bases[name].add_adapter(model_id, LoraSpec(**meta["lora"]))
        state.bases[state.models[model_id]].load_state(model_id, tensors, optimizer)
    except Exception:
        if new:
            base = state.bases.get(state.models.pop(model_id, None) or "")
            if base is not None:
                base.remove_adapter(model_id)
        raise
    return {"type": "load_weights", "path": path, "model_id": model_id}


def list_checkpoints(root: Path, run: str) -> list[dict]:
    out = []
    for kind, segment in (("training", "weights"), ("sampler", "sampler_weights")):
        for folder in sorted((root / run / segment).glob("[!.]*")):
            if not (folder / "meta.json").is_file():
                continue
            meta = json.loads((folder / "meta.json").read_text())
            size = sum(f.stat().st_size for f in folder.iterdir())
            out.append({"checkpoint_id": f"{segment}/{folder.name}", "checkpoint_type": kind,
                        "time": datetime.fromtimestamp(meta["time"], tz=timezone.utc).isoformat(),
                        "tinker_path": f"tinker://{run}/{segment}/{folder.name}", "size_bytes": size})
    return out
