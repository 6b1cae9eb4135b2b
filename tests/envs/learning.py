"""What the learning tests share (tests/envs/test_learning_*.py): learning in environments on an
embedded model (tiny; nano for CI's short runs), the way a user would run it: make the data with
`posttrain make-env-data`, warm-start with `posttrain sft` on the traces, then `posttrain rl` in the
environment; success is measured on held-out problems' episodes. One test file per environment, so
the slow lane's workers (pytest-xdist, a file each) run them side by side."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from posttrain.cli import main
from posttrain.envs.config import EnvConfig
from posttrain.envs.session import EnvSession
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams, TorchEngine
from posttrain.tracking import latest_checkpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def episodes(model_dir, examples, env: EnvConfig, n: int, temperature: float, max_new_tokens: int):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = TorchEngine(str(model_dir), tokenizer=tok)
    return EnvSession(env, tok).episodes(engine, examples, n, SamplingParams(
        temperature=temperature, max_new_tokens=max_new_tokens, seed=1))


def success(eps) -> float:
    return sum(e.outcome.cls is OutcomeClass.PASS for e in eps) / len(eps)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long each stage of a learning test runs, and on which model: the release run whose figures
    the docs quote, or a short one that CI can afford."""

    sft_steps: int = 1000
    """Warm-start SFT steps on good traces."""
    mixed_steps: int = 60
    """SFT steps after it, on traces of which most skip the behaviour the environment rewards."""
    grpo_steps: int = 25
    held_out: int = 64
    """Held-out problems; each is sampled ``samples`` times at T=1 before and after GRPO."""
    samples: int = 4
    size: str = "tiny"
    """`posttrain make-tiny --size`: the nano model's steps cost about an eighth of the tiny one's."""
    sft_lr: float = 1e-3
    """The warm start's learning rate (examples/sft_calculator.yaml's), after ``sft_warmup`` steps."""
    sft_warmup: int = 50
    grpo_lr: float | None = None
    """GRPO's learning rate; None: the example's."""


RELEASE = Schedule()


def warm_start(tmp_path, env: str, schedule: Schedule, *make_data, max_len: int = 160) -> tuple[Path, Path]:
    assert main(["make-tiny", str(tmp_path / "model"), "--size", schedule.size]) == 0
    assert main(["make-env-data", env, str(tmp_path / "data"), *make_data]) == 0
    assert main(["sft", str(EXAMPLES / "sft_calculator.yaml"), f"model.path={tmp_path / 'model'}",
                 f"data.path={tmp_path / 'data' / 'sft_train.jsonl'}", f"num_steps={schedule.sft_steps}",
                 f"optim.lr={schedule.sft_lr}", f"optim.warmup_steps={schedule.sft_warmup}",
                 f"data.max_len={max_len}", "logging.progress=false", f"out_dir={tmp_path / 'sft'}"]) == 0
    return latest_checkpoint(tmp_path / "sft"), tmp_path / "data"


def grpo_args(schedule: Schedule) -> list[str]:
    return [] if schedule.grpo_lr is None else [f"optim.lr={schedule.grpo_lr}"]


def grpo_from_a_mixed_start(tmp_path, env: EnvConfig, warm: tuple, mixed: tuple, max_len: int, mixed_max_len: int,
                            rl_overrides: tuple, max_new_tokens: int, schedule: Schedule) -> tuple[list, list]:
    """The learning tests' design: a warm start on good traces, more SFT on traces of which most skip
    the behaviour the environment rewards (``mixed``: make-env-data flags), then GRPO with the
    environment's example; held-out episodes at T=1 before and after GRPO (``schedule``: how long)."""
    sft, data = warm_start(tmp_path, env.name, schedule, "--tools-style", "none",
                           "--n-eval", str(schedule.held_out), *warm, max_len=max_len)
    assert main(["make-env-data", env.name, str(tmp_path / "mixed"), "--tools-style", "none", "--seed", "1",
                 "--n-eval", "0", *mixed]) == 0
    assert main(["sft", str(EXAMPLES / "sft_calculator.yaml"), f"model.path={sft}", f"num_steps={schedule.mixed_steps}",
                 "optim.lr=1e-3", f"data.max_len={mixed_max_len}", "optim.warmup_steps=0",
                 f"data.path={tmp_path / 'mixed' / 'sft_train.jsonl'}", "logging.progress=false",
                 f"out_dir={tmp_path / 'sft-mixed'}"]) == 0
    start = latest_checkpoint(tmp_path / "sft-mixed")
    held_out = [json.loads(line) for line in (data / "prompts_eval.jsonl").read_text().splitlines()]
    before = episodes(start, held_out, env, schedule.samples, 1.0, max_new_tokens)
    assert main(["rl", str(EXAMPLES / f"grpo_{env.name}.yaml"), f"model.path={start}",
                 f"data.path={data / 'prompts_train.jsonl'}", "data.eval_path=", f"num_steps={schedule.grpo_steps}",
                 "kl.track=false", "save_every=0", "logging.progress=false", f"out_dir={tmp_path / 'rl'}",
                 *rl_overrides, *grpo_args(schedule)]) == 0
    return before, episodes(latest_checkpoint(tmp_path / "rl"), held_out, env, schedule.samples, 1.0, max_new_tokens)


