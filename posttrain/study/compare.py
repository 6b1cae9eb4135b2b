"""`posttrain study compare`: SFT vs RLVR vs on-policy distillation, from one start, on one budget.

The seeds tell post-training apart by two questions: *who generates the trajectory* the student
trains on, and *where the signal comes from*. This study holds everything else fixed and runs the
three answers side by side on the embedded arithmetic task:

| arm | trajectory from | signal |
|---|---|---|
| (a) sft | the teacher (its greedy traces) | next-token targets |
| (b) grpo | the student | the answer verifier, one sparse reward per sample |
| (c) distill | the student | the teacher's distribution at every token (reverse KL) |

Design choices:
- One start: a *weak* student, the `tiny` model SFT'd briefly on the task's traces. One teacher:
  the `small` model SFT'd well (`posttrain.rl.teacher`, cached).
- One budget, in **trajectory tokens trained on**: completion tokens the student generated (b, c),
  or teacher-trace completion tokens (a, which generates none). Each arm stops when it reaches
  it; time (the sum of the arm's step times) is measured and reported, not equalised: it is too
  noisy on shared CPUs to be a fair budget.
- Curves: every arm checkpoints at about four points of the budget; each checkpoint's held-out
  greedy pass@1 is measured the same way and written as a tiny run ``curves/<arm>`` whose
  ``step`` is the trajectory tokens consumed, so the report draws all arms on one chart.
- Final numbers come from ``posttrain.eval`` (`run_eval`): held-out greedy pass@1 and sampled
  (T=1) pass@k, per arm, plus the start and the teacher as reference rows.
- Deterministic given ``--seed``: data, initialisations, sampling and batch order are all seeded.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from posttrain.config import load_config

# smoke: CI, a couple of minutes. full: the real comparison, ~12 minutes on 2 cores including the
# teacher build (~5 once the teacher is cached). Full-profile choices, as measured on this task:
# - the start (tiny, 250 SFT steps at lr 1e-3) solves ~30% greedily and ~1 in 10 samples at T=1:
#   weak, yet GRPO's groups of 8 are not all wrong (at 200 steps, 6.5% greedy, nearly all are);
# - 64 trajectories per update in every arm (SFT: 4,096 packed tokens ~ 60 traces);
# - GRPO with the demo's recipe: lr 1e-4 after 10 warmup steps, cosine over the steps the budget is
#   expected to take, dynamic sampling (rl_rounds generation rounds at most; 0: off). Constant lr
#   1e-4 without warmup took the start's greedy pass@1 from 0.30 to 0.04 in 30 steps.
PROFILES: dict[str, dict] = {
    "smoke": dict(student_size="nano", teacher_size="nano", teacher_steps=12, n_train=400, n_eval=16,
                  student_steps=4, student_lr=3e-3, student_tokens=2048, budget=1200, samples_per_step=16,
                  max_new_tokens=24, k=2, sft_tokens=2048, sft_lr=3e-3, rl_lr=1e-3, rl_warmup=0, rl_rounds=0,
                  distill_lr=1e-3),
    "full": dict(student_size="tiny", teacher_size="small", teacher_steps=None, n_train=4000, n_eval=200,
                 student_steps=250, student_lr=1e-3, student_tokens=1024, budget=200_000, samples_per_step=64,
                 max_new_tokens=80, k=8, sft_tokens=4096, sft_lr=1e-4, rl_lr=1e-4, rl_warmup=10, rl_rounds=3,
                 distill_lr=1e-4),
}
ARMS = ("sft", "grpo", "distill")
NEEDS_TEACHER = ("sft", "distill")
FRAMING = {"start": ("-", "-"), "teacher": ("-", "-"),
           "sft": ("teacher", "next-token targets"),
           "grpo": ("student", "verifier reward"),
           "distill": ("student", "teacher per-token reverse KL")}
CURVE_POINTS = 4
CURVE_KEY = "eval/heldout/greedy/pass@1"
# Longest training sequence (prompt + trace); token budgets are counted with the same limit SFT uses.
MAX_LEN = 128


@dataclasses.dataclass
class Study:
    out: Path
    profile: dict
    seed: int
    progress: bool
    data: dict
    teacher: str | None
    teacher_steps: int | None
    start: str


def run_compare(out_dir: str | Path, profile: str = "full", seed: int = 0, progress: bool = True,
                printer=print, teacher_steps: int | None = None, arms: tuple[str, ...] = ARMS) -> dict:
    """Run the study's ``arms`` in ``out_dir`` (re-running reuses finished parts); returns the summary.
    The teacher is built, and evaluated as a reference row, only when an arm needs it."""
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    t0 = time.perf_counter()
    p = PROFILES[profile] | ({"teacher_steps": teacher_steps} if teacher_steps else {})
    chosen = [a for a in ARMS if a in arms]
    study = prepare(Path(out_dir), p, seed, progress, printer, teacher=any(a in NEEDS_TEACHER for a in chosen))
    runs = {"start": {"checkpoint": study.start, "tokens": 0, "seconds": 0.0}}
    runners = {"sft": arm_sft, "grpo": arm_grpo, "distill": arm_distill}
    for name in chosen:
        printer(f"[study] arm {name}: budget {study.profile['budget']} trajectory tokens")
        runs[name] = runners[name](study)
        runs[name]["seconds"] = train_seconds(Path(runs[name]["run_dir"]))
    if study.teacher is not None:
        runs["teacher"] = {"checkpoint": study.teacher, "tokens": None, "seconds": None}
    write_curves(study, runs, chosen)
    rows = final_evals(study, runs)
    summary = {"profile": profile, "seed": seed, "budget_tokens": study.profile["budget"],
               "teacher_steps": study.teacher_steps,
               "budget_unit": "trajectory tokens trained on", "seconds": time.perf_counter() - t0,
               "rows": rows}
    (study.out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_study_report(study.out)
    return summary


# ------------------------------------------------------------------------------- preparation

def prepare(out: Path, p: dict, seed: int, progress: bool, printer, teacher: bool = True) -> Study:
    """The task, the teacher (cached; only if ``teacher``) and the weak student start."""
    from posttrain.models.tiny import build_tiny
    from posttrain.rl.teacher import TASK, make_teacher
    from posttrain.tasks.arithmetic import write_arithmetic

    out.mkdir(parents=True, exist_ok=True)
    data = {k: str(v) for k, v in write_arithmetic(out / "data", n_train=p["n_train"], n_eval=p["n_eval"], seed=seed,
                                                    digits=TASK["digits"], ops=TASK["ops"], fmt="trace").items()}
    checkpoint = steps = None
    if teacher:
        built = make_teacher(out / "teacher", size=p["teacher_size"], steps=p["teacher_steps"], seed=seed,
                             progress=progress, printer=printer)
        check_same_teacher(out / "teacher_used.json", built.checkpoint)
        checkpoint, steps = built.checkpoint, built.settings["steps"]
    base = build_tiny(out / "student_base", p["student_size"], seed=seed)
    start = sft(out / "start", base, data["train"], steps=p["student_steps"], lr=p["student_lr"], seed=seed,
                progress=progress, printer=printer, warmup=10, tokens_per_batch=p["student_tokens"])
    return Study(out=out, profile=p, seed=seed, progress=progress, data=data, teacher=checkpoint,
                 teacher_steps=steps, start=start)


def check_same_teacher(record: Path, checkpoint: str) -> None:
    """Finished arms are reused on a re-run, so they must have been run with this teacher."""
    from posttrain.errors import UserError

    if record.is_file() and json.loads(record.read_text())["checkpoint"] != checkpoint:
        raise UserError(f"{record}: this study directory was run with the teacher "
                        f"{json.loads(record.read_text())['checkpoint']}, not {checkpoint}; use a new --out")
    record.write_text(json.dumps({"checkpoint": checkpoint}))


def sft(run_dir: Path, model: str | Path, data_path: str, *, steps: int, lr: float, seed: int, progress: bool,
        printer, warmup: int = 0, save_every: int = 0, schedule: str = "cosine", tokens_per_batch: int = 2048) -> str:
    """Run (or reuse a finished) SFT run; returns its last checkpoint."""
    from posttrain.tracking import latest_checkpoint
    from posttrain.train.sft import SFTConfig, run_sft

    cfg = load_config(SFTConfig, None, [
        f"model.path={model}", f"data.path={data_path}", f"data.max_len={MAX_LEN}",
        f"data.tokens_per_batch={tokens_per_batch}",
        f"optim.lr={lr}", f"optim.warmup_steps={warmup}", f"optim.schedule={schedule}", f"num_steps={steps}",
        f"save_every={save_every}", "keep_last=0", f"seed={seed}", f"out_dir={run_dir}",
        f"logging.progress={progress}"])
    run_sft(cfg, printer=printer)
    return str(latest_checkpoint(run_dir))


# --------------------------------------------------------------------------------------- arms

def arm_sft(study: Study) -> dict:
    """(a) More SFT of the start on teacher traces: one pass over ``budget`` tokens of them."""
    traces = teacher_traces(study)
    tokens_per_batch = study.profile["sft_tokens"]
    per_step = sft_loss_tokens_per_step(study.start, traces, study.seed, tokens_per_batch)
    steps = len(per_step)
    run_dir = study.out / "arms" / "sft"
    ckpt = sft(run_dir, study.start, traces, steps=steps, lr=study.profile["sft_lr"], seed=study.seed,
               progress=study.progress, printer=lambda *_: None, save_every=max(1, steps // CURVE_POINTS),
               schedule="constant", tokens_per_batch=tokens_per_batch)
    cumulative = [sum(per_step[:i + 1]) for i in range(steps)]
    (run_dir / "tokens.json").write_text(json.dumps(cumulative))
    return {"checkpoint": ckpt, "tokens": cumulative[-1], "run_dir": str(run_dir)}


def teacher_traces(study: Study) -> str:
    """The teacher's greedy completions of training prompts, until they hold ``budget`` loss tokens
    (counted as SFT will tokenize them: a sampled id sequence can re-tokenize shorter)."""
    from posttrain.data.records import SFTExample, write_jsonl
    from posttrain.data.sft import tokenize_sft_report
    from posttrain.models.hf import load_tokenizer
    from posttrain.rl.loop import encode_prompts, load_prompt_records
    from posttrain.rollout import SamplingParams, TorchEngine

    path = study.out / "arms" / "teacher_traces.jsonl"
    if path.is_file():
        return str(path)
    tokenizer = load_tokenizer(study.teacher)
    engine = TorchEngine(study.teacher, tokenizer=tokenizer)
    examples = load_prompt_records(study.data["prompts_train"])
    records, tokens = [], 0
    sampling = SamplingParams(temperature=0.0, max_new_tokens=study.profile["max_new_tokens"])
    for start in range(0, len(examples), 256):
        chunk = examples[start:start + 256]
        ro = engine.generate(encode_prompts(tokenizer, chunk, True), 1, sampling)
        for ex, text in zip(chunk, ro.completion_texts()):
            if tokens < study.profile["budget"]:
                records.append({"prompt": ex["prompt"], "completion": text, "answer": ex["answer"]})
                kept, _ = tokenize_sft_report([SFTExample(prompt=ex["prompt"], completion=text)], tokenizer,
                                              max_len=MAX_LEN, use_chat_template=True)
                tokens += sum(sum(k.loss_mask[1:]) for k in kept)
        if tokens >= study.profile["budget"]:
            break
    write_jsonl(path, records)
    return str(path)


def sft_loss_tokens_per_step(model: str, data_path: str, seed: int, tokens_per_batch: int) -> list[int]:
    """Loss tokens of each optimizer step of one pass over ``data_path`` (the plan run_sft will follow)."""
    from posttrain.models.hf import load_tokenizer
    from posttrain.train.sft import BatchStream, SFTDataConfig, load_sft_data

    data_cfg = SFTDataConfig(path=data_path, max_len=MAX_LEN, tokens_per_batch=tokens_per_batch)
    tokenizer = load_tokenizer(model)
    examples = load_sft_data(data_cfg, tokenizer, data_path)
    stream = BatchStream(examples, pack=True, tokens_per_batch=tokens_per_batch, seq_len=MAX_LEN, seed=seed,
                         pad_id=tokenizer.pad_token_id)
    return [b.num_loss_tokens for b in stream.all_batches()]


def expected_steps(p: dict) -> int:
    """Steps an on-policy arm takes to its budget, assuming completions of ~half the length limit."""
    return max(1, p["budget"] // (p["samples_per_step"] * max(1, p["max_new_tokens"] // 2)))


def on_policy_overrides(study: Study, name: str, lr: float, group_size: int) -> list[str]:
    p = study.profile
    est_steps = expected_steps(p)  # checkpoints at about CURVE_POINTS points of the budget
    return [f"model.path={study.start}", f"data.path={study.data['prompts_train']}",
            f"rollout.group_size={group_size}", f"rollout.max_new_tokens={p['max_new_tokens']}",
            f"prompts_per_step={p['samples_per_step'] // group_size}", f"num_steps={est_steps * 4}",
            f"optim.lr={lr}", "optim.warmup_steps=0", "optim.schedule=constant",
            "eval_every=0",
            f"save_every={max(1, est_steps // CURVE_POINTS)}", "keep_last=0", f"seed={study.seed}",
            f"out_dir={study.out / 'arms' / name}", f"logging.progress={study.progress}"]


def arm_grpo(study: Study) -> dict:
    """(b) GRPO with the answer verifier, driven to the token budget."""
    from posttrain.rl.config import RLConfig
    from posttrain.rl.loop import drive_rl, rl_step, setup

    p = study.profile
    recipe = [f"optim.warmup_steps={p['rl_warmup']}", "optim.beta2=0.999"]  # the demo's RL setting
    if p["rl_rounds"]:  # groups whose answers differ, decaying lr over the steps the budget takes
        recipe += ["dynamic_sampling.enabled=true", f"dynamic_sampling.max_rounds={p['rl_rounds']}",
                   "optim.schedule=cosine", f"num_steps={expected_steps(p)}"]
    cfg = load_config(RLConfig, None, [*on_policy_overrides(study, "grpo", p["rl_lr"], 8),
                                       "algorithm=grpo", "verifier=arithmetic", *recipe])
    run = setup(cfg)
    drive_rl(run, rl_step, config=cfg, max_tokens=study.profile["budget"], name="grpo", printer=lambda *_: None)
    return on_policy_result(run.run_dir)


def arm_distill(study: Study) -> dict:
    """(c) On-policy distillation from the teacher (full reverse KL), driven to the token budget."""
    from posttrain.rl.distill import DistillConfig, run_distill

    cfg = load_config(DistillConfig, None, [
        *on_policy_overrides(study, "distill", study.profile["distill_lr"], 4),
        f"teacher.path={study.teacher}", "loss=full", f"max_tokens={study.profile['budget']}"])
    run_distill(cfg, printer=lambda *_: None)
    return on_policy_result(Path(cfg.out_dir))


def on_policy_result(run_dir: Path) -> dict:
    from posttrain.tracking import latest_checkpoint, read_metrics

    rows = [r for r in read_metrics(run_dir) if "tokens/total" in r]
    return {"checkpoint": str(latest_checkpoint(run_dir)), "tokens": rows[-1]["tokens/total"] if rows else 0,
            "run_dir": str(run_dir)}


def train_seconds(run_dir: Path) -> float:
    """Sum of the run's step times (a resumed run counts each step once)."""
    from posttrain.tracking import read_metrics

    return sum(r.get("time/step_s", 0.0) for r in read_metrics(run_dir))


