"""The GPU paths, checked and timed on one CUDA device (`bash scripts/gpu_check.sh`).

On a model built here with random weights (the embedded tokenizer and a Llama of ~0.38B
parameters, `--size 0.5b`; nothing is downloaded), in bf16:

1. the rollout engine against Hugging Face ``model.generate``: the same prompts, the same number
   of new tokens (EOS ignored), tokens/s of each and their ratio;
2. one update's model FLOPs utilisation: forward, backward and AdamW on random token batches,
   6 x parameters x tokens per second over the device's bf16 peak (when the device is known);
3. the bf16 engine against the float32 trainer on the same sampled tokens: mean and max
   |Δ log p|, the mismatch KL, the share of ratios outside [1/2, 2] (`mismatch/*`);
4. ``posttrain sft`` and ``posttrain rl`` (GRPO, the in-process engine in bf16) for a few steps
   each, as a user runs them: exit status, seconds per step.

It prints one line per figure and exits 1 if a run failed. ``--device cpu --size tiny`` runs the
same script on a CPU in seconds (a dry run of the script itself, not a measurement).

    bash scripts/gpu_check.sh                      # on a CUDA machine
    python bench/gpu_check.py --device cpu --size tiny --steps 2   # the dry run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Dense bf16 peak FLOP/s by device name (the vendors' data sheets, without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}


def peak_flops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_vs_generate(model_dir: Path, device: str, dtype, prompts: int, new: int) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM

    from posttrain.rollout import SamplingParams, TorchEngine

    g = torch.Generator().manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    batch = [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in torch.randint(8, 33, (prompts,), generator=g)]
    engine = TorchEngine(model, dtype=dtype, device=device)
    s = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=0)
    engine.generate(batch[:2], 1, s)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    ro = engine.generate(batch, 1, s)
    sync(device)
    t_engine = time.perf_counter() - t0
    assert sum(len(c) for c in ro.completion_ids) == prompts * new
    width = max(len(p) for p in batch)
    ids = torch.zeros(prompts, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, pad_token_id=0)
    with torch.no_grad():
        model.generate(input_ids=ids[:2].to(device), attention_mask=mask[:2].to(device), **kwargs)
        sync(device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
        sync(device)
    t_hf = time.perf_counter() - t0
    assert out.shape[1] - width == new
    return prompts * new / t_engine, prompts * new / t_hf


def engine_mismatch(model_dir: Path, device: str, prompts: int, new: int) -> dict[str, float]:
    """A bf16 engine samples, the float32 model (the trainer's numbers) scores the same tokens: the
    `mismatch/*` figures a run with ``rollout.engine_dtype=bfloat16`` logs, on this device's kernels."""
    from transformers import AutoModelForCausalLM

    from posttrain.algos import mismatch_metrics
    from posttrain.rollout import SamplingParams, TorchEngine

    g = torch.Generator().manual_seed(1)
    engine = TorchEngine(str(model_dir), dtype=torch.bfloat16, device=device)
    lengths = torch.randint(8, 33, (prompts,), generator=g)
    batch = [torch.randint(3, engine.vocab_size, (int(n),), generator=g).tolist() for n in lengths]
    ro = engine.generate(batch, 1, SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=1))
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    rows = [batch[i] + list(c) for i, c in zip(ro.prompt_idx, ro.completion_ids)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)  # completion tokens, at the position that predicts them
    sampler = torch.zeros(len(rows), width)
    for r, (row, i, lp) in enumerate(zip(rows, ro.prompt_idx, ro.logprobs)):
        ids[r, :len(row)] = torch.tensor(row)
        start = len(batch[i]) - 1
        mask[r, start:start + len(lp)] = True
        sampler[r, start:start + len(lp)] = torch.tensor(lp)
    with torch.no_grad():
        logp = torch.cat([trainer(ids[k:k + 8].to(device)).logits.float().log_softmax(-1).cpu()
                          for k in range(0, len(rows), 8)])
    target = torch.roll(ids, -1, dims=1)
    trainer_logp = logp.gather(-1, target[..., None])[..., 0]
    return {k: float(v) for k, v in mismatch_metrics(trainer_logp, sampler, mask).items()}


def update_mfu(model_dir: Path, device: str, batch: int, seq: int, steps: int) -> tuple[float, float | None]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(3, model.config.vocab_size, (batch, seq), device=device)
    autocast = torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    times = []
    for _ in range(steps + 1):  # the first is warm-up
        sync(device)
        t0 = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    flops = 6 * params * batch * seq / min(times[1:])
    peak = peak_flops(device)
    return flops, None if peak is None else flops / peak


