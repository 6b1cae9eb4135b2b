"""Rollout throughput: `TorchEngine` vs Hugging Face `model.generate`, side by side in one run.

Same tiny random Llama (vocab 512, hidden 256, 4 layers, 4 heads, ~2.9M parameters), same
left-padded prompts, same sampling (temperature 1, no top-k/top-p), same max_new_tokens. EOS is
disabled on both sides (the model has no EOS id and the engine is told ``ignore_eos``), so both
generate exactly prompts x max_new_tokens tokens; the script checks that count. Each timing is the
best of ``--repeats`` runs after one warm-up run. The ratio printed is engine tokens/s divided by
generate tokens/s.

Then the engine's time per decode step against its compute floor, for each prompts x new tokens
of the grid: the engine's step is ``(t(new) - t(1)) / (new - 1)`` for whole `generate` calls
(sampling and bookkeeping included), the decoder's step is `FastLlamaDecoder.step` alone (the
model's forward for one token per row), and the floor is the forward's matmuls of the same shapes
(fused q/k/v, o, fused gate/up, down per layer, then the LM head, on a (batch, in) input) timed
alone with nothing between them. Attention over the cache, norms, RoPE and sampling are what the
floor leaves out; the ratios say how much of a step they and Python cost. Measured with one thread
at load average ~3.5: 64 prompts x 32 tokens, floor 4.12 ms, decoder 7.58 ms (1.84x), engine 8.16
ms (1.98x); 8 x 32, floor 0.68 ms, decoder 1.55 ms (2.28x), engine 1.92 ms (2.82x); 64 x 128, the
decoder 3.1x its floor (attention reads the whole, longer cache every step).

    .venv/bin/python bench/rollout_vs_hf.py            # default grid
    .venv/bin/python bench/rollout_vs_hf.py --batch 64 --new 128 --repeats 3
    .venv/bin/python bench/rollout_vs_hf.py --batch 64 --new 32 --threads 1   # the step vs its floor
    .venv/bin/python bench/rollout_vs_hf.py --arch qwen3 --backend fast   # Qwen3 (q/k norms), fast decoder
    .venv/bin/python bench/rollout_vs_hf.py --arch qwen3 --backend hf     # ... and the generic one
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.rollout import SamplingParams, TorchEngine


def build_model(arch: str = "llama"):
    torch.manual_seed(0)
    if arch != "llama":  # the same dimensions in another family's config (`posttrain make-tiny --arch`)
        from transformers import AutoModelForCausalLM

        from posttrain.models.tiny import tiny_config

        model = AutoModelForCausalLM.from_config(tiny_config(arch, "tiny", vocab_size=512, eos_ids=None,
                                                             pad_id=0)).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        return model
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def make_prompts(count: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (count,), generator=g).tolist()
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in lengths]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def time_hf(model, prompts, new_tokens: int) -> tuple[float, int]:
    ids, mask = left_pad(prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=0)
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - ids.shape[1]) * out.shape[0]


def time_engine(engine, prompts, new_tokens: int) -> tuple[float, int]:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    start = time.perf_counter()
    rollouts = engine.generate(prompts, n=1, sampling=sampling)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(c) for c in rollouts.completion_ids)


def best_of(fn, repeats: int) -> tuple[float, int]:
    fn()  # warm-up
    runs = [fn() for _ in range(repeats)]
    return min(t for t, _ in runs), runs[0][1]


def matmul_shapes(model) -> list[tuple[int, int]]:
    """(in, out) of every matmul of one decode step's forward, as the fast decoder fuses them."""
    cfg = model.config
    E, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    D = getattr(cfg, "head_dim", None) or E // cfg.num_attention_heads
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    layer = [(E, (H + 2 * KV) * D), (H * D, E), (E, 2 * I), (I, E)]
    return layer * cfg.num_hidden_layers + [(E, V)]