# ------------------------------------------------------------------------------ evaluation

def tokens_at_step(arm: str, run_dir: Path) -> dict[int, int]:
    """Trajectory tokens consumed after each step of an arm's run."""
    from posttrain.tracking import read_metrics

    if arm == "sft":
        return {i + 1: t for i, t in enumerate(json.loads((run_dir / "tokens.json").read_text()))}
    return {r["step"]: r["tokens/total"] for r in read_metrics(run_dir) if "tokens/total" in r}


def write_curves(study: Study, arms: dict, chosen: list[str]) -> None:
    """Held-out greedy pass@1 of every checkpoint, as runs ``curves/<arm>`` with step = tokens."""
    from posttrain.rl.teacher import greedy_pass_at_1
    from posttrain.tracking import MetricsLogger

    limit, max_new = study.profile["n_eval"], study.profile["max_new_tokens"]
    start = greedy_pass_at_1(study.start, study.data["prompts_eval"], limit, max_new)
    for arm in chosen:
        run_dir = Path(arms[arm]["run_dir"])
        tokens = tokens_at_step(arm, run_dir)
        logger = MetricsLogger(study.out / "curves" / arm)
        logger.log({"step": 0, CURVE_KEY: start})
        for ckpt in sorted((run_dir / "checkpoints").glob("step-*"), key=lambda c: int(c.name[5:])):
            step = int(ckpt.name[5:])
            logger.log({"step": tokens[step], "train_step": step,
                        CURVE_KEY: greedy_pass_at_1(str(ckpt), study.data["prompts_eval"], limit, max_new)})
        logger.close()