DENSE_REWARD = '''
from posttrain.outcome import Outcome

def letters(completion, example):
    """The fraction of letters: rewards that differ within a group even for random weights, so that
    every GRPO step runs its update (arithmetic would score a random model 0 everywhere)."""
    frac = sum(c.isalpha() for c in completion) / max(len(completion), 1)
    return Outcome.model_fail(reward=frac)
'''


def cli_runs(model_dir: Path, data: Path, work: Path, device: str, steps: int) -> dict[str, float]:
    """Seconds per step of `posttrain sft` and `posttrain rl` (bf16), each a fresh process."""
    (work / "gpu_check_rewards.py").write_text(DENSE_REWARD)
    common = [f"model.path={model_dir}", f"model.device={device}", f"num_steps={steps}", "eval_every=0",
              "save_every=0", "logging.progress=false"]
    runs = {"sft": ["sft", f"data.path={data / 'train.jsonl'}", "data.eval_path=", "precision=bf16",
                    "data.max_len=256", "data.tokens_per_batch=4096", *common],
            "grpo": ["rl", f"data.path={data / 'prompts_train.jsonl'}", "data.eval_path=",
                     "rollout.engine_dtype=bfloat16", "prompts_per_step=8", "rollout.group_size=8",
                     "rollout.max_new_tokens=64", "verifier=gpu_check_rewards:letters", *common]}
    out = {}
    for name, args in runs.items():
        run_dir = work / name
        r = subprocess.run([sys.executable, "-m", "posttrain", *args, f"out_dir={run_dir}"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": f"{Path(__file__).resolve().parents[1]}:{work}"})
        if r.returncode:
            print(f"FAIL {name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
            out[name] = float("nan")
            continue
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        out[name] = min(m["time/step_s"] for m in rows if m.get("step", 0) > 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="0.5b", help="a size of posttrain.models.tiny (0.5b, small, tiny, nano)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="rows of the MFU update")
    ap.add_argument("--seq", type=int, default=512, help="tokens per row of the MFU update")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device} but torch sees no CUDA device (torch {torch.__version__})")
        return 2

    from posttrain.models.tiny import build_tiny, count_parameters
    from posttrain.tasks.arithmetic import write_arithmetic

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    model_dir = build_tiny(work / "model", args.size, seed=0)
    data = work / "data"
    write_arithmetic(data, digits=2, ops="x", n_train=400, n_eval=20, fmt="trace", seed=0)
    from transformers import AutoModelForCausalLM

    n = count_parameters(AutoModelForCausalLM.from_pretrained(model_dir))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"gpu_check on {name}: a {n / 1e6:.0f}M-parameter Llama built here (random weights), bf16")
    engine, hf = engine_vs_generate(model_dir, args.device, torch.bfloat16, args.prompts, args.new)
    print(f"engine vs model.generate, {args.prompts} prompts x {args.new} new tokens: {engine:.0f} vs {hf:.0f} "
          f"tokens/s ({engine / hf:.2f}x)")
    m = engine_mismatch(model_dir, args.device, min(args.prompts, 32), min(args.new, 64))
    print(f"bf16 engine vs float32 trainer, same tokens: mean |dlogp| {m['mismatch/logprob_abs_diff_mean']:.2e}, "
          f"max {m['mismatch/logprob_abs_diff_max']:.2e}, mismatch KL {m['mismatch/kl']:.2e}, "
          f"ratio outside [1/2, 2] {m['mismatch/ratio_outside_2x_frac']:.4f}")
    flops, mfu = update_mfu(model_dir, args.device, args.batch, args.seq, args.steps)
    print(f"update (bf16 autocast, AdamW), {args.batch} x {args.seq} tokens: {flops / 1e12:.1f} TFLOP/s"
          + (f", MFU {mfu:.1%} of the bf16 peak" if mfu is not None else " (peak unknown: no MFU)"))
    steps = cli_runs(model_dir, data, work, args.device, args.steps)
    for k, v in steps.items():
        print(f"posttrain {'rl (GRPO)' if k == 'grpo' else k}: {v:.2f} s per step" if v == v else f"posttrain {k}: FAILED")
    return 1 if any(v != v for v in steps.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
