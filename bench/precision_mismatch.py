"""float32 vs bf16 rollouts on the same GRPO run, and the sampler/trainer corrections side by side.

For each model (the embedded tiny Llama; ``--models tiny,qwen3`` adds the Qwen3-shaped one of the
same size) and seed, runs the same GRPO recipe from the same random start: once with a float32
engine and no correction (the reference: sampler and trainer agree to ~1e-6), then with a bf16
engine under each correction (`correction.kind`: none, truncated, mis, rejection, icepop, geo_mask,
k3_mask, and geo_mask at verl's ±0.1% bounds). The reward is dense (the fraction of letters in the completion, as in the tests), so a
random start climbs within a few steps; the held-out reward is the mean reward of 4 samples per
held-out prompt drawn by a float32 engine holding the trained weights, so every arm is judged the
same way. Prints, per arm, the mismatch (mean over steps of `mismatch/kl`, mean and max |Δ log p|),
what the correction dropped (`is/masked_token_frac`) and the held-out reward: mean over seeds
with the min-max range, and its ratio to the float32 reference's.

    .venv/bin/python bench/precision_mismatch.py              # 2 seeds x 6 steps, 16 runs: 2 min on 2 cores
    .venv/bin/python bench/precision_mismatch.py --models tiny,qwen3 --seeds 3 --steps 12
    .venv/bin/python bench/precision_mismatch.py --model runs/smollm2 --lr 1e-5 --seeds 1 --steps 2

``--model`` runs the arms on a model folder (or GGUF file) of your own instead of the built ones,
e.g. SmolLM2-135M-Instruct from `posttrain make-model smollm2-135m-instruct runs/smollm2`;
``--arms`` keeps only the named arms (their labels as printed). ``capped`` is the fraction of
tokens whose weight a truncation capped (`is/truncated_frac`), ``masked tok`` the fraction a
rejection dropped: where either is above 0, that correction binds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

CORRECTIONS = ("none", "truncated", "mis", "rejection", "icepop", "geo_mask", "k3_mask")
# (label, engine dtype, correction overrides); the last arm is verl's geometric preset (bounds ±0.1%),
# tight enough to bind at a bf16 gap this small, where the defaults here (±1%) drop nothing
ARMS = [("float32/none", "float32", ["correction.kind=none"])] + \
       [(f"bf16/{kind}", "bfloat16", [f"correction.kind={kind}"]) for kind in CORRECTIONS] + \
       [("bf16/geo_mask±0.1%", "bfloat16", ["correction.kind=geo_mask", "correction.geo_low=0.999",
                                             "correction.geo_high=1.001"])]
REWARD = '''
from posttrain.outcome import Outcome

def letters(completion, example):
    if not completion:
        return Outcome.model_fail("empty", reward=0.0)
    return Outcome.model_fail(reward=sum(c.isalpha() for c in completion) / len(completion))
'''


def prepare(out: Path, models: list[str], given: str = "") -> dict:
    from posttrain.models.tiny import build_tiny
    from posttrain.tasks.arithmetic import write_arithmetic

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_letters.py").write_text(REWARD)
    sys.path.insert(0, str(out))
    data = write_arithmetic(out / "data", n_train=400, n_eval=32, seed=0, digits=2, ops="+", fmt="trace")
    if given:
        return {"data": {k: str(v) for k, v in data.items()}, "models": {models[0]: given}}
    paths = {m: str(build_tiny(out / m, "tiny", seed=0, arch="llama" if m == "tiny" else m)) for m in models}
    return {"data": {k: str(v) for k, v in data.items()}, "models": paths}


def one_run(model: str, data: dict, dtype: str, correction: list[str], seed: int, out: Path, args) -> dict:
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.loop import drive_rl, rl_step, setup

    cfg = load_config(RLConfig, None, [
        f"model.path={model}", f"data.path={data['prompts_train']}", "verifier=bench_letters:letters",
        "rollout.group_size=8", f"rollout.max_new_tokens={args.max_new}", "prompts_per_step=8",
        f"num_steps={args.steps}", f"optim.lr={args.lr}", "eval_every=0", "save_every=0", "kl.track=false",
        "logging.progress=false", f"seed={seed}", f"rollout.engine_dtype={dtype}", f"out_dir={out}", *correction])
    shutil.rmtree(out, ignore_errors=True)  # a finished run there would be resumed, not rerun
    run = setup(cfg)
    try:
        drive_rl(run, rl_step, config=cfg, name="rl", printer=lambda *_: None)
        held_out = held_out_reward(run, data, seed)
    finally:
        run.engine = None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) > 0]
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in rows)  # noqa: E731
    return {"kl": mean("mismatch/kl"), "dlogp_mean": mean("mismatch/logprob_abs_diff_mean"),
            "dlogp_max": max(r["mismatch/logprob_abs_diff_max"] for r in rows),
            "masked_tokens": mean("is/masked_token_frac"), "capped": mean("is/truncated_frac"), "reward": held_out}


def held_out_reward(run, data: dict, seed: int) -> float:
    """Mean reward of 4 samples per held-out prompt, from a float32 engine holding the trained weights."""
    from posttrain.rl.config import sampling_params
    from posttrain.rl.loop import encode_prompts, load_prompt_records
    from posttrain.rollout import TorchEngine
    from posttrain.verifiers.evaluate import score

    examples = load_prompt_records(data["prompts_eval"])
    prompts = encode_prompts(run.tokenizer, examples, run.cfg.data.use_chat_template)
    engine = TorchEngine(run.policy.model, tokenizer=run.tokenizer)
    ro = engine.generate(prompts, 4, sampling_params(run.cfg, 10_000 + seed))
    outcomes = score(run.verifier, ro.completion_texts(), [examples[i] for i in ro.prompt_idx], ro.finish_reason)
    return statistics.fmean(o.reward for o in outcomes)


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.fmean(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def report(results: dict, models: list[str], arms: list) -> None:
    head = f"{'model':8} {'engine/correction':20} {'mismatch/kl':>10} {'mean|dlogp|':>11} {'max|dlogp|':>10} " \
           f"{'masked tok':>10} {'capped':>7}  {'held-out reward [min, max]':28} {'vs fp32':>7}"
    print(head)
    for m in models:
        ref = statistics.fmean(r["reward"] for r in results[(m, arms[0][0])])
        for label, _, _ in arms:
            rs = results[(m, label)]
            mean = lambda key: statistics.fmean(r[key] for r in rs)  # noqa: E731
            reward = [r["reward"] for r in rs]
            print(f"{m:8} {label:20} {mean('kl'):10.2e} {mean('dlogp_mean'):11.2e} "
                  f"{max(r['dlogp_max'] for r in rs):10.2e} {mean('masked_tokens'):10.4f} {mean('capped'):7.4f}  "
                  f"{spread(reward, '{:.3f}'):28} {statistics.fmean(reward) / ref:7.3f}")


def chosen_arms(labels: str) -> list:
    """The arms named in ``labels`` (all when empty), in ARMS' order; the reference must be among them."""
    if not labels:
        return ARMS
    names = labels.split(",")
    unknown = sorted(set(names) - {a[0] for a in ARMS})
    if unknown or ARMS[0][0] not in names:
        print(f"--arms: {', '.join(unknown) or 'float32/none is the reference and must be one'}; "
              f"labels: {', '.join(a[0] for a in ARMS)}", file=sys.stderr)
        sys.exit(2)
    return [a for a in ARMS if a[0] in names]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny", help="comma-separated: tiny (Llama), qwen3")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--out", default="runs/bench-precision")
    p.add_argument("--model", default="", help="a model folder or GGUF file to run instead of the built tiny ones")
    p.add_argument("--lr", type=float, default=1e-3, help="1e-3 climbs from a random start; ~1e-5 for a real model")
    p.add_argument("--arms", default="", help="comma-separated arm labels to run (default: all; float32/none first)")
    args = p.parse_args()
    import torch

    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(1)
    out, models = Path(args.out), [Path(args.model).stem] if args.model else args.models.split(",")
    arms = chosen_arms(args.arms)
    paths = prepare(out, models, args.model)
    results, t0 = {}, time.perf_counter()
    for m in models:
        for i, (label, dtype, correction) in enumerate(arms):
            results[(m, label)] = [one_run(paths["models"][m], paths["data"], dtype, correction, seed,
                                           out / f"{m}-arm{i}-s{seed}", args) for seed in range(args.seeds)]
    print(f"{len(models) * len(arms) * args.seeds} runs of {args.steps} GRPO steps in {time.perf_counter() - t0:.0f} s "
          f"(8 prompts x 8 samples x {args.max_new} new tokens a step; held-out: 32 prompts x 4 samples)")
    report(results, models, arms)


if __name__ == "__main__":
    main()
