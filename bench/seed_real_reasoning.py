"""Can SmolLM2-135M-Instruct carry the seed's reasoning arm? The format, the pass rate and the groups'
spread measured before and after a short SFT on reasoning traces, on a CPU.

The reasoning arm (examples/seed_reasoning.yaml) samples thinking prompts at T = 0.6 and rewards
1 iff the tests pass plus 0.05 x `code_format` (a closed ``<think>`` trace, then valid Python).
Dr. GRPO learns only from groups whose rewards differ; where they differ by the format bonus alone,
it learns the format and nothing else (the miniature's failure from a weak start, docs/seed.md).
So for each model and prompt this measures, on a fixed draw of problems, 8 samples each:

- the fraction of samples ``code_format`` passes (the verifier itself, not a copy of its test);
- pass@1 (the tests, judged in the sandbox on the program after ``</think>``);
- groups with spread from a pass (a pass and a fail), and groups whose only spread is the bonus;
- tokens a sample and the fraction cut at the token limit.

Conditions: the instruction model zero-shot with the direct (non-thinking) prompt and with the
thinking prompt, then the model after a full fine-tune (`posttrain.train.sft`) on the embedded
family's reasoning traces (``sft_thinking``: a ``<think>`` plan then the program, in every
benchmark's prompt shape), decontaminated against HumanEval+ and MBPP+ as the real demo decontaminates
its training file. Problems: the real demo's training file (`posttrain.demo.code_real.prepare`: the
vendored KodCode records and the family's training split) drawn as `posttrain.demo.code_check`
draws it, reported whole and split into the family's problems (their traces were trained on) and
the real KodCode records (no trace exists for them); and the family's held-out problems written as
KodCode records (never trained on). Only training or held-out family problems are read, never a
benchmark.

Every stage writes into ``--out`` and is reused when run again (an evaluation resumes from its
samples; the SFT from its checkpoint):

    python bench/seed_real_reasoning.py --out runs/reasoning-probe --sft-steps 10 20 40

``--parts`` picks the measurements beyond the training draw (default: both; none prints the draw's
rows from what is written). It prints a Markdown table (one row per condition and problem set) and writes ``summary.json``.
``--model DIR`` measures another model folder (a tiny one, to try the script in seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from posttrain.errors import UserError

FORMAT_WEIGHT = 0.05
"""The recipe's format bonus (examples/seed_reasoning.yaml, format_weight)."""
FAMILY_PREFIX = "family_"
"""Problem ids of the embedded family's KodCode records (`posttrain.tasks.code_family.kodcode_record`)."""


# ----------------------------------------------------------------------------- the arithmetic
def format_ok(completion: str) -> bool:
    from posttrain.outcome import OutcomeClass
    from posttrain.verifiers.basic import code_format

    return code_format(completion, {}).cls is OutcomeClass.PASS


def group_stats(samples: list) -> dict:
    """The figures of one set of judged samples (``SampleRecord``s, several per problem).

    A group is one problem's samples. Its reward under the recipe is pass + 0.05 x format, so a group
    has spread from a pass when it holds a pass and a fail, and spread from the bonus alone when its
    samples all pass or all fail but differ in format."""
    groups: dict[str, list] = {}
    for s in samples:
        groups.setdefault(s.problem_id, []).append(s)
    n = len(samples)
    passes = [s.outcome == "PASS" for s in samples]
    fmt = {id(s): format_ok(s.completion) for s in samples}
    pass_spread = bonus_only = 0
    for group in groups.values():
        passed = {s.outcome == "PASS" for s in group}
        if len(passed) == 2:
            pass_spread += 1
        elif len({fmt[id(s)] for s in group}) == 2:
            bonus_only += 1
    return {"problems": len(groups), "samples": n, "format": sum(fmt.values()) / n, "pass1": sum(passes) / n,
            "groups_pass_spread": pass_spread, "groups_bonus_only": bonus_only,
            "tokens": sum(s.completion_tokens for s in samples) / n,
            "cut": sum(s.finish_reason == "length" for s in samples) / n}


def split_by_source(samples: list) -> dict[str, list]:
    """The draw of the real demo's training file split by where a problem comes from."""
    family = [s for s in samples if s.problem_id.startswith(FAMILY_PREFIX)]
    kodcode = [s for s in samples if not s.problem_id.startswith(FAMILY_PREFIX)]
    return {"family": family, "kodcode": kodcode}


HEADER = ("| model · prompt | problems | samples | `code_format` | pass@1 | groups with a pass and a fail | "
          "groups spread by the bonus alone | tokens a sample | cut at the limit |")


