"""The folder a trainer hands weights to servers in: ``weights_dir/v{version}/``.

Full weights are one safetensors shard per part (a single part is plain ``model.safetensors``;
several get ``model.safetensors.index.json``), named the way transformers and vLLM read sharded
checkpoints, with the model's ``config.json`` and ``generation_config.json`` beside them when
known; a LoRA adapter is ``adapter_model.safetensors`` + ``adapter_config.json``, as peft saves
one. A version is written in a temporary folder and renamed, so a server never sees half a file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
ADAPTER_FILE = "adapter_model.safetensors"
MODEL_FILES = ("config.json", "generation_config.json")  # copied next to the weights when known
_VERSION_DIR = re.compile(r"^v(\d+)$")


def write_version(weights_dir: Path, buckets, version: int, digest, *, adapter_config: dict | None = None,
                  model_files: str | Path | None = None) -> tuple[Path, str | None]:
    """``weights_dir/v{version}/`` from the parts (dicts of tensors, each dropped once written),
    and, given a ``digest`` (`WeightsDigest`) to build, the checksum of what it holds."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    final = weights_dir / f"v{version}"
    tmp = weights_dir / f".v{version}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if adapter_config is not None:  # a LoRA adapter: small, one file
            adapter = {k: v for part in buckets for k, v in part.items()}
            _save(adapter, tmp / ADAPTER_FILE, version, digest)
            (tmp / "adapter_config.json").write_text(json.dumps(adapter_config))
        else:
            _save_shards(buckets, tmp, version, digest)
        for name in MODEL_FILES if model_files and adapter_config is None else ():
            src = Path(model_files) / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final.resolve(), digest.hexdigest() if digest else None


def prune_versions(weights_dir: Path, keep: set[Path]) -> None:
    """Remove every ``v{N}`` folder of ``weights_dir`` but those in ``keep``."""
    for p in weights_dir.iterdir():
        if p.is_dir() and _VERSION_DIR.match(p.name) and p.resolve() not in keep:
            shutil.rmtree(p, ignore_errors=True)


def _save(weights: dict[str, torch.Tensor], path: Path, version: int, digest) -> None:
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, t in weights.items():  # safetensors refuses tensors that share memory
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    if digest is not None:
        digest.update(tensors)
    save_file(tensors, str(path), metadata={"format": "pt", "version": str(version)})


def _save_shards(buckets, folder: Path, version: int, digest) -> None:
    """One shard per part, named the way transformers and vLLM read sharded checkpoints; a single
    part is plain ``model.safetensors``."""
    names: list[dict[str, torch.Tensor]] = []
    for i, part in enumerate(buckets):
        _save(part, folder / f"part-{i}", version, digest)
        names.append({k: v.numel() * v.element_size() for k, v in part.items()})
        del part  # not held while the next one is gathered
    if len(names) == 1:
        os.replace(folder / "part-0", folder / WEIGHTS_FILE)
        return
    weight_map, total = {}, 0
    for i, sizes in enumerate(names):
        shard = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
        os.replace(folder / f"part-{i}", folder / shard)
        weight_map.update(dict.fromkeys(sizes, shard))
        total += sum(sizes.values())
    (folder / WEIGHTS_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