def final_evals(study: Study, arms: dict) -> list[dict]:
    """`run_eval` of every model on the held-out split: greedy pass@1 and sampled pass@1..k."""
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval
    from posttrain.rl.teacher import TASK

    p = study.profile
    rows = []
    for name in arms:  # start, the arms run, the teacher if built
        cfg = EvalConfig(model=arms[name]["checkpoint"], out_dir=str(study.out / "evals" / name), label=name,
                         seed=study.seed,
                         benchmarks=[BenchmarkConfig(kind="arithmetic", ops=TASK["ops"], digits=TASK["digits"],
                                                     num_problems=p["n_eval"])],
                         profiles=[DecodingProfile(name="greedy", max_new_tokens=p["max_new_tokens"]),
                                   DecodingProfile(name="sampled", temperature=1.0, n=p["k"],
                                                   max_new_tokens=p["max_new_tokens"])])
        results = {r.profile: {row.k: row.mean for row in r.pass_at_k} for r in run_eval(cfg, show_progress=False)}
        trajectory, signal = FRAMING[name]
        rows.append({"run": name, "trajectory": trajectory, "signal": signal, "tokens": arms[name]["tokens"],
                     "seconds": arms[name]["seconds"], "greedy_pass@1": results["greedy"][1],
                     "sampled_pass@1": results["sampled"][1], f"pass@{p['k']}": results["sampled"][p["k"]],
                     "trace_nll": trace_nll(arms[name]["checkpoint"], study.data["eval"])})
    return rows