def table_row(name: str, where: str, st: dict) -> str:
    return (f"| {name} | {where} ({st['problems']}) | {st['samples']} | {100 * st['format']:.1f}% | "
            f"{100 * st['pass1']:.1f}% | {st['groups_pass_spread']} of {st['problems']} | "
            f"{st['groups_bonus_only']} | {st['tokens']:.0f} | {100 * st['cut']:.0f}% |")


def markdown(rows: list[tuple[str, str, dict]]) -> str:
    sep = "|" + "---|" * HEADER.count(" |")
    return "\n".join([HEADER, sep] + [table_row(*r) for r in rows])


# ----------------------------------------------------------------------------- the stages
def prepare(out: Path, seed: int, problems: int, heldout: int) -> dict:
    """The real demo's training file and model, the fixed draw, the held-out family problems as
    KodCode records, and the decontaminated traces."""
    from posttrain.data.records import write_jsonl
    from posttrain.demo.code_check import train_sample
    from posttrain.demo.code_real import MODELS, clean_traces
    from posttrain.demo.code_real import prepare as prepare_real
    from posttrain.tasks.code_family import all_problems, kodcode_record, split_of

    paths = prepare_real(out, MODELS["smollm2"])
    data = out / "data"
    draw = train_sample(paths["train"], data, problems, seed)
    held = [p for p in all_problems() if split_of(p) == "eval"]
    random.Random(seed).shuffle(held)
    held_path = write_jsonl(data / f"heldout_family_{heldout}.jsonl", [kodcode_record(p) for p in held[:heldout]])
    traces = clean_traces(paths["traces"], data / "sft_thinking.clean.jsonl")
    return {"model": paths["model"], "draw": draw, "heldout": held_path, "traces": traces}


def same_prompts(model: str, problems: Path) -> bool:
    """Whether the chat template renders every prompt the same with thinking on and off (a template
    without an ``enable_thinking`` switch, such as SmolLM2's ChatML, ignores it)."""
    from posttrain.data.chat import encode_prompt
    from posttrain.data.formats import convert
    from posttrain.data.records import load_records
    from posttrain.models.hf import load_tokenizer

    tok = load_tokenizer(model, "model")
    prompts = [convert(r, f"{problems}:{i}")["prompt"] for i, r in enumerate(load_records(problems), 1)]
    return all(encode_prompt(tok, p, True, True) == encode_prompt(tok, p, True, False) for p in prompts)


ASK = ("You are a helpful AI assistant. Think first: write a short plan between <think> and </think>, "
       "then write the Python function in a ```python block.")
"""The system message of the asked condition: the instruction the recipe's thinking switch gives a
template that has one (SmolLM2's ChatML has none, so thinking on renders the direct prompt)."""


def asked_model(model: str, folder: Path) -> str:
    """``model`` with a chat template that opens every conversation with the `ASK` system message (a
    folder of links to its files but the template)."""
    src = Path(model)
    template = src / "chat_template.jinja"
    if not template.is_file():
        raise UserError(f"{template}: no chat template file to extend")
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = folder / f.name
        if f.name != template.name and not link.exists():
            link.symlink_to(f.resolve())
    system = json.dumps({"role": "system", "content": ASK})
    (folder / template.name).write_text(f"{{%- set messages = [{system}] + messages -%}}\n" + template.read_text())
    return str(folder)


def sample(model: str, problems: Path, folder: Path, thinking: bool, a) -> list:
    """``a.samples`` samples a problem at ``a.temperature``, judged; reused when written."""
    from posttrain.eval.results import read_samples
    from posttrain.eval.runner import BenchmarkConfig, DecodingProfile, EvalConfig, run_eval

    path = folder / "samples" / "train.sampled.jsonl"
    if not (folder / "eval.json").is_file():
        t0 = time.perf_counter()
        cfg = EvalConfig(model=model, label=folder.name, seed=a.seed, out_dir=str(folder),
                         benchmarks=[BenchmarkConfig(name="train", kind="kodcode", path=str(problems))],
                         profiles=[DecodingProfile(name="sampled", temperature=a.temperature, n=a.samples,
                                                   max_new_tokens=a.tokens)],
                         ks=[1], thinking=thinking)
        run_eval(cfg, show_progress=False)
        print(f"[probe] {folder.name}: {time.perf_counter() - t0:.0f} s wall")
    return read_samples(path)


