"""`posttrain make-tiny DIR --size {nano,tiny,small,0.5b} --arch {llama,qwen3,...}`: build an embedded tiny model and tokenizer.

The folder it writes is a plain Hugging Face model folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json); point `model.path` at it.
"""

from __future__ import annotations

import argparse

from posttrain.models.tiny import ARCHS, SIZES, TEMPLATES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("out_dir", help="folder to write the model and tokenizer to")
    parser.add_argument("--size", choices=list(SIZES), default="tiny",
                        help="nano (~0.15M params, tests), tiny (~2.6M, the demo), small (~10M, a teacher)")
    parser.add_argument("--arch", choices=list(ARCHS), default="llama",
                        help="model family (random weights in that family's own config class; same tokenizer)")
    parser.add_argument("--template", choices=list(TEMPLATES), default=None,
                        help="chat template shape: chatml, qwen3 (drops earlier <think> blocks), llama3 (header "
                             "tokens), gemma (turn markers); default: the family's (qwen3, gemma for Gemma, else chatml)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the tokenizer corpus")


def run(args: argparse.Namespace) -> int:
    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny, count_parameters

    quiet_transformers()
    from transformers import AutoModelForCausalLM

    path = build_tiny(args.out_dir, args.size, args.seed, arch=args.arch, template=args.template)
    n = count_parameters(AutoModelForCausalLM.from_pretrained(path))
    print(f"wrote {args.size} {args.arch} model ({n / 1e6:.2f}M params) and tokenizer to {path}")
    return 0
