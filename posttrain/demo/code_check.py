"""Did the code demo's RL learn its training task? The start's and the end's sampled pass rate on one
fixed draw of training problems (8 samples each at T = 1, the format bonus left out), paired by problem.

Why not the per-step training reward: each step draws other problems, so its pass fraction moves by
±0.1 from step to step with the draw alone, and a window of first and last steps can fall while the
policy gets better on every problem. Only the training split is read, never a benchmark."""

from __future__ import annotations

import random
from pathlib import Path

CHECK_SAMPLES = 8
CHECK_TEMPERATURE = 1.0
"""The check's decoding, here and in the RL runs that track the same draw (`posttrain.demo.code`)."""


def train_sample(train_file: str | Path, out_dir: Path, count: int, seed: int) -> Path:
    """``count`` training problems drawn with ``seed`` from ``train_file`` (it lists them template by
    template, so a prefix would be a few templates only), written to ``out_dir``."""
    rows = Path(train_file).read_text().splitlines()
    random.Random(seed).shuffle(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"train_check_{count}.jsonl"
    path.write_text("\n".join(rows[:count]) + "\n")
    return path


def train_pass(model: str, problems: Path, out_dir: Path, arm: str, tokens: int, seed: int):
    """The sampled pass rate of ``model`` on ``problems`` (an ``EvalResult``); reused when written."""
    from posttrain.eval.results import read_eval_json
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval

    if not (out_dir / "eval.json").is_file():
        cfg = EvalConfig(model=model, label=out_dir.name, seed=seed, out_dir=str(out_dir),
                         benchmarks=[BenchmarkConfig(name="train", kind="kodcode", path=str(problems))],
                         profiles=[DecodingProfile(name=f"t{CHECK_TEMPERATURE:g}", temperature=CHECK_TEMPERATURE,
                                                   n=CHECK_SAMPLES, max_new_tokens=tokens)],
                         ks=[1], thinking=arm == "reasoning")
        run_eval(cfg, show_progress=False)
    return read_eval_json(out_dir / "eval.json")[0]


def start_to_end(start: str, end: str, problems: Path, out_dir: Path, arm: str, tokens: int, seed: int):
    """The paired change from ``start`` to ``end`` (a ``Cell``: pass@1 in percent, its 95% interval)."""
    from posttrain.eval.seed_table import cell

    before = train_pass(start, problems, out_dir / f"start-{arm}", arm, tokens, seed)
    after = train_pass(end, problems, out_dir / f"end-{arm}", arm, tokens, seed)
    return cell(before, after)


def describe(c) -> str:
    return f"{c.before:.1f} → {c.after:.1f} ({c.change:+.1f} [{c.low:+.1f}, {c.high:+.1f}])"
