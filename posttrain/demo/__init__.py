"""`posttrain demo`: the whole pipeline on the embedded tiny model, on a laptop CPU.

1. build the embedded ``tiny`` Llama model and tokenizer (no download);
2. write the arithmetic task (reasoning traces) to JSONL;
3. SFT a cold start on the traces (long enough that most of GRPO's groups mix right and wrong
   answers; sampling at T=1 still leaves room for RL to improve);
4. evaluate held-out pass@k: greedy, and sampled at temperature 1 with n samples per prompt;
5. GRPO with the exact-answer verifier, starting from the SFT checkpoint (dynamic sampling keeps
   only groups whose answers differ, the ones that carry a gradient);
6. evaluate again, print a before/after table, write ``summary.json`` and ``report.html``.

Everything lands in one run directory (``--out``): ``model/``, ``data/``, ``sft/``, ``rl/``,
``evals/{before,after}/eval.json``, ``summary.json``, ``report.html``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posttrain.demo.stages import timed
from posttrain.errors import UserError

# Sizes: the full demo (2 CPU cores, ~5 minutes) and a smoke version for tests.
# Two-digit addition with a digit-by-digit trace: ~55 tokens per completion (up to 66), so
# generation gets 80 new tokens. Many small SFT batches learn faster per token than a few large.
# SFT: 400 steps at lr 1.5e-3. At 3e-3 the model sat on a loss plateau (right format, wrong digits)
# for as long as the seed decided, with gradient spikes: a weak start leaves most groups all wrong,
# with no gradient. At 1.5e-3 every seed measured leaves it by step ~200 and starts GRPO at sampled
# pass@1 0.5-0.9, with room to sharpen; 1200 steps there solve the task outright (docs/study.md).
# GRPO: lr 1e-4 for 90 steps. From 1e-3 up the tiny model collapsed within 10-20 steps; at 1e-4 the
# gain accumulates slowly, so the steps are what the demo buys (docs/study.md).
# 500 held-out problems: the bootstrap interval narrows as 1/sqrt(n), and eval is cheap next to training.
PROFILES = {
    "full": dict(size="tiny", ops="+", digits=2, n_train=4000, n_eval=500, sft_steps=400, sft_tokens=1024,
                 sft_lr=1.5e-3, rl_steps=90, prompts_per_step=16, group_size=8, rl_lr=1e-4, max_new_tokens=80,
                 eval_samples=8),
    "quick": dict(size="nano", ops="+", digits=2, n_train=200, n_eval=16, sft_steps=6, sft_tokens=1024,
                  sft_lr=3e-3, rl_steps=2, prompts_per_step=4, group_size=4, rl_lr=1e-4, max_new_tokens=16,
                  eval_samples=2),
}
# What a profile that is only a smoke test says before it starts and under its table, so that a
# table of zeros and a warning about equal-reward groups read as expected, not as a broken install.
SMOKE_NOTE = {
    "quick": ("a smoke run: {sft_steps} SFT steps and {rl_steps} GRPO steps on the nano model check that every "
              "stage runs; it is not expected to learn (pass rates near 0, groups with equal rewards and a "
              "zero-variance warning are normal here). `posttrain demo` is the run that learns."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    parser.add_argument("--task", choices=("arithmetic", "code"), default="arithmetic",
                        help="arithmetic (GRPO on two-digit sums) or code (the seed experiment in miniature: "
                             "mid-training on Python source, SFT, GRPO and Dr. GRPO, the seed's table; docs/seed.md)")
    parser.add_argument("--profile", choices=list(PROFILES), default="full",
                        help="full (the real demo) or quick (a smoke run in seconds)")
    parser.add_argument("--model", choices=("smollm2",), default=None,
                        help="--task code only: run the seed's direct arm on this real model and the real "
                             "benchmark files instead of the miniature (docs/seed.md)")
    parser.add_argument("--arms", default=None, metavar="ARM,...",
                        help="--model only: the seed's arms to run, direct (default), reasoning or direct,reasoning "
                             "(the reasoning arm starts from a full fine-tune on <think> traces; docs/seed.md)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0, help="seed of data, models and sampling (default 0)")
    seeds.add_argument("--seeds", default=None, metavar="S,S,...",
                       help="--task code only: several seeds in one command, e.g. 0,1,2: the start built once "
                            "(with the first seed) in --out, each seed's RL and evaluations in OUT/seed-S/, "
                            "a finished seed not run again, and a combined report (docs/seed.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    if args.model and args.task != "code":
        raise UserError(f"--model {args.model}: only --task code runs on a real model")
    if args.arms is not None and not args.model:
        raise UserError(f"--arms {args.arms}: only the real-model demo (--task code --model M) chooses its arms; "
                        "the miniature runs both")
    if args.seeds is not None and args.task != "code":
        raise UserError(f"--seeds {args.seeds}: only --task code runs several seeds in one command")
    if args.task == "code" and args.model:
        from posttrain.demo.code_real import run as run_real

        return run_real(args)
    if args.task == "code":
        from posttrain.demo.code import run as run_code

        return run_code(args)
    p = PROFILES[args.profile] | {"progress": not args.no_progress}
    out = Path(args.out)
    t0 = time.perf_counter()
    stages: dict[str, dict] = {}
    note = SMOKE_NOTE.get(args.profile, "").format(**p)
    if note:
        print(f"[demo] {note}")
    paths = timed(stages, "prepare", prepare, out, p, args.seed)
    sft_ckpt = timed(stages, "sft", stage_sft, out, p, paths, args)
    before = timed(stages, "eval_before", evaluate_checkpoint, sft_ckpt, out, "before", p, args.seed)
    rl_ckpt = timed(stages, "rl", stage_rl, out, p, paths, sft_ckpt, args)
    after = timed(stages, "eval_after", evaluate_checkpoint, rl_ckpt, out, "after", p, args.seed)
    summary = finish(out, before, after, time.perf_counter() - t0, stages)
    print_table(summary)
    if note:
        print(f"[demo] {note}")  # again under the table of zeros it explains
    return 0


def prepare(out: Path, p: dict, seed: int) -> dict:
    from posttrain.models.tiny import build_tiny
    from posttrain.tasks.arithmetic import write_arithmetic

    print(f"[demo] building the embedded {p['size']} model and the arithmetic task in {out}")
    model_dir = build_tiny(out / "model", p["size"], seed=seed)
    data = write_arithmetic(out / "data", n_train=p["n_train"], n_eval=p["n_eval"], seed=seed,
                            digits=p["digits"], ops=p["ops"], fmt="trace")
    return {"model": str(model_dir), **{k: str(v) for k, v in data.items()}}


def stage_sft(out: Path, p: dict, paths: dict, args) -> str:
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, run_sft

    print(f"[demo] SFT cold start: {p['sft_steps']} steps on reasoning traces")
    cfg = load_config(SFTConfig, None, [
        f"model.path={paths['model']}", f"data.path={paths['train']}", f"data.eval_path={paths['eval']}",
        "data.max_len=128", f"data.tokens_per_batch={p['sft_tokens']}", f"optim.lr={p['sft_lr']}", "optim.warmup_steps=20",
        f"num_steps={p['sft_steps']}", f"eval_every={max(p['sft_steps'] // 4, 1)}", "save_every=0",
        f"seed={args.seed}", f"out_dir={out / 'sft'}", f"logging.progress={not args.no_progress}"])
    return run_sft(cfg)["checkpoint"]


def stage_rl(out: Path, p: dict, paths: dict, sft_ckpt: str, args) -> str:
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl
    from posttrain.tracking import latest_checkpoint

    print(f"[demo] GRPO: {p['rl_steps']} steps x {p['prompts_per_step']} prompts x G={p['group_size']}")
    cfg = load_config(RLConfig, None, [
        f"model.path={sft_ckpt}", f"data.path={paths['prompts_train']}", f"data.eval_path={paths['prompts_eval']}",
        "data.eval_max_prompts=100",
        f"rollout.group_size={p['group_size']}", f"rollout.max_new_tokens={p['max_new_tokens']}", "rollout.temperature=1.0",
        "algorithm=grpo", "verifier=arithmetic", f"prompts_per_step={p['prompts_per_step']}",
        f"num_steps={p['rl_steps']}", f"optim.lr={p['rl_lr']}", "optim.beta2=0.999",
        "optim.warmup_steps=10", "optim.schedule=cosine", "micro_batch_tokens=8192",
        # Most groups of a weak start are all-wrong: sample more prompts until every group can teach.
        "dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=3",
        f"eval_every={max(p['rl_steps'] // 3, 1)}", "save_every=0", f"seed={args.seed}",
        f"out_dir={out / 'rl'}", f"logging.progress={not args.no_progress}"])
    run_rl(cfg)
    return str(latest_checkpoint(out / "rl"))


def evaluate_checkpoint(ckpt: str, out: Path, label: str, p: dict, seed: int) -> dict:
    """Held-out pass@k of a checkpoint with `posttrain eval`'s runner: greedy (n=1) and sampled at
    T=1 (n=eval_samples). The same numbers come from ``posttrain eval`` with ``evals/LABEL/config.yaml``."""
    from posttrain.config import save_config
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval

    print(f"[demo] held-out eval ({label}): {p['n_eval']} problems, greedy and {p['eval_samples']} samples at T=1")
    cfg = EvalConfig(
        model=ckpt, label=label, seed=seed, out_dir=str(out / "evals" / label),
        benchmarks=[BenchmarkConfig(kind="arithmetic", num_problems=p["n_eval"], digits=p["digits"], ops=p["ops"])],
        profiles=[DecodingProfile(name="greedy", max_new_tokens=p["max_new_tokens"]),
                  DecodingProfile(name="sampled", temperature=1.0, n=p["eval_samples"],
                                  max_new_tokens=p["max_new_tokens"])])
    results = run_eval(cfg, show_progress=p.get("progress", True))
    save_config(cfg, out / "evals" / label / "config.yaml")
    return {r.profile: {f"pass@{x.k}": (x.mean, x.low, x.high) for x in r.pass_at_k} for r in results}


def finish(out: Path, before: dict, after: dict, seconds: float, stages: dict) -> dict:
    rows = [{"metric": f"{profile} {k}", "before": before[profile][k][0], "after": after[profile][k][0],
             "before_ci": before[profile][k][1:], "after_ci": after[profile][k][1:]}
            for profile in ("greedy", "sampled") for k in before[profile]]
    summary = {"out_dir": str(out), "seconds": seconds, "stages": stages, "table": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_report(out)
    return summary


def write_report(out: Path) -> None:
    from posttrain.eval.report import write_report as render

    render([out], out / "report.html")
    print(f"[demo] report: {out / 'report.html'}")


def with_interval(mean: float, ci) -> str:
    return f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out arithmetic, before vs after GRPO ({summary['seconds'] / 60:.1f} min)",
                  caption="in brackets: the 95% bootstrap interval over the held-out problems")
    for col in ("metric", "after SFT", "after GRPO", "change"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for r in summary["table"]:
        table.add_row(r["metric"], with_interval(r["before"], r["before_ci"]), with_interval(r["after"], r["after_ci"]),
                      f"{r['after'] - r['before']:+.3f}")
    Console().print(table)
    print(f"[demo] everything is in {summary['out_dir']}")