def time_floor(shapes: list[tuple[int, int]], batch: int, repeats: int, iters: int = 50) -> float:
    """Seconds for one pass of the step's matmuls at ``batch`` rows, nothing else (best of ``repeats``)."""
    g = torch.Generator().manual_seed(0)
    mats = [(torch.randn(batch, i, generator=g), torch.randn(o, i, generator=g)) for i, o in shapes]

    def one_pass():
        for x, w in mats:
            F.linear(x, w)

    one_pass()
    return min(timed(one_pass, iters) for _ in range(repeats))


def time_decoder_step(engine, prompts, new_tokens: int, repeats: int) -> float:
    """Seconds per `FastLlamaDecoder.step` (the forward alone, no sampling), best of ``repeats``."""
    ids, mask = left_pad(prompts)
    dec, pad = engine.decoder, (1 - mask).sum(1)
    tok = torch.randint(3, 512, (len(prompts),), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(repeats + 1):  # the first run warms up
        dec.prefill(ids, pad, torch.arange(len(prompts)), ids.shape[1] + new_tokens)
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            dec.step(tok)
        best = min(best, (time.perf_counter() - start) / (new_tokens - 1))
    return best


def timed(fn, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def step_vs_floor(engine, model, batch: int, new_tokens: int, repeats: int) -> str:
    """One row of the per-step table: the matmul floor, the decoder's step, the engine's step (ms)."""
    prompts = make_prompts(batch)
    t_long = best_of(lambda: time_engine(engine, prompts, new_tokens), repeats)[0]
    t_one = best_of(lambda: time_engine(engine, prompts, 1), repeats)[0]
    engine_s = (t_long - t_one) / (new_tokens - 1)
    floor_s = time_floor(matmul_shapes(model), batch, repeats)
    if engine.backend == "fast":
        dec_s = time_decoder_step(engine, prompts, new_tokens, repeats)
        dec = f"{dec_s * 1e3:8.3f} {dec_s / floor_s:5.2f}x"
    else:
        dec = f"{'-':>8} {'-':>6}"
    return f"{batch:>7} {new_tokens:>4} {floor_s * 1e3:7.3f} {dec} {engine_s * 1e3:7.3f} {engine_s / floor_s:5.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--new", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="auto", choices=["auto", "fast", "hf"])
    parser.add_argument("--arch", default="llama", help="llama, or a family of `posttrain make-tiny --arch` "
                        "(e.g. qwen3) at the tiny size; the step-vs-floor table is Llama's only")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); 1 on a loaded machine, see bench/grpo_vs_trl.py")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.arch)
    engine = TorchEngine(model, backend=args.backend)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M params, torch threads {torch.get_num_threads()}, engine backend {engine.backend}")
    print(f"{'prompts':>7} {'new':>4} {'hf tok/s':>10} {'engine tok/s':>13} {'ratio':>6}")
    for batch in args.batch:
        prompts = make_prompts(batch)
        for new in args.new:
            t_hf, n_hf = best_of(lambda: time_hf(model, prompts, new), args.repeats)
            t_en, n_en = best_of(lambda: time_engine(engine, prompts, new), args.repeats)
            assert n_hf == n_en == batch * new, (n_hf, n_en, batch * new)
            hf_rate, en_rate = n_hf / t_hf, n_en / t_en
            print(f"{batch:>7} {new:>4} {hf_rate:>10.0f} {en_rate:>13.0f} {en_rate / hf_rate:>5.2f}x")
    if args.arch != "llama":
        return
    print("\nper decode step (ms; ratio to the matmul floor):")
    print(f"{'prompts':>7} {'new':>4} {'floor':>7} {'decoder':>8} {'ratio':>6} {'engine':>7} {'ratio':>6}")
    for batch in args.batch:
        for new in args.new:
            if new > 1:
                print(step_vs_floor(engine, model, batch, new, args.repeats))


if __name__ == "__main__":
    main()