def sft(model: str, traces: Path, out: Path, a) -> dict[int, str]:
    """The real demo's reasoning start (`posttrain.demo.code_real.trace_sft_config`: a constant rate
    after warm-up, so the checkpoint at each of ``a.sft_steps`` is what a run of that length would
    leave); step -> checkpoint, reused when written (an interrupted run resumes)."""
    import math

    from posttrain.demo.code_real import trace_sft_config
    from posttrain.train.sft import run_sft

    last, every = max(a.sft_steps), math.gcd(*a.sft_steps)
    if not (out / "checkpoints" / f"step-{last}").is_dir():
        t0 = time.perf_counter()
        run_sft(trace_sft_config(model, traces, out, steps=last, tokens=a.sft_tokens, lr=a.sft_lr,
                                 warmup=a.sft_warmup, seed=a.seed,
                                 extra=[f"save_every={every}", f"keep_last={last // every}", "logging.progress=false"]))
        print(f"[probe] SFT {last} steps x {a.sft_tokens} tokens: {time.perf_counter() - t0:.0f} s wall")
    return {n: str(out / "checkpoints" / f"step-{n}") for n in a.sft_steps}


def paired(out: Path, before: str, after: str) -> str:
    """``after``'s pass@1 against ``before``'s, paired by problem with a 95% bootstrap interval."""
    from posttrain.demo.code_check import describe
    from posttrain.eval.results import read_eval_json
    from posttrain.eval.seed_table import cell

    b, a = (read_eval_json(out / name / "eval.json")[0] for name in (before, after))
    return f"{after} against {before}: pass@1 {describe(cell(b, a))}"


def measure(a) -> list[tuple[str, str, dict]]:
    out = Path(a.out)
    p = prepare(out, a.seed, a.problems, a.heldout)
    start = a.model or p["model"]
    rows = []

    def add(name: str, samples: list, whole: str, split: bool):
        rows.append((name, whole, group_stats(samples)))
        if split:
            for where, part in split_by_source(samples).items():
                if part:
                    rows.append((name, f"{whole}: {where}", group_stats(part)))

    direct = sample(start, p["draw"], out / "zero-direct-train", False, a)
    add("instruct · direct", direct, "train draw", True)
    if same_prompts(start, p["draw"]):
        print("[probe] thinking on renders the same prompts as thinking off: the thinking row is the direct samples")
        thinking = direct
    else:
        thinking = sample(start, p["draw"], out / "zero-thinking-train", True, a)
    add("instruct · thinking", thinking, "train draw", True)
    tuned = sft(start, p["traces"], out / "sft-thinking", a)
    for steps, checkpoint in sorted(tuned.items()):
        add(f"SFT {steps} · thinking", sample(checkpoint, p["draw"], out / f"sft{steps}-thinking-train", True, a),
            "train draw", True)
    if "heldout" in a.parts:
        add("instruct · direct", sample(start, p["heldout"], out / "zero-direct-heldout", False, a),
            "family held out", False)
        for steps, checkpoint in sorted(tuned.items()):
            add(f"SFT {steps} · thinking",
                sample(checkpoint, p["heldout"], out / f"sft{steps}-thinking-heldout", True, a), "family held out", False)
    if "asked" in a.parts:
        asked = asked_model(start, out / "asked-model")
        add("instruct · asked to think", sample(asked, p["draw"], out / "asked-thinking-train", True, a),
            "train draw", True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/reasoning-probe")
    ap.add_argument("--model", default="", help="a model folder (default: SmolLM2-135M-Instruct, converted)")
    ap.add_argument("--problems", type=int, default=16, help="training problems in the fixed draw")
    ap.add_argument("--heldout", type=int, default=16, help="held-out family problems")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.6, help="the seed's thinking temperature")
    ap.add_argument("--tokens", type=int, default=256, help="most new tokens a sample")
    ap.add_argument("--sft-steps", type=int, nargs="+", default=[10, 20, 40],
                    help="SFT lengths to measure: one run, a checkpoint at each")
    ap.add_argument("--sft-tokens", type=int, default=2048, help="tokens a SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-5, help="the real demo's sft_lr")
    ap.add_argument("--sft-warmup", type=int, default=2, help="SFT warm-up steps (a short run spends few on it)")
    ap.add_argument("--parts", nargs="*", choices=("heldout", "asked"), default=["heldout", "asked"],
                    help="measurements beyond the training draw: the held-out family problems, the asked prompt")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = measure(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = markdown(rows)
    print(table)
    out = Path(a.out)
    changes = [paired(out, f"zero-direct-{where}", f"sft{steps}-thinking-{where}")
               for where in ("train", "heldout") if where in ("train", *a.parts) for steps in sorted(a.sft_steps)]
    print("\n".join(changes))
    Path(a.out, "summary.json").write_text(json.dumps(
        {"args": vars(a), "rows": [{"model": m, "problems": w, **st} for m, w, st in rows], "paired": changes,
         "wall_s": time.perf_counter() - t0}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
