"""Packed vs padded SFT throughput: real (non-pad) tokens per second of forward + backward + AdamW.

Side by side in one run, on the same examples: arithmetic SFT records with reasoning traces of
mixed lengths (``+``, ``-``, ``×`` with 1 to 4 digit operands), rendered with the chat template
and tokenized by `posttrain.data.sft.tokenize_sft`, on the embedded ``tiny`` model.

Fairness:
- both modes train one epoch over the *same* examples, so they process the same real tokens;
- both get the same ``tokens_per_batch`` budget per step (packed: real tokens; padded: rows ×
  longest row, i.e. the same memory/compute per step);
- both start from the same initial weights, with a fresh AdamW;
- warm-up (a few steps on other examples) is run first and not timed;
- the two modes' steps are interleaved one by one (each mode with its own model copy and
  optimizer), so bursts of load on a shared machine hit both alike; batches are collated before
  the clock starts; the best of ``--rounds`` rounds is kept.

Run: ``.venv/bin/python bench/sft_packing.py`` (about two minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import torch

from posttrain.data.packing import IGNORE_INDEX, collate, plan_batches
from posttrain.data.records import SFTExample
from posttrain.data.sft import tokenize_sft
from posttrain.tasks import arithmetic as ar

DIGIT_MIX = [(1, 1), (2, 1), (2, 2), (3, 2), (3, 3), (4, 3)]


def build_examples(tokenizer, n: int, seed: int, max_len: int):
    per = -(-n // len(DIGIT_MIX))
    problems = []
    for k, digits in enumerate(DIGIT_MIX):
        problems += ar.sample_problems(per, split="train", digits=digits, ops=["+", "-", "x"], seed=seed + k)
    records = [SFTExample(prompt=p.prompt, completion=ar.completion(p, "trace")) for p in problems[:n]]
    return tokenize_sft(records, tokenizer, max_len=max_len, use_chat_template=True)


def train_step(model, optimizer, batch) -> None:
    logits = model(**batch.model_inputs()).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch.labels_BT.flatten(),
                                             ignore_index=IGNORE_INDEX, reduction="sum") / batch.num_loss_tokens
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_batches(examples, *, pack: bool, tokens_per_batch: int, seq_len: int):
    plan = plan_batches([len(e) for e in examples], tokens_per_batch=tokens_per_batch, pack=pack, seed=0, epoch=0)
    return [collate(examples, idx, pack=pack, seq_len=seq_len) for idx in plan]


def run_interleaved(model0, batches_by_mode: dict[str, list]) -> dict[str, float]:
    """Train a copy of ``model0`` per mode through its batches, alternating steps between modes.

    Interleaving step by step means a burst of load on a shared machine slows both modes alike;
    the first mode of each pair alternates too. Returns timed seconds per mode.
    """
    state = {}
    for mode in batches_by_mode:
        model = copy.deepcopy(model0)
        state[mode] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    seconds = dict.fromkeys(batches_by_mode, 0.0)
    modes = list(batches_by_mode)
    for i in range(max(len(b) for b in batches_by_mode.values())):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            if i < len(batches_by_mode[mode]):
                start = time.perf_counter()
                train_step(*state[mode], batches_by_mode[mode][i])
                seconds[mode] += time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", help="embedded model size (default tiny)")
    parser.add_argument("--n-examples", type=int, default=300)
    parser.add_argument("--tokens-per-batch", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=160,
                        help="packed row length and max example length (default 160: just above the "
                             "longest example, 142 tokens; attention cost grows with the square of the row length)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.tiny import build_tiny

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny(tmp, args.size, seed=0)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model0 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model0.train()
    examples = build_examples(tokenizer, args.n_examples, seed=0, max_len=args.seq_len)
    warmup = build_examples(tokenizer, 60, seed=100, max_len=args.seq_len)
    lengths = sorted(len(e) for e in examples)
    print(f"model={args.size} threads={torch.get_num_threads()} examples={len(examples)} "
          f"tokens_per_batch={args.tokens_per_batch} seq_len={args.seq_len}")
    print(f"example lengths: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]}, "
          f"total {sum(lengths)}")
    batches = {mode: make_batches(examples, pack=mode == "packed", tokens_per_batch=args.tokens_per_batch,
                                  seq_len=args.seq_len) for mode in ("packed", "padded")}
    real = {mode: sum(b.num_real_tokens for b in bs) for mode, bs in batches.items()}
    assert real["packed"] == real["padded"], "both modes must process the same real tokens"
    for mode, bs in batches.items():
        slots = sum(b.input_ids_BT.numel() for b in bs)
        print(f"{mode}: {len(bs)} steps, rows x width e.g. {tuple(bs[0].input_ids_BT.shape)}, "
              f"padding {1 - real[mode] / slots:.0%} of token slots")
    warm = {mode: make_batches(warmup, pack=mode == "packed", tokens_per_batch=args.tokens_per_batch,
                               seq_len=args.seq_len)[:3] for mode in batches}
    run_interleaved(model0, warm)  # untimed: allocator and kernel warm-up for both shapes
    best = dict.fromkeys(batches, float("inf"))
    for r in range(args.rounds):
        seconds = run_interleaved(model0, batches)
        print(f"round {r}: " + ", ".join(f"{m} {s:.2f} s ({real[m] / s:.0f} real tok/s)" for m, s in seconds.items()))
        best = {m: min(best[m], seconds[m]) for m in best}
    rate = {m: real[m] / best[m] for m in best}
    print(f"\nbest of {args.rounds}: packed {rate['packed']:.0f} real tok/s vs padded {rate['padded']:.0f} real tok/s: "
          f"packed/padded = {rate['packed'] / rate['padded']:.2f}x (goal >= 1.5x)")

if __name__ == "__main__":
    main()
