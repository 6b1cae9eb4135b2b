"""One RL update's forward and backward, rows packed into one sequence vs padded, side by side.

The batch is the case packing is for: G=8 samples of one prompt (24 tokens) whose completions are
one long reasoning trace and seven short answers (``--long`` and ``--short`` tokens). The same
`Policy` scores the batch and takes one GRPO update (one micro-batch, the scoring forward reused)
with ``pack_rows`` on (the default: here it runs the rows end to end, no padding) and off (each
shared prompt run once, then every completion padded to the longest: the forward without
packing). The model is a Llama of the tiny model's width (hidden 256, 4 layers) with room for
long positions, random weights, fp32 on the CPU.

Prints positions run, seconds per update (median of ``--repeats``), the ratio, and the largest
difference between the two paths' log-probs (the same numbers up to float32 rounding).

    .venv/bin/python bench/packed_rl.py                       # one 2,000-token trace, seven of 50
    .venv/bin/python bench/packed_rl.py --long 4000 --short 100
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build_model(max_positions: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()


def build_batch(long: int, short: int, group: int = 8):
    from posttrain.rl.batch import build_batch as build
    from posttrain.rollout import Rollouts, SamplingParams

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 512, (24,), generator=g).tolist()
    lengths = [long] + [short] * (group - 1)
    comps = [torch.randint(5, 512, (n,), generator=g).tolist() for n in lengths]
    ro = Rollouts(prompt_idx=[0] * group, prompt_ids=[prompt] * group, completion_ids=comps,
                  logprobs=[[-1.0] * n for n in lengths], finish_reason=["length"] * group,
                  policy_version=[0] * group, sampling=SamplingParams())
    batch = build(ro, [1.0, 0.0] * (group // 2), [True] * group, pad_id=0)
    batch.adv_B = torch.tensor([1.0, -1.0] * (group // 2))
    return batch


def policy(pack_rows: bool, max_positions: int):
    from posttrain.core.optim import OptimConfig, build_scheduler
    from posttrain.rl.policy import Policy

    model = build_model(max_positions)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return Policy(model, opt, build_scheduler(opt, OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant"), 100),
                  temperature=1.0, grad_clip=1.0, micro_batch_tokens=10**9, reuse_score_forward=True,
                  pack_rows=pack_rows)


def update(p, batch, loss_fn) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    old, _, _ = p.score(batch, with_ref=False)
    batch.old_logp_BT = old
    p.train_step(batch, loss_fn, aggregation="seq_mean_token_mean", seed=0)
    return time.perf_counter() - t0, old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=2000)
    parser.add_argument("--short", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from posttrain.rl.config import RLConfig
    from posttrain.rl.losses import make_loss_fn

    torch.set_num_threads(1)
    loss_fn = make_loss_fn(RLConfig(algorithm="grpo"))
    batch = build_batch(args.long, args.short)
    max_positions = 24 + args.long + 8
    results = {}
    for name, pack in (("packed", True), ("padded", False)):
        p = policy(pack, max_positions)
        positions = []
        p.model.model.embed_tokens.register_forward_hook(lambda m, a, o: positions.append(a[0].numel()))
        times, old = [], None
        for _ in range(args.repeats):
            positions.clear()
            seconds, old = update(p, batch, loss_fn)
            times.append(seconds)
        results[name] = (statistics.median(times), sum(positions), old)
    real = int(batch.attention_mask_BT.sum())
    print(f"batch: 8 samples of a 24-token prompt, completions 1 x {args.long} + 7 x {args.short} tokens "
          f"({real} real tokens); tiny-width Llama, fp32, 1 CPU thread, median of {args.repeats}")
    print(f"{'forward':>8} {'positions':>10} {'s/update':>9}")
    for name, (seconds, positions, _) in results.items():
        print(f"{name:>8} {positions:>10} {seconds:>9.2f}")
    (tp, _, lp_p), (tq, _, lp_q) = results["packed"], results["padded"]
    mask = batch.mask_BT
    print(f"padded / packed time: {tq / tp:.2f}x; largest log-prob difference {(lp_p - lp_q)[mask].abs().max():.1e}")


if __name__ == "__main__":
    main()
