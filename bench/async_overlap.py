"""Async overlap over Ray: the engine on one core, the trainer on the other, sync vs async.

Async RL pays when the engine and the trainer own their hardware; two processes sharing two cores
with no pinning is not that measure. Here a local Ray is started with its processes pinned to core 0
(the affinity its processes inherit), so the one engine replica (``runtime=ray``,
``rollout.replicas=1``) generates on core 0, and this process, the trainer, is pinned to core 1 with
one torch thread. The same GRPO recipe as the demo runs from the demo's SFT checkpoint, sync, then
async with ``max_staleness=1``, for ``--steps`` steps each.

Prints per run: loop wall time (held-out evals excluded), generation and training seconds, the
speed-up of async over sync, the ideal (generation + training) / max(generation, training) measured
on the sync run, the fraction of the ideal reached, and held-out greedy accuracy at the end. Goals:
>= 85% of the ideal, held-out accuracy within 2 points of sync.

One seed's accuracy difference is mostly noise (on 100 problems one accuracy alone is +-0.09), so
``--seeds N`` repeats the pair (sync, async) with RL seeds SEED..SEED+N-1 from the same SFT start and
prints the mean difference with a 95% interval over seeds (t), next to the mean speed-up.

    .venv/bin/python bench/async_overlap.py                          # 20 steps, the demo's SFT
    .venv/bin/python bench/async_overlap.py --demo-out runs/demo0     # an existing demo run directory
    .venv/bin/python bench/async_overlap.py --seeds 3 --eval-prompts 500   # the accuracy comparison
    .venv/bin/python bench/async_overlap.py --steps 3 --profile quick # a smoke run
    .venv/bin/python bench/async_overlap.py --ranks 2                 # a 2-rank trainer (torchrun)

With ``--ranks N`` the trainer is ``torchrun --nproc-per-node N`` (FSDP2 on gloo), all its ranks
pinned to the trainer core, rank 0 driving the replica on the same pinned Ray: the overlap of a
sharded trainer with an engine apart (its ideal measured on its own sync run, as above).

The demo's run directory is reused when it holds an SFT checkpoint (``OUT/sft``); otherwise the
demo's model, data and SFT stage are run first (``--profile``: full is the demo's, quick a smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from async_vs_sync import summarize  # bench/ is on the path of a script run from it

ENGINE_CORE, TRAINER_CORE = 0, 1


def sft_checkpoint(out: Path, profile: str, seed: int) -> tuple[str, dict]:
    """The demo's SFT checkpoint and task files in ``out``, made with the demo's stages if missing."""
    from posttrain.demo import PROFILES, prepare, stage_sft
    from posttrain.tracking import latest_checkpoint

    p = PROFILES[profile]
    data = out / "data"
    ckpt = latest_checkpoint(out / "sft") if (out / "sft").is_dir() else None
    if ckpt is not None and (data / "prompts_train.jsonl").is_file():
        return str(ckpt), {"prompts_train": str(data / "prompts_train.jsonl"),
                           "prompts_eval": str(data / "prompts_eval.jsonl")}
    paths = prepare(out, p, seed)
    args = argparse.Namespace(seed=seed, no_progress=True)
    return stage_sft(out, p, paths, args), paths


def start_pinned_ray():
    """A local Ray of one CPU whose processes run on the engine core; this thread then moves to the
    trainer core (torch's threads, created later, follow it)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.sched_setaffinity(0, {ENGINE_CORE})
    from posttrain.distributed.cluster import connect

    ray = connect("", num_cpus=1)
    os.sched_setaffinity(0, {TRAINER_CORE})
    import torch

    torch.set_num_threads(1)
    return ray


def rl_run(name: str, extra: list[str], ckpt: str, paths: dict, out: Path, args, seed: int) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.demo import PROFILES
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    p = PROFILES[args.profile]
    overrides = [
        f"model.path={ckpt}", f"data.path={paths['prompts_train']}", f"data.eval_path={paths['prompts_eval']}",
        f"data.eval_max_prompts={args.eval_prompts}", f"rollout.group_size={p['group_size']}",
        f"rollout.max_new_tokens={p['max_new_tokens']}", "algorithm=grpo", "verifier=arithmetic",
        f"prompts_per_step={p['prompts_per_step']}", f"num_steps={args.steps}", f"optim.lr={p['rl_lr']}",
        "optim.beta2=0.999", "optim.warmup_steps=10", "optim.schedule=cosine", "dynamic_sampling.enabled=true",
        "dynamic_sampling.max_rounds=3", "eval_every=0", "save_every=0", "kl.track=false", f"seed={seed}",
        "runtime=ray", "rollout.replicas=1", "rollout.replica_cpus=1", "asynchrony.trainer_threads=1",
        f"out_dir={out / name}", "resume=false", "logging.progress=false", *extra]
    if args.ranks > 1:
        torchrun(args.ranks, overrides)
    else:
        run_rl(load_config(RLConfig, None, overrides), printer=lambda *_: None)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def torchrun(ranks: int, overrides: list[str]) -> None:
    """``posttrain rl`` under torchrun on the trainer core, its rank 0 joining this Ray."""
    import subprocess
    import sys

    from posttrain.distributed.cluster import require_ray

    ray = require_ray()
    cmd = ["taskset", "-c", str(TRAINER_CORE), sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", "-m", "posttrain", "rl", *overrides,
           f"ray.address={ray.get_runtime_context().gcs_address}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"torchrun failed:\n{r.stderr[-3000:]}")


def report(sync: dict, asyn: dict, steps: int) -> tuple[float, float]:
    """Prints one seed's pair; returns (fraction of the ideal, accuracy difference async - sync)."""
    ideal = (sync["gen_s"] + sync["train_s"]) / max(sync["gen_s"], sync["train_s"])
    speed = sync["wall_s"] / asyn["wall_s"]
    print(f"\n{steps} steps; engine on core {ENGINE_CORE}, trainer on core {TRAINER_CORE}; sync: generation "
          f"{sync['gen_s']:.1f} s + training {sync['train_s']:.1f} s -> ideal (g+t)/max(g,t) = {ideal:.2f}x")
    print(f"{'run':<10}{'wall s':>8}{'held-out acc':>14}{'(start)':>9}{'trainer idle':>14}{'engine idle':>13}"
          f"{'stale max':>11}")
    for name, r in (("sync", sync), ("async K=1", asyn)):
        print(f"{name:<10}{r['wall_s']:>8.1f}{r['acc']:>14.3f}{r['acc0']:>9.3f}{r['idle_trainer']:>13.1f}s"
              f"{r['idle_engine']:>12.1f}s{r['stale_max']:>11}")
    print(f"speed-up {speed:.2f}x = {speed / ideal:.0%} of the ideal {ideal:.2f}x; held-out accuracy "
          f"{asyn['acc'] - sync['acc']:+.3f} vs sync (goals: >= 85% of the ideal, within 0.02)")
    return speed / ideal, asyn["acc"] - sync["acc"]


# Student's t, 97.5% quantile, by degrees of freedom (index); the last entry (df >= 10) slightly wide.
T975 = [float("nan"), 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def across_seeds(pairs: list[tuple[float, float]]) -> None:
    """The mean fraction of the ideal and the mean accuracy difference with a 95% t interval."""
    import statistics

    fractions, diffs = zip(*pairs)
    mean = statistics.mean(diffs)
    half = T975[min(len(diffs) - 1, len(T975) - 1)] * statistics.stdev(diffs) / len(diffs) ** 0.5
    print(f"\n{len(pairs)} seeds: {statistics.mean(fractions):.0%} of the ideal on average "
          f"(min {min(fractions):.0%}); held-out accuracy async - sync {mean:+.3f} "
          f"[{mean - half:+.3f}, {mean + half:+.3f}] (95% t interval over seeds; per seed "
          + ", ".join(f"{d:+.3f}" for d in diffs) + ")")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo-out", default="runs/demo", help="the demo's run directory (its SFT is reused or made)")
    p.add_argument("--out", default="runs/bench-async-overlap")
    p.add_argument("--profile", default="full", choices=["full", "quick"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-prompts", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="the first RL seed (the SFT start is the demo's)")
    p.add_argument("--seeds", type=int, default=1, help="sync/async pairs, with RL seeds SEED, SEED+1, ...")
    p.add_argument("--ranks", type=int, default=1, help="trainer processes (torchrun) on the trainer core")
    args = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores (one for the engine, one for the trainer)")
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    out = Path(args.out)
    t0 = time.perf_counter()
    ckpt, paths = sft_checkpoint(Path(args.demo_out), args.profile, args.seed)
    print(f"SFT checkpoint {ckpt} ({time.perf_counter() - t0:.0f} s)")
    ray = start_pinned_ray()
    pairs = []
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            sync = summarize(rl_run(f"sync-{seed}", [], ckpt, paths, out, args, seed))
            asyn = summarize(rl_run(f"async-{seed}", ["mode=async", "max_staleness=1"], ckpt, paths, out, args, seed))
            print(f"\nseed {seed}", end="")
            pairs.append(report(sync, asyn, args.steps))
    finally:
        ray.shutdown()
    if len(pairs) > 1:
        across_seeds(pairs)


if __name__ == "__main__":
    main()
