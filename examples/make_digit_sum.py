"""A verifiable task of your own, written the way you would bring any JSONL to posttrain.

Task: add up 4 to 6 single digits, `Add: 4 7 1 8` -> `Answer: 20`, with a worked trace that
adds them from the last digit to the first, one line per digit, the running sum in two digits:

    a: 08
    b: 08 + 1 = 09
    c: 09 + 7 = 16
    d: 16 + 4 = 20
    Answer: 20

The trace's shape is what makes it learnable by a small model, as the embedded arithmetic trace
is: every token it reads sits at a fixed distance from where it is written. Line `b` always reads
the second digit from the end of the prompt, the same number of tokens back whatever the prompt's
length, because the prompt's end is where the answer starts and every line has the same width.
Written left to right with plain sums (`4 + 7 = 11`, `11 + 1 = 12`), the k-th line must find the
k-th digit by counting; with labelled digits (`a4 b7 ...`) by matching the label. The `tiny`
model learned neither: left to right, after 300 SFT steps, 96 of 100 held-out answers copied a
wrong digit or the wrong number of digits; labelled, after 600, its sums were exact but all 100
answers read a wrong digit or the wrong number of digits. This shape, after 600 SFT steps, solves half
of the held-out problems, and GRPO raises that (docs/study.md). It writes, in OUT (default runs/digit-sum):

- train.jsonl          SFT records {"prompt", "completion", "answer"} (the worked traces)
- prompts_train.jsonl  RL prompts {"prompt", "answer"} (the same problems, without traces)
- prompts_eval.jsonl   held-out prompts {"prompt", "answer"}, no digit list shared with training

    python examples/make_digit_sum.py runs/digit-sum
    posttrain sft examples/sft_arith.yaml data.path=runs/digit-sum/train.jsonl data.eval_path= \
        num_steps=600 out_dir=runs/digit-sum-sft
    posttrain rl examples/grpo_arith.yaml model.path=runs/digit-sum-sft/checkpoints/step-600 \
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
    last_first = digits[::-1]
    total, lines = last_first[0], [f"a: {last_first[0]:02d}"]
    for label, d in zip(LABELS[1:], last_first[1:]):
        lines.append(f"{label}: {total:02d} + {d} = {total + d:02d}")
        total += d
    prompt = "Add: " + " ".join(map(str, digits))
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