def trace_nll(ckpt: str, data_path: str) -> float:
    """Held-out loss (nats per completion token) on the task's reference traces: a graded measure of
    how well a model knows the correct reasoning, informative where pass@1 is still near zero."""
    from posttrain.models.hf import ModelConfig, load_model, load_tokenizer
    from posttrain.train.sft import BatchStream, SFTDataConfig, SFTTrainer, load_sft_data

    tokenizer = load_tokenizer(ckpt)
    examples = load_sft_data(SFTDataConfig(path=data_path, max_len=MAX_LEN), tokenizer, data_path)
    batches = BatchStream(examples, pack=True, tokens_per_batch=2048, seq_len=MAX_LEN, seed=0,
                          pad_id=tokenizer.pad_token_id).all_batches()
    trainer = SFTTrainer(load_model(ModelConfig(path=ckpt), trainable=False), None, None, grad_clip=0.0)
    return trainer.eval_loss(batches)


def write_study_report(out: Path) -> None:
    from posttrain.eval.report import write_report

    write_report([out], out / "report.html")


def format_table(summary: dict) -> str:
    """The study as a Markdown table (what the CLI prints and docs/study.md quotes)."""
    rows = summary["rows"]
    k_key = next(k for k in rows[0] if k.startswith("pass@"))
    head = ["run", "trajectory from", "signal", "tokens", "train s", "greedy pass@1", "sampled pass@1", k_key,
            "trace NLL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tokens = "-" if r["tokens"] is None else f"{r['tokens']:,}"
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        cells = [r["run"], r["trajectory"], r["signal"], tokens, secs, f"{r['greedy_pass@1']:.3f}",
                 f"{r['sampled_pass@1']:.3f}", f"{r[k_key]:.3f}", f"{r['trace_nll']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def budget_note(summary: dict) -> str:
    minutes = summary["seconds"] / 60
    teacher = f"teacher SFT steps {summary['teacher_steps']}; " if summary["teacher_steps"] else ""
    return (f"budget: {summary['budget_tokens']:,} {summary['budget_unit']} per arm; "
            f"{teacher}profile {summary['profile']}, seed {summary['seed']}, "
            f"{minutes:.1f} min in all")

