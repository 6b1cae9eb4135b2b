"""Model folders on disk: which folder a path means, and the weights and checksum it holds.

A folder's checksum is `posttrain.rollout.types.weights_checksum` over every tensor of its top-level
``*.safetensors`` files, as stored (names and dtypes as in the files, before any cast). A trainer
that writes a Hugging Face folder computes the same value with::

    from safetensors.torch import load_file
    from posttrain.rollout import weights_checksum
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(f))
    checksum = weights_checksum(tensors)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from posttrain.errors import UserError
from posttrain.rollout.types import weights_checksum
from posttrain.tracking import latest_checkpoint


def resolve_model_dir(path: str | Path, key: str = "MODEL") -> Path:
    """A model folder as given, or, for a run directory (one with ``checkpoints/``), its newest
    complete ``checkpoints/step-N``. Raises `UserError` when the run has no complete checkpoint."""
    p = Path(path)
    if (p / "checkpoints").is_dir() and not (p / "config.json").is_file():
        ckpt = latest_checkpoint(p)
        if ckpt is None:
            raise UserError(f"{key}={path}: run directory has no complete checkpoint under checkpoints/")
        return ckpt
    return p


def safetensors_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


class _LazyTensors(Mapping):
    """name -> tensor, read from the files one tensor at a time (for hashing without holding them all)."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    if name in self._where:
                        raise ValueError(f"tensor {name!r} appears in both {self._where[name].name} and {f.name}")
                    self._where[name] = f

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self._where[name]), framework="pt") as h:
            return h.get_tensor(name)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def folder_checksum(folder: str | Path) -> str:
    """`weights_checksum` of a folder's safetensors, reading one tensor at a time."""
    files = safetensors_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    return weights_checksum(_LazyTensors(files))


def load_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's top-level ``*.safetensors`` files (on the CPU, dtypes as stored)."""
    from safetensors.torch import load_file

    files = safetensors_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(f))
        dup = set(part) & set(out)
        if dup:
            raise ValueError(f"tensor {min(dup)!r} appears in more than one file of {folder}")
        out.update(part)
    return out
