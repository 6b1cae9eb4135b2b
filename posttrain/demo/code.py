"""`posttrain demo --task code`: the seed experiment in miniature, on a laptop CPU.

Can RL with verifiable rewards improve code correctness beyond SFT? The seed's question, asked of a
tiny model with every stage the seed has (docs/seed.md):

1. a tokenizer trained on Python source (the interpreter's standard library, read from disk) and
   an embedded tiny Llama mid-trained on that source (raw-mode SFT: loss on every token);
2. an embedded family of small function-writing problems (`posttrain.tasks.code_family`), split by
   problem: training problems in the KodCode format, held-out ones written as HumanEval+ and
   MBPP+ (evalplus), MBPP and LiveCodeBench files;
3. two SFT starts from the mid-trained model, as the seed has two: ``direct`` (the program in a
   fence) and ``reasoning`` (a ``<think>`` plan, then the program), each on the training problems
   with their prompts as each published format's loader renders them;
4. RL with the seed's own recipes, examples/seed_direct.yaml (GRPO, reward 1 iff the KodCode
   pytest tests pass in the sandbox) and examples/seed_reasoning.yaml (Dr. GRPO + 0.05 × code_format),
   overriding only the model, data, lengths, step count, learning rate, LoRA (off: a full fine-tune
   of the tiny model) and engine (in-process); each run tracks its training task on one fixed draw
   of training problems (``data/train_check_48.jsonl``, `eval/train_fixed/t1/pass@1` every 16 steps);
5. the seed's evaluations (greedy non-thinking for direct; T = 0.6 thinking for reasoning) of each
   run's start and end on the held-out files, and the seed's table with paired intervals
   (`posttrain.eval.seed_table`), printed and written to ``report.md`` / ``report.html``.

Everything lands in ``--out``: ``model/``, ``data/``, ``midtrain/``, ``sft-direct/``,
``sft-reasoning/``, ``direct/`` and ``reasoning/`` (the RL runs, with ``evals/before`` and
``evals/after``), ``summary.json``, ``report.html``, ``report.md``. With ``--seeds 0,1,2`` the
start (model, data, mid-training, SFT) is built once and each seed's RL runs and evaluations go to
``OUT/seed-S/`` (`posttrain.demo.seeds`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from posttrain.demo.stages import finish, finished_stage, timed
from posttrain.errors import UserError

# Sizes. The held-out files have ~110 problems (28 HumanEval, 41 MBPP, 44 LiveCodeBench), fixed by
# the family; what the profiles change is how long each stage trains.
# midtrain_chars: standard-library source read for the tokenizer and the mid-training text.
# SFT 600 steps: RL needs a start whose groups have spread. At 150 steps the direct start passed ~4%
# of sampled programs (84% of groups all-fail) and the reasoning start ~2% (its only spread was the
# format bonus); at 600 both pass ~20% per step and 30-60% of groups have spread.
# RL: a full fine-tune (rl_lora False) instead of the recipes' LoRA r=32: on this 3.4M model (hidden
# size 256) a rank-32 adapter is not a small update. 192 steps at lr 1e-4, chosen on the training
# split (bench/seed_mini_sweep.py, docs/seed.md): 24 steps at 3e-5 or 1e-4 raised the pass rate on
# a fixed draw of training problems by only 2-4 points; 192 at 1e-4 raised it 23 -> 29 on the direct
# arm, while 3e-4 moved the policy 8x further in KL by step 40 with no gain and lost pass@8.
# check_problems, check_every: RL tracks its training task on one fixed draw of training problems
# (code_check.train_sample), sampled CHECK_SAMPLES times each at T = 1 every check_every steps, logged
# as eval/train_fixed/t1/pass@1: each step's own reward moves by +-0.1 with its draw of problems alone.
PROFILES = {
    "full": dict(size="tiny", vocab=2048, midtrain_chars=4_000_000, midtrain_steps=100, midtrain_lr=3e-3,
                 sft_steps=600, sft_lr=1.5e-3, rl_steps=192, prompts_per_step=8, group_size=8, rl_lr=1e-4,
                 rl_lora=False, direct_tokens=96, reasoning_tokens=160, eval_samples=4,
                 check_problems=48, check_every=16),
    "quick": dict(size="nano", vocab=1024, midtrain_chars=200_000, midtrain_steps=4, midtrain_lr=3e-3,
                  sft_steps=4, sft_lr=3e-3, rl_steps=1, prompts_per_step=2, group_size=2, rl_lr=1e-3,
                  direct_tokens=24, reasoning_tokens=32, eval_samples=1, eval_problems=3,
                  check_problems=2, check_every=1),
}
SMOKE_NOTE = ("a smoke run: {midtrain_steps} mid-training, {sft_steps} SFT and {rl_steps} RL steps per arm on the "
              "nano model check that every stage runs; it is not expected to learn (every figure near 0). "
              "`posttrain demo --task code` is the run that asks the question.")
RECIPES = {"direct": "seed_direct.yaml", "reasoning": "seed_reasoning.yaml"}
# The seed's benchmark rows (posttrain.eval.seed_table.SEED_ROWS) on the held-out files.
BENCHMARKS = [
    dict(name="humaneval", kind="evalplus", variant="base", path="HumanEvalPlus.jsonl"),
    dict(name="humaneval_plus", kind="evalplus", variant="plus", path="HumanEvalPlus.jsonl"),
    dict(name="mbpp", kind="mbpp", path="mbpp.jsonl"),
    dict(name="mbpp_plus", kind="evalplus", variant="plus", path="MbppPlus.jsonl"),
    dict(name="lcb_easy", kind="livecodebench", difficulty="easy", path="lcb.jsonl"),
    dict(name="lcb_medium", kind="livecodebench", difficulty="medium", path="lcb.jsonl"),
    dict(name="lcb_hard", kind="livecodebench", difficulty="hard", path="lcb.jsonl"),
]


def recipe_path(arm: str) -> Path:
    """The seed's recipe for ``arm``, from the examples/ folder next to the package (a source checkout)."""
    path = Path(__file__).resolve().parents[2] / "examples" / RECIPES[arm]
    if not path.is_file():
        raise UserError(f"{path}: the seed's recipe is missing (demo --task code runs from a source checkout)")
    return path


