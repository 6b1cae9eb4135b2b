"""Async vs sync RL, side by side in one run: wall time for the same steps, held-out accuracy at the end.

Builds the embedded model, writes the arithmetic task (reasoning traces, so completion lengths are
long-tailed: some answer in a few tokens, some run to the cap), gives it a short SFT cold start, then
runs the same GRPO recipe from that checkpoint: sync (with 1 thread and with all cores; the faster is
the baseline), async K=1, async K=2.
Prints per run: loop wall time (setup and the final held-out eval excluded), speed-up over sync,
held-out greedy pass@1, staleness, trainer/engine idle, and the fraction of the ideal overlap bound
achieved. The bound comes from the sync run: generation g and training t seconds per step can at
best overlap into max(g, t), a speed-up of (g + t) / max(g, t).

    .venv/bin/python bench/async_vs_sync.py               # ~10 min on 2 cores
    .venv/bin/python bench/async_vs_sync.py --steps 6 --sft-steps 30   # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def prepare(out: Path, args) -> dict:
    from posttrain.config import load_config
    from posttrain.models.tiny import build_tiny
    from posttrain.tasks.arithmetic import write_arithmetic
    from posttrain.train.sft import SFTConfig, run_sft

    from posttrain.tracking import latest_checkpoint

    model = build_tiny(out / "model", args.size, seed=0)
    data = write_arithmetic(out / "data", n_train=2000, n_eval=args.eval_prompts, seed=0, digits=2,
                            ops=args.ops, fmt="trace")
    done = args.sft_ckpt or (latest_checkpoint(out / "sft") if not args.fresh else None)
    if done:  # a given SFT checkpoint of this task, or the same cold start as last time
        return {"ckpt": str(done), **{k: str(v) for k, v in data.items()}}
    cfg = load_config(SFTConfig, None, [
        f"model.path={model}", f"data.path={data['train']}", f"data.eval_path={data['eval']}", "data.max_len=128",
        "data.tokens_per_batch=4096", "optim.lr=3e-3", "optim.warmup_steps=10", f"num_steps={args.sft_steps}",
        "eval_every=0", "save_every=0", f"out_dir={out / 'sft'}", "logging.progress=false"])
    return {"ckpt": run_sft(cfg, printer=lambda *_: None)["checkpoint"], **{k: str(v) for k, v in data.items()}}


def rl_run(name: str, extra: list[str], paths: dict, out: Path, args, threads: int = 0) -> list[dict]:
    import torch

    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    torch.set_num_threads(threads or os.cpu_count() or 2)
    cfg = load_config(RLConfig, None, [
        f"model.path={paths['ckpt']}", f"data.path={paths['prompts_train']}", f"data.eval_path={paths['prompts_eval']}",
        f"data.eval_max_prompts={args.eval_prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new}", f"prompts_per_step={args.prompts}", f"num_steps={args.steps}",
        "optim.lr=1e-4", "optim.beta2=0.999", "optim.warmup_steps=10", "optim.schedule=cosine",
        "eval_every=0", "save_every=0", "kl.track=false",
        f"out_dir={out / name}", "resume=false", "logging.progress=false", *extra])
    run_rl(cfg, printer=lambda *_: None)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if r["step"] > 0]
    wall = sum(r["time/step_s"] - r.get("time/eval_s", 0.0) for r in steps)
    gen = sum(r.get("time/rollout_s", 0.0) for r in steps)
    trained = [r for r in steps if "response_length/mean" in r]  # a starved step trains nothing
    lengths = [r["response_length/mean"] for r in trained]
    return {"wall_s": wall, "gen_s": gen, "train_s": wall - gen, "acc": steps[-1].get("eval/heldout/greedy/pass@1", float("nan")),
            "acc0": rows[0].get("eval/heldout/greedy/pass@1", float("nan")),
            "len_mean": _mean(lengths), "len_max": max((r["response_length/max"] for r in trained), default=float("nan")),
            "truncated": _mean([r["response_length/truncated_frac"] for r in trained]),
            "stale": statistics.mean(r.get("async/staleness_mean", 0.0) for r in steps),
            "stale_max": max(r.get("async/staleness_max", 0) for r in steps),
            "idle_trainer": sum(r.get("time/trainer_idle_s", 0.0) for r in steps),
            "idle_engine": sum(r.get("time/engine_idle_s", 0.0) for r in steps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench-async")
    p.add_argument("--size", default="nano", choices=["nano", "tiny"])
    p.add_argument("--sft-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--eval-prompts", type=int, default=100)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ops", default="+", help="operations of the task (+ alone is learnt fastest)")
    p.add_argument("--fresh", action="store_true", help="redo the SFT cold start even if OUT/sft has one")
    p.add_argument("--sft-ckpt", default="", help="start RL from this SFT checkpoint (same task) instead")
    p.add_argument("--sync-threads", type=int, nargs="+", default=[], help="thread counts of the sync runs "
                   "(default: 1 and all cores; the faster is the baseline)")
    args = p.parse_args()
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    out = Path(args.out)
    t0 = time.perf_counter()
    paths = prepare(out, args)
    print(f"SFT cold start: {time.perf_counter() - t0:.0f} s; {args.steps} RL steps x {args.prompts} prompts x "
          f"G={args.group}, max {args.max_new} new tokens, {os.cpu_count()} cores")
    # Sync at every thread count: on a loaded machine one thread can beat two; the faster is the baseline.
    cores = os.cpu_count() or 2
    runs = {f"sync {n}thr": summarize(rl_run(f"sync-{n}", [], paths, out, args, threads=n))
            for n in sorted(set(args.sync_threads) or {1, cores})}
    for k in args.staleness:
        runs[f"async K={k}"] = summarize(rl_run(f"async-k{k}", ["mode=async", f"max_staleness={k}"], paths, out, args))
    report(runs)


def report(runs: dict) -> None:
    base = min((r for name, r in runs.items() if name.startswith("sync")), key=lambda r: r["wall_s"])
    ideal = (base["gen_s"] + base["train_s"]) / max(base["gen_s"], base["train_s"])
    print(f"\nfastest sync: generation {base['gen_s']:.1f} s + training {base['train_s']:.1f} s -> ideal overlap "
          f"speed-up (g+t)/max(g,t) = {ideal:.2f}x; completion length mean {base['len_mean']:.1f}, max "
          f"{base['len_max']}, {base['truncated']:.0%} hit the cap")
    print(f"{'run':<12}{'wall s':>8}{'speed-up':>10}{'of ideal':>10}{'held-out acc':>14}{'(start)':>9}"
          f"{'stale mean/max':>16}{'trainer idle':>14}{'engine idle':>13}")
    for name, r in runs.items():
        speed = base["wall_s"] / r["wall_s"]
        print(f"{name:<12}{r['wall_s']:>8.1f}{speed:>9.2f}x{speed / ideal:>10.0%}{r['acc']:>14.3f}{r['acc0']:>9.3f}"
              f"{r['stale']:>10.2f}/{r['stale_max']:<5}{r['idle_trainer']:>13.1f}s{r['idle_engine']:>12.1f}s")
    print("goals: speed-up >= 1.5x on 2 cores, held-out accuracy within 2 points of sync, >= 85% of the ideal bound")


if __name__ == "__main__":
    main()
