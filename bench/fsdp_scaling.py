"""SFT throughput with FSDP2: 1 rank vs 2 ranks on the same global batch (tokens per second).

Side by side in one run: the script builds the embedded ``small`` model (9.8 M parameters) and the
arithmetic task (2-digit × 2-digit with reasoning traces) into a temporary folder, then runs
``posttrain sft`` twice on them with the same config and the same global batch
(``grad_accum`` micro-batches of ``data.tokens_per_batch`` tokens a step):

- world size 1: ``python -m posttrain sft ...`` (one process, one thread);
- world size 2: ``torchrun --standalone --nproc-per-node 2 -m posttrain sft ...`` (gloo on the CPU,
  one thread a rank; each rank runs grad_accum / 2 micro-batches and FSDP2 gathers and reduces).

Both runs do the same optimizer steps on the same examples (2 ranks reproduce 1 process); the
figure is the median of ``tokens_per_s`` in ``metrics.jsonl`` (real tokens of the whole step over
the step's wall time, on rank 0) after the first ``--warmup`` steps. Prints both, their ratio and
the scaling efficiency (ratio / 2). ``--rounds R`` repeats the pair in alternating order and keeps
each side's best round, so a burst of load on a shared machine does not decide the result.

Run: ``.venv/bin/python bench/fsdp_scaling.py`` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_sft(nproc: int, args: list[str]) -> None:
    launcher = [sys.executable, "-m", "posttrain"] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "posttrain"]
    r = subprocess.run([*launcher, "sft", *args], check=False, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        sys.exit(f"world size {nproc}: posttrain sft failed:\n{r.stderr[-4000:]}")


def tokens_per_s(run_dir: Path, warmup: int) -> tuple[float, int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] > warmup]
    return statistics.median(r["tokens_per_s"] for r in timed), int(statistics.median(r["tokens"] for r in timed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="embedded model size (nano, tiny, small)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    parser.add_argument("--grad-accum", type=int, default=4, help="micro-batches per step (a multiple of 2)")
    parser.add_argument("--tokens-per-batch", type=int, default=2048, help="token budget of one micro-batch")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the pair, keep each side's best")
    args = parser.parse_args()

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny, count_parameters
    from posttrain.tasks.arithmetic import write_arithmetic

    quiet_transformers()
    best = {1: 0.0, 2: 0.0}
    tokens = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = build_tiny(tmp / "model", args.size, seed=0)
        write_arithmetic(tmp / "data", digits=2, ops="x", n_train=4000, n_eval=10, fmt="trace", seed=0)
        from transformers import AutoModelForCausalLM

        n_params = count_parameters(AutoModelForCausalLM.from_pretrained(model_dir))
        common = [f"model.path={model_dir}", f"data.path={tmp / 'data' / 'train.jsonl'}", "data.eval_path=",
                  "data.max_len=256", f"data.tokens_per_batch={args.tokens_per_batch}",
                  f"grad_accum={args.grad_accum}", f"num_steps={args.warmup + args.steps}", "eval_every=0",
                  "save_every=0", "optim.lr=1e-3", "logging.progress=false"]
        for k in range(args.rounds):
            for nproc in ((1, 2) if k % 2 == 0 else (2, 1)):
                out = tmp / f"run-{nproc}-{k}"
                run_sft(nproc, [*common, f"out_dir={out}"])
                tps, tokens[nproc] = tokens_per_s(out, args.warmup)
                print(f"round {k + 1}, world size {nproc}: {tps:,.0f} tokens/s", flush=True)
                best[nproc] = max(best[nproc], tps)
    ratio = best[2] / best[1]
    print(f"\nmodel: {args.size}, {n_params / 1e6:.2f} M parameters; global batch {args.grad_accum} x "
          f"{args.tokens_per_batch}-token micro-batches (~{tokens[1]:,} real tokens a step); one thread a rank; "
          f"median over steps {args.warmup + 1}-{args.warmup + args.steps}")
    print(f"world size 1: {best[1]:10,.0f} tokens/s")
    print(f"world size 2: {best[2]:10,.0f} tokens/s")
    print(f"ratio 2/1: {ratio:.2f}   scaling efficiency (ratio / 2): {ratio / 2:.0%}")
    if tokens[1] != tokens[2]:
        print(f"warning: the two runs saw different token counts a step ({tokens[1]} vs {tokens[2]})")


if __name__ == "__main__":
    main()
