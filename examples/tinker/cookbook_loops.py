"""tinker-cookbook's ``recipes/sl_loop.py`` and ``recipes/rl_loop.py`` run unchanged against
`posttrain tinker-serve`, offline.

Run with a python that has ``tinker-cookbook`` (0.6.1) installed, against a running server:

    python examples/tinker/cookbook_loops.py sl --base-url http://127.0.0.1:8000 \
        --model-dir ROOT/_base/tiny --log-path /tmp/sl-loop
    python examples/tinker/cookbook_loops.py rl --base-url http://127.0.0.1:8000 \
        --model-dir ROOT/_base/tiny --log-path /tmp/rl-loop
    python examples/tinker/cookbook_loops.py sl-rl --base-url http://127.0.0.1:8000 \
        --model-dir ROOT/_base/tiny --log-path /tmp/sl-rl --steps 100 --sl-lr 1e-2 --rl-steps 80

What had to change, all here and none in the recipes' loops: they look three things up on the
Hugging Face hub, which this machine cannot reach, so these are replaced before ``main`` runs:

1. ``get_tokenizer(model_name)`` -> the served model's own tokenizer, from its local folder;
2. ``model_info.get_recommended_renderer_name(model_name)`` -> ``"role_colon"`` (the cookbook's
   plain ``User: ... Assistant: ...`` renderer; it knows renderers for hub model names only);
3. ``datasets.load_dataset(...)`` (no_robots, gsm8k) -> records from a local JSONL file written
   here (short arithmetic exchanges; for RL, questions with a GSM8K-style ``#### N`` answer), as a
   ``DatasetDict`` with a ``train`` split.

The configs are the recipes' own, with ``base_url``, ``model_name``, smaller sizes and, for RL,
``loss_fn="importance_sampling"`` (the recipe's default, ``stable_reinforce``, is not served).

``sl-rl`` makes RL learn on a model that at first never earns a reward: ``sl_loop`` first teaches
the answer format (``\\boxed{N}`` after the recipe's own question suffix, on sums of 1..3; half
of the prompts carry the recipe's one-shot example, and ``train_on_what`` is the last assistant
message, so the example is context, not target) in ``LOG_PATH/sl``, then ``rl_loop`` starts from
that state in ``LOG_PATH/rl`` through the cookbook's own resume mechanism: a
``checkpoints.jsonl`` row naming the SL state at batch 0, which the recipe loads with
``create_training_client_from_state_with_optimizer``. Last, both stages' final sampler
checkpoints are scored on the same fixed set (all nine questions, ``--eval-samples`` fresh
samples each, the recipe's prompts and ``get_reward``): the reward before and after RL.

Per-step metrics land in ``LOG_PATH/metrics.jsonl``; this prints a summary line of them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


# rl_loop's own suffix to each question and its one-shot example (locals of its main): the SL stage
# trains on prompts of the very shape the RL stage samples from, the answer alone in the loss.
BOXED_SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
RL_EXAMPLE = [
    {"role": "user", "content": "How many r's are in strawberry?" + BOXED_SUFFIX},
    {"role": "assistant", "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) "
                                     "w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}"},
]


def write_records(path: Path, count: int, kind: str, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randint(2, 30), rng.randint(2, 30)
            if kind in ("boxed-sl", "boxed-rl"):
                # Small sums, so that a format-trained tiny model is right often enough for a
                # group of samples to disagree (the recipe skips groups of equal rewards).
                a, b = rng.randint(1, 3), rng.randint(1, 3)
            if kind == "boxed-sl":
                # Half without the one-shot example: the tiny model learns the format far faster on
                # short prompts, and carries it over to the long ones the RL stage sends.
                example = RL_EXAMPLE if rng.random() < 0.5 else []
                row = {"messages": [*example, {"role": "user", "content": f"What is {a} + {b}?" + BOXED_SUFFIX},
                                    {"role": "assistant", "content": f"\\boxed{{{a + b}}}"}]}
            elif kind == "sl":
                row = {"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                    {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}
            else:
                row = {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            f.write(json.dumps(row) + "\n")


def run_recipe(loop: str, args: argparse.Namespace, log_path: Path, records: str, lr: float) -> dict:
    """Run one recipe's ``main`` with the hub look-ups replaced; a summary of its metrics."""
    import datasets
    from transformers import AutoTokenizer

    from tinker_cookbook.recipes import rl_loop, sl_loop

    recipe = sl_loop if loop == "sl" else rl_loop
    log_path.mkdir(parents=True, exist_ok=True)
    data = log_path / "records.jsonl"
    write_records(data, 8 * args.steps, records)
    recipe.get_tokenizer = lambda name: AutoTokenizer.from_pretrained(args.model_dir)
    recipe.model_info.get_recommended_renderer_name = lambda name: "role_colon"
    recipe.datasets.load_dataset = lambda name, *a, **k: datasets.DatasetDict(
        {"train": datasets.Dataset.from_json(str(data))})

    common = dict(base_url=args.base_url, model_name=args.model_name, log_path=str(log_path), batch_size=8,
                  lora_rank=8, save_every=0, max_steps=args.steps, learning_rate=lr)
    if loop == "sl":
        last_only = {"train_on_what": sl_loop.renderers.TrainOnWhat.LAST_ASSISTANT_MESSAGE}
        recipe.main(sl_loop.Config(**common, max_length=512, **(last_only if records == "boxed-sl" else {})))
    else:
        recipe.main(rl_loop.Config(**common, group_size=args.group_size, max_tokens=16,
                                   loss_fn="importance_sampling"))
    return summarize(log_path, "train_mean_nll" if loop == "sl" else "reward/total")


