"""A verifiable task of your own, written the way you would bring any JSONL to posttrain.

Task: add up 4 to 6 labelled single digits, `Add: a4 b7 c1 d8` -> one line per digit, each naming
the digit it reads and keeping a running sum, ending in `Answer: 20`:

    a: 4
    b: 4 + 7 = 11
    c: 11 + 1 = 12
    d: 12 + 8 = 20
    Answer: 20

The labels are what make the trace learnable by a small model, as the embedded arithmetic trace
names its columns (`ones:`, `tens:`): each line finds its digit by the label, a lookup by content.
Without them (`Add: 4 7 1 8`, lines `4 + 7 = 11`) the k-th line must find the k-th digit by
counting, and a repeated digit makes "the one after the digit I just added" ambiguous; the `tiny`
model after 300 SFT steps copied a wrong digit, or the wrong number of digits, in 96 of 100
held-out answers (docs/study.md). It writes, in OUT (default runs/digit-sum):

- train.jsonl          SFT records {"prompt", "completion", "answer"} (the worked traces)
- prompts_train.jsonl  RL prompts {"prompt", "answer"} (the same problems, without traces)
- prompts_eval.jsonl   held-out prompts {"prompt", "answer"}, no digit list shared with training

    python examples/make_digit_sum.py runs/digit-sum
    posttrain sft examples/sft_arith.yaml data.path=runs/digit-sum/train.jsonl data.eval_path= \
        out_dir=runs/digit-sum-sft
    posttrain rl examples/grpo_arith.yaml model.path=runs/digit-sum-sft/checkpoints/step-300 \
        data.path=runs/digit-sum/prompts_train.jsonl data.eval_path=runs/digit-sum/prompts_eval.jsonl \
        verifier=math num_steps=60 eval_every=20 out_dir=runs/digit-sum-grpo

Only the standard library: this is the user's side of the interface, not part of posttrain.
"""

import json
import random
import sys
from pathlib import Path


LABELS = "abcdef"


def problem(rng: random.Random) -> tuple[str, str, str]:
    digits = [rng.randint(1, 9) for _ in range(rng.randint(4, 6))]
    total, lines = digits[0], [f"a: {digits[0]}"]
    for label, d in zip(LABELS[1:], digits[1:]):
        lines.append(f"{label}: {total} + {d} = {total + d}")
        total += d
    prompt = "Add: " + " ".join(f"{label}{d}" for label, d in zip(LABELS, digits))
    return prompt, "\n".join(lines + [f"Answer: {total}"]), str(total)


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(out: str = "runs/digit-sum", n_train: int = 4000, n_eval: int = 200, seed: int = 0) -> None:
    rng, seen, train, held_out = random.Random(seed), set(), [], []
    while len(train) + len(held_out) < n_train + n_eval:
        prompt, completion, answer = problem(rng)
        if prompt in seen:
            continue
        seen.add(prompt)
        rows = held_out if len(held_out) < n_eval else train
        rows.append({"prompt": prompt, "completion": completion, "answer": answer})
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write(out_dir / "train.jsonl", train)
    write(out_dir / "prompts_train.jsonl", [{"prompt": r["prompt"], "answer": r["answer"]} for r in train])
    write(out_dir / "prompts_eval.jsonl", [{"prompt": r["prompt"], "answer": r["answer"]} for r in held_out])
    print(f"{out_dir}: {len(train)} training problems, {len(held_out)} held out")


if __name__ == "__main__":
    main(*sys.argv[1:2])
