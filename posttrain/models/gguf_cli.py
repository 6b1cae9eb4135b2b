"""`posttrain convert-gguf FILE.gguf DIR`: a GGUF file (llama.cpp's or Ollama's) as a Hugging Face folder.

The folder holds float32 safetensors (dequantised by transformers from the GGUF's tensors), the
tokenizer with its chat template, the generation config and POSTTRAIN_SOURCE.json saying where
it came from. Point `model.path` at it; `model.path=FILE.gguf` does the same conversion, cached.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("gguf_file", metavar="FILE", help="the .gguf file to convert (Llama-architecture and others "
                        "transformers reads)")
    parser.add_argument("out_dir", metavar="DIR", help="folder to write the model and tokenizer to (new or empty)")


def run(args: argparse.Namespace) -> int:
    return write(args.gguf_file, args.out_dir, "FILE")


def write(src: str, out_dir: str, key: str) -> int:
    """Convert ``src`` into ``out_dir`` (refused when it already holds files) and say what was written."""
    from pathlib import Path

    from posttrain.errors import UserError
    from posttrain.models.gguf import check_gguf, convert_gguf

    check_gguf(src, key)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"DIR={out_dir}: exists and is not an empty folder")
    path = convert_gguf(src, out, key=key)
    n = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(f"wrote {path} ({n / 1e6:.0f} MB of float32 safetensors, tokenizer, generation config) from {src}")
    return 0