def summarize(log_path: Path, key: str) -> dict:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    series = [r[key] for r in rows if key in r]
    k = max(1, len(series) // 4)   # a quarter of the run at each end: single RL steps are noisy
    return {"loop": log_path.name, "steps": len(rows), "metric": key, "first": series[0] if series else None,
            "last": series[-1] if series else None,
            "first_quarter_mean": sum(series[:k]) / k if series else None,
            "last_quarter_mean": sum(series[-k:]) / k if series else None}


def seed_from(state_log: Path, log_path: Path) -> None:
    """Point the recipe's resume look-up at another run's final state, as batch 0 of this run."""
    rows = [json.loads(line) for line in (state_log / "checkpoints.jsonl").read_text().splitlines()]
    state = [r for r in rows if "state_path" in r][-1]["state_path"]
    log_path.mkdir(parents=True, exist_ok=True)
    (log_path / "checkpoints.jsonl").write_text(json.dumps({"name": "seed", "batch": 0, "state_path": state}) + "\n")


def fixed_set_reward(args: argparse.Namespace, log_path: Path, samples: int) -> float:
    """Mean of the recipe's own reward (``rl_loop.get_reward``) over every boxed-task question,
    ``samples`` samples each, from ``log_path``'s final sampler checkpoint: prompts built as
    rl_loop builds them (its one-shot example, its suffix, its renderer and stop strings)."""
    import tinker
    from transformers import AutoTokenizer

    from tinker_cookbook import renderers
    from tinker_cookbook.recipes import rl_loop

    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    sampler_path = [r for r in rows if "sampler_path" in r][-1]["sampler_path"]
    renderer = renderers.get_renderer("role_colon", AutoTokenizer.from_pretrained(args.model_dir))
    client = tinker.ServiceClient(base_url=args.base_url).create_sampling_client(model_path=sampler_path)
    params = tinker.types.SamplingParams(max_tokens=16, stop=renderer.get_stop_sequences())
    sums = [(a, b) for a in range(1, 4) for b in range(1, 4)]
    futures = [client.sample(renderer.build_generation_prompt(
        [*RL_EXAMPLE, {"role": "user", "content": f"What is {a} + {b}?" + BOXED_SUFFIX}]), samples, params)
        for a, b in sums]
    rewards = [rl_loop.get_reward(renderers.get_text_content(renderer.parse_response(seq.tokens)[0]), f"#### {a + b}")
               for (a, b), f in zip(sums, futures) for seq in f.result().sequences]
    return sum(rewards) / len(rewards)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("loop", choices=["sl", "rl", "sl-rl"])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model-dir", required=True, help="the served base model's local folder (for its tokenizer)")
    p.add_argument("--model-name", default="posttrain/tiny")
    p.add_argument("--log-path", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rl-steps", type=int, default=None, help="RL steps of sl-rl (default --steps)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--sl-lr", type=float, default=3e-3)
    p.add_argument("--rl-lr", type=float, default=1e-3)
    p.add_argument("--eval-samples", type=int, default=32, help="sl-rl: samples per question of the before/after reward")
    args = p.parse_args()
    log_path = Path(args.log_path)

    if args.loop == "sl":
        print(json.dumps(run_recipe("sl", args, log_path, "sl", args.sl_lr)))
    elif args.loop == "rl":
        print(json.dumps(run_recipe("rl", args, log_path, "rl", args.rl_lr)))
    else:
        if (log_path / "rl" / "checkpoints.jsonl").exists():
            raise SystemExit(f"{log_path / 'rl'}: already has checkpoints; give a fresh --log-path")
        print(json.dumps(run_recipe("sl", args, log_path / "sl", "boxed-sl", args.sl_lr)))
        seed_from(log_path / "sl", log_path / "rl")
        args.steps = args.rl_steps or args.steps
        print(json.dumps(run_recipe("rl", args, log_path / "rl", "boxed-rl", args.rl_lr)))
        print(json.dumps({"fixed_set_reward": {stage: fixed_set_reward(args, log_path / stage, args.eval_samples)
                                              for stage in ("sl", "rl")}, "samples": 9 * args.eval_samples}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