def trained_rows(run_dir: Path) -> list[dict]:
    """The GRPO steps' metrics (those that updated the model)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


CALC = EnvConfig(name="calculator", tools_style="none", max_turns=3, max_total_tokens=256)


def calculator_run(tmp_path, schedule: Schedule) -> tuple[list, list, list[dict]]:
    """A warm start that can use the calculator (SFT on tool-using traces: it learns to copy the
    operands into the call and the result into the answer) but, after a short second SFT on traces
    that mostly answer in the head, uses it only some of the time; then GRPO. 3-digit products are
    out of the tiny model's reach without it, so GRPO's reward is for calling the tool and copying.
    The copying is learned abruptly (around step 150 of 1000 with the example's schedule; with lr 3e-3
    and 10 warmup steps it came at step 250 for some seeds and never for others)."""
    before, after = grpo_from_a_mixed_start(tmp_path, CALC, (), ("--direct-frac", "0.6"), 128, 192, (), 96, schedule)
    n = f"{schedule.held_out} held-out x {schedule.samples}"
    print(f"calculator episode success (T=1, {n}): {success(before):.3f} -> {success(after):.3f}; "
          f"episodes calling the tool {tool_use(before):.2f} -> {tool_use(after):.2f}")
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    return before, after, rows


def tool_use(eps) -> float:
    return sum(e.tool_calls > 0 for e in eps) / len(eps)


def worst_mismatch(rows: list[dict]) -> float:
    """fp32 engine (KV cache, left-padded prefill) vs trainer (one forward): the worst token's log-prob
    difference over the run (tests/envs/test_runner.py holds the nano model to 1e-5)."""
    worst = max(r["mismatch/logprob_abs_diff_max"] for r in rows if "mismatch/logprob_abs_diff_max" in r)
    print(f"engine vs trainer log-prob, worst token over the run: {worst:.2e}")
    return worst


REPO = EnvConfig(name="repo", tools_style="none", max_turns=6, max_total_tokens=768)


def edits(eps) -> float:
    """The share of episodes that change the project (a ``replace`` or ``write_file`` call)."""
    return sum(any('"replace"' in t or '"write_file"' in t for t in e.turn_texts) for e in eps) / len(eps)


def repo_run(tmp_path, schedule: Schedule) -> tuple[list, list, list[dict]]:
    """As for the calculator: a warm start that can fix the bug (SFT on traces that run the tests,
    read the module, replace the line and submit; some miss a first replace and retry), then a short
    SFT on traces that mostly submit right after the tests, unfixed. Such an episode never passes, so
    GRPO's reward is for going on to read and fix. How well the tiny model copies the line is not what
    moves here: from the warm start alone, 10 GRPO steps left success where it was."""
    before, after = grpo_from_a_mixed_start(tmp_path, REPO, ("--retry-frac", "0.3"),
                                            ("--retry-frac", "0.3", "--give-up-frac", "0.6"), 768, 768,
                                            ("rollout.max_new_tokens=160",), 160, schedule)
    n = f"{schedule.held_out} held-out x {schedule.samples}"
    print(f"repo episode success (T=1, {n}): {success(before):.3f} -> {success(after):.3f}; "
          f"episodes that edit before submitting {edits(before):.2f} -> {edits(after):.2f}")
    trained = trained_rows(tmp_path / "rl")
    assert len(trained) == schedule.grpo_steps and all(r["outcomes/INFRA_FAIL_frac"] == 0.0 for r in trained)
    return before, after, trained


def assert_the_report_shows_episodes(run_dir: Path, out: Path) -> None:
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    from posttrain.eval.report import ENV_PANEL, find_runs, series_for

    assert "<h3>Episodes</h3>" in out.read_text()  # turns, tool calls and errors, reset time
    assert len(series_for(ENV_PANEL, find_runs([run_dir]))) == 4


REPAIR = EnvConfig(name="code_repair", max_turns=3, max_total_tokens=256)


def code_repair_run(tmp_path, schedule: Schedule) -> tuple[list, list[dict]]:
    """A warm start on direct and repair conversations (the calculator recipe's SFT), then GRPO with
    examples/grpo_code_repair.yaml; held-out episodes at T=1 after it. The trained GRPO steps' rows."""
    sft, data = warm_start(tmp_path, "code_repair", schedule, "--n-train", "1000", "--n-eval", str(schedule.held_out))
    assert main(["rl", str(EXAMPLES / "grpo_code_repair.yaml"), f"model.path={sft}",
                 f"data.path={data / 'prompts_train.jsonl'}", "data.eval_path=", f"num_steps={schedule.grpo_steps}",
                 "kl.track=false", "save_every=0", "logging.progress=false", f"out_dir={tmp_path / 'rl'}",
                 *grpo_args(schedule)]) == 0
    held_out = [json.loads(line) for line in (data / "prompts_eval.jsonl").read_text().splitlines()]
    eps = episodes(latest_checkpoint(tmp_path / "rl"), held_out, REPAIR, schedule.samples, 1.0, 32)
    print(f"code repair held-out pass (T=1, {len(held_out)} x {schedule.samples}): after the first turn "
          f"{first_turn_pass(eps):.3f}, after the last {success(eps):.3f}; turns per episode "
          f"{sum(e.turns for e in eps) / len(eps):.2f}")
    assert not any(e.outcome.cls is OutcomeClass.INFRA_FAIL for e in eps)
    return eps, trained_rows(tmp_path / "rl")


def first_turn_pass(eps) -> float:
    return sum(bool(e.turn_rewards) and e.turn_rewards[0] >= 1.0 for e in eps) / len(eps)