def run(args: argparse.Namespace) -> int:
    p = PROFILES[args.profile] | {"progress": not args.no_progress}
    out = Path(args.out)
    for arm in RECIPES:
        recipe_path(arm)  # before anything trains
    note = SMOKE_NOTE.format(**p) if args.profile == "quick" else ""
    if note:
        print(f"[demo] {note}")
    if args.seeds is not None:
        from posttrain.demo.seeds import Demo, run_seeds

        run_seeds(args, p, Demo(arms=tuple(RECIPES), build_starts=build_starts, run_seed=run_seed))
    else:
        t0 = time.perf_counter()
        stages: dict[str, dict] = {}
        paths = timed(stages, "prepare", prepare, out, p, args.seed)
        base = timed(stages, "midtrain", stage_midtrain, out, p, paths, args)
        for arm in RECIPES:
            start = timed(stages, f"sft_{arm}", stage_sft, out, p, paths, base, arm, args)
            run_arm(out, p, paths, start, arm, args, stages)
        print(finish(out, stages, time.perf_counter() - t0, tuple(RECIPES)))
    if note:
        print(f"[demo] {note}")
    return 0


def build_starts(out: Path, p: dict, args, stages: dict) -> dict:
    """What every seed of ``--seeds`` starts from, built once in ``out`` with ``args.seed``: the data,
    the mid-trained model and each arm's SFT start."""
    paths = timed(stages, "prepare", prepare, out, p, args.seed)
    base = timed(stages, "midtrain", stage_midtrain, out, p, paths, args)
    starts = {arm: timed(stages, f"sft_{arm}", stage_sft, out, p, paths, base, arm, args) for arm in RECIPES}
    return {"paths": paths, "starts": starts}


def run_seed(out: Path, p: dict, built: dict, args, stages: dict) -> None:
    """One seed's RL runs and evaluations of both arms, into ``out``, from the shared starts."""
    for arm in RECIPES:
        run_arm(out, p, built["paths"], built["starts"][arm], arm, args, stages)


def run_arm(out: Path, p: dict, paths: dict, start: str, arm: str, args, stages: dict) -> None:
    timed(stages, f"rl_{arm}", stage_rl, out, p, paths, start, arm, args)
    timed(stages, f"eval_{arm}", evaluate_arm, out, p, paths, start, arm, args.seed)


def prepare(out: Path, p: dict, seed: int) -> dict:
    from posttrain.data.records import load_records, write_jsonl
    from posttrain.demo.code_check import train_sample
    from posttrain.models.tiny import build_tiny
    from posttrain.tasks.code_family import write_code_family
    from posttrain.tasks.python_source import stdlib_documents

    print(f"[demo] the code task family, {p['midtrain_chars'] / 1e6:.1f} MB of standard-library source, "
          f"a {p['vocab']}-token BPE trained on both and the embedded {p['size']} model in {out}")
    data = {k: str(v) for k, v in write_code_family(out / "data").items()}
    data["train_check"] = str(train_sample(data["train_kodcode"], out / "data", p["check_problems"], seed=0))
    docs = stdlib_documents(p["midtrain_chars"])
    if not docs:
        raise UserError("the interpreter's standard library has no readable .py files to mid-train on")
    data["stdlib"] = str(write_jsonl(out / "data" / "stdlib.jsonl", [{"text": d} for d in docs]))
    # The tokenizer also sees the training prompts and answers (never the held-out files), as a
    # code model's tokenizer has seen instructions next to code.
    sft_text = [r["prompt"] + "\n" + r["completion"] for r in load_records(data["sft_thinking"])]
    model = build_tiny(out / "model", p["size"], seed=seed, corpus=docs + sft_text, vocab_size=p["vocab"])
    return {"model": str(model), **data}


