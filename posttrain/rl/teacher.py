"""The embedded teacher: the `small` tiny model, SFT'd well on arithmetic reasoning traces.

Built once and cached: ``DIR/teacher.json`` records the settings it was built with, the
checkpoint and its held-out greedy pass@1; a later call with the same settings reuses it, a call
with other settings rebuilds it. An interrupted build resumes from its last SFT checkpoint. Layout: ``DIR/base`` (the untrained model), ``DIR/data`` (the
task), ``DIR/sft`` (the SFT run; its last checkpoint is the teacher).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

# The task every study model shares, and the teacher's training budget.
# Addition traces go column by column (one-digit sums and carries), which small models learn fastest.
# Completions run to ~66 tokens, so every generation here allows MAX_NEW_TOKENS.
TASK = dict(ops="+", digits=2, n_train=4000, n_eval=200)
MAX_NEW_TOKENS = 80
# lr 1e-3 with cosine decay: at 3e-3 these models sit on a loss plateau (~0.25-0.6 nats/token,
# greedy pass@1 near 0 after 1,000 steps); at 1e-3 the tiny model passes 0.8 by step 500.
TEACHER_SFT = dict(size="small", steps=600, lr=1e-3, tokens_per_batch=1024, max_len=128, save_every=100)


@dataclasses.dataclass
class Teacher:
    checkpoint: str
    data_dir: str
    pass_at_1: float
    settings: dict


def write_task(out: Path, seed: int) -> dict[str, str]:
    from posttrain.tasks.arithmetic import write_arithmetic

    paths = write_arithmetic(out, n_train=TASK["n_train"], n_eval=TASK["n_eval"], seed=seed,
                             digits=TASK["digits"], ops=TASK["ops"], fmt="trace")
    return {k: str(v) for k, v in paths.items()}


def make_teacher(out_dir: str | Path, *, size: str = "small", steps: int | None = None, seed: int = 0,
                 progress: bool = True, printer=print) -> Teacher:
    """Build (or reuse) the teacher in ``out_dir``; returns its checkpoint and held-out pass@1."""
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    out = Path(out_dir)
    settings = {**TASK, **TEACHER_SFT, "size": size, "steps": steps or TEACHER_SFT["steps"], "seed": seed}
    record = out / "teacher.json"
    if record.is_file():
        cached = json.loads(record.read_text())
        if cached["settings"] == settings and Path(cached["checkpoint"], "config.json").is_file():
            printer(f"[teacher] reusing {cached['checkpoint']}")
            return Teacher(**cached)
    teacher = _build(out, settings, progress, printer)
    record.write_text(json.dumps(dataclasses.asdict(teacher), indent=1))
    return teacher


def _build(out: Path, s: dict, progress: bool, printer) -> Teacher:
    from posttrain.config import load_config
    from posttrain.models.tiny import build_tiny
    from posttrain.tracking import latest_checkpoint
    from posttrain.train.sft import SFTConfig, run_sft

    printer(f"[teacher] SFT of the {s['size']} model: {s['steps']} steps on arithmetic traces in {out}")
    base = build_tiny(out / "base", s["size"], seed=s["seed"])
    data = write_task(out / "data", s["seed"])
    cfg = load_config(SFTConfig, None, [
        f"model.path={base}", f"data.path={data['train']}", f"data.max_len={s['max_len']}",
        f"data.tokens_per_batch={s['tokens_per_batch']}", f"optim.lr={s['lr']}", "optim.warmup_steps=10",
        f"num_steps={s['steps']}", f"save_every={s['save_every']}", "keep_last=0", f"seed={s['seed']}",
        f"out_dir={out / 'sft'}",
        f"logging.progress={progress}"])
    run_sft(cfg, printer=printer)
    # Every checkpoint is kept, so a shorter rebuild still finds the one of its own step.
    exact = out / "sft" / "checkpoints" / f"step-{s['steps']}"
    ckpt = str(exact if exact.is_dir() else latest_checkpoint(out / "sft"))
    pass1 = greedy_pass_at_1(ckpt, data["prompts_eval"])
    printer(f"[teacher] held-out greedy pass@1 {pass1:.3f}")
    return Teacher(checkpoint=ckpt, data_dir=str(out / "data"), pass_at_1=pass1, settings=s)


def greedy_pass_at_1(ckpt: str, prompts_path: str, limit: int = 200, max_new_tokens: int = MAX_NEW_TOKENS) -> float:
    """Held-out greedy pass@1 of a checkpoint with the arithmetic verifier."""
    from posttrain.models.hf import load_tokenizer
    from posttrain.verifiers.evaluate import evaluate
    from posttrain.rl.loop import encode_prompts, load_prompt_records
    from posttrain.rollout import SamplingParams, TorchEngine
    from posttrain.verifiers import build_reward

    tokenizer = load_tokenizer(ckpt)
    examples = load_prompt_records(prompts_path)[:limit]
    summary = evaluate(TorchEngine(ckpt, tokenizer=tokenizer), encode_prompts(tokenizer, examples, True),
                       examples, build_reward("arithmetic"), profile="greedy", n=1,
                       sampling=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    return summary.pass_at_k[1]
