"""tinker-cookbook's ``recipes/sl_loop.py`` and ``recipes/rl_loop.py`` run unchanged against
`posttrain tinker-serve`, offline.

Run with a python that has ``tinker-cookbook`` (0.6.1) installed, against a running server:

    python examples/tinker/cookbook_loops.py sl --base-url http://127.0.0.1:8000 \
        --model-dir ROOT/_base/tiny --log-path /tmp/sl-loop
    python examples/tinker/cookbook_loops.py rl --base-url http://127.0.0.1:8000 \
        --model-dir ROOT/_base/tiny --log-path /tmp/rl-loop

What had to change, all here and none in the recipes' loops: they look three things up on the
Hugging Face hub, which this machine cannot reach, so these are replaced before ``main`` runs:

1. ``get_tokenizer(model_name)`` -> the served model's own tokenizer, from its local folder;
2. ``model_info.get_recommended_renderer_name(model_name)`` -> ``"role_colon"`` (the cookbook's
   plain ``User: ... Assistant: ...`` renderer; it knows renderers for hub model names only);
3. ``datasets.load_dataset(...)`` (no_robots, gsm8k) -> records from a local JSONL file written
   here (short arithmetic exchanges; for RL, questions with a GSM8K-style ``#### N`` answer), as a
   ``DatasetDict`` with a ``train`` split.

The configs are the recipes' own, with ``base_url``, ``model_name`` and smaller sizes. Per-step
metrics land in ``LOG_PATH/metrics.jsonl``; this prints a summary line of them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def write_records(path: Path, count: int, kind: str, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.randint(2, 30), rng.randint(2, 30)
            if kind == "sl":
                row = {"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                    {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}
            else:
                row = {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            f.write(json.dumps(row) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("loop", choices=["sl", "rl"])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model-dir", required=True, help="the served base model's local folder (for its tokenizer)")
    p.add_argument("--model-name", default="posttrain/tiny")
    p.add_argument("--log-path", required=True)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()

    import datasets
    from transformers import AutoTokenizer

    from tinker_cookbook.recipes import rl_loop, sl_loop

    recipe = sl_loop if args.loop == "sl" else rl_loop
    log_path = Path(args.log_path)
    log_path.mkdir(parents=True, exist_ok=True)
    data = log_path / "records.jsonl"
    write_records(data, 8 * args.steps, args.loop)
    recipe.get_tokenizer = lambda name: AutoTokenizer.from_pretrained(args.model_dir)
    recipe.model_info.get_recommended_renderer_name = lambda name: "role_colon"
    recipe.datasets.load_dataset = lambda name, *a, **k: datasets.DatasetDict(
        {"train": datasets.Dataset.from_json(str(data))})

    common = dict(base_url=args.base_url, model_name=args.model_name, log_path=str(log_path), batch_size=8,
                  lora_rank=8, save_every=0, max_steps=args.steps)
    if args.loop == "sl":
        recipe.main(sl_loop.Config(**common, learning_rate=3e-3, max_length=128))
    else:
        recipe.main(rl_loop.Config(**common, group_size=4, learning_rate=1e-3, max_tokens=16))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    keys = ["train_mean_nll"] if args.loop == "sl" else ["reward/total", "reward/mean"]
    series = next(([r[k] for r in rows if k in r] for k in keys if any(k in r for r in rows)), [])
    print(json.dumps({"steps": len(rows), "metric": next((k for k in keys if any(k in r for r in rows)), None),
                      "first": series[0] if series else None, "last": series[-1] if series else None,
                      "keys": sorted(rows[-1]) if rows else []}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