def _sft(out_dir: Path, p: dict, args, settings: list[str]) -> str:
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, run_sft

    cfg = load_config(SFTConfig, None, settings + [
        "optim.warmup_steps=20", "save_every=0", f"seed={args.seed}", f"out_dir={out_dir}",
        f"logging.progress={not args.no_progress}"])
    return finished_stage(cfg) or run_sft(cfg)["checkpoint"]


def stage_midtrain(out: Path, p: dict, paths: dict, args) -> str:
    print(f"[demo] mid-training on Python source: {p['midtrain_steps']} steps")
    return _sft(out / "midtrain", p, args, [
        f"model.path={paths['model']}", f"data.path={paths['stdlib']}", "data.mode=raw", "data.max_len=256",
        "data.tokens_per_batch=4096", f"optim.lr={p['midtrain_lr']}", f"num_steps={p['midtrain_steps']}",
        "eval_every=0"])


def stage_sft(out: Path, p: dict, paths: dict, base: str, arm: str, args) -> str:
    data = paths["sft_thinking" if arm == "reasoning" else "sft_direct"]
    print(f"[demo] SFT start of the {arm} arm: {p['sft_steps']} steps on {data}")
    return _sft(out / f"sft-{arm}", p, args, [
        f"model.path={base}", f"data.path={data}", "data.max_len=320", "data.tokens_per_batch=2048",
        f"optim.lr={p['sft_lr']}", f"num_steps={p['sft_steps']}", "eval_every=0"])


def stage_rl(out: Path, p: dict, paths: dict, start: str, arm: str, args) -> None:
    from posttrain.config import load_config
    from posttrain.demo.code_check import CHECK_SAMPLES, CHECK_TEMPERATURE
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    tokens = p["reasoning_tokens" if arm == "reasoning" else "direct_tokens"]
    print(f"[demo] RL, the {arm} recipe ({RECIPES[arm]}): {p['rl_steps']} steps x {p['prompts_per_step']} "
          f"KodCode prompts x G={p['group_size']}")
    cfg = load_config(RLConfig, recipe_path(arm), [
        f"model.path={start}", "model.device=cpu", f"data.path={paths['train_kodcode']}",
        "rollout.backend=torch", f"rollout.max_new_tokens={tokens}", f"rollout.group_size={p['group_size']}",
        f"prompts_per_step={p['prompts_per_step']}", f"num_steps={p['rl_steps']}", f"optim.lr={p['rl_lr']}",
        f"seed={args.seed}", "save_every=0", f"out_dir={out / arm}", f"logging.progress={not args.no_progress}",
        f"model.lora.enabled={p.get('rl_lora', True)}", f"data.eval_path={paths['train_check']}",
        "data.eval_name=train_fixed", f"eval_samples={CHECK_SAMPLES}", f"eval_temperature={CHECK_TEMPERATURE}",
        f"eval_every={p['check_every']}", *p.get("rl_overrides", ())])
    run_rl(cfg)


def evaluate_arm(out: Path, p: dict, paths: dict, start: str, arm: str, seed: int) -> None:
    """The seed's evaluation of ``arm`` on the held-out files: its SFT start (label before) and its
    RL run (after), into ``ARM/evals/``, where the report's table pairs them."""
    from posttrain.config import save_config
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval

    data = Path(paths["train_kodcode"]).parent
    benches = [BenchmarkConfig(**{**b, "path": str(data / b["path"]), "num_problems": p.get("eval_problems", 0)})
               for b in BENCHMARKS]
    if arm == "direct":
        profile = DecodingProfile(name="greedy", max_new_tokens=p["direct_tokens"])
    else:  # one sample as the seed; a few more per problem make its pass@1 less noisy here
        profile = DecodingProfile(name="t0.6", temperature=0.6, n=p["eval_samples"], max_new_tokens=p["reasoning_tokens"])
    for label, model in (("before", start), ("after", str(out / arm))):
        print(f"[demo] held-out eval of the {arm} arm ({label})")
        cfg = EvalConfig(model=model, label=label, seed=seed, out_dir=str(out / arm / "evals" / label),
                         benchmarks=benches, profiles=[profile], ks=[1], thinking=arm == "reasoning")
        run_eval(cfg, show_progress=p["progress"])
        save_config(cfg, out / arm / "evals" / label / "config.yaml")
