"""The embedded arithmetic task: prompts like ``Solve: 17 × 13`` with checkable integer answers.

Design choices:

- **Three answer formats.** *direct* (``Answer: 221``), *trace* (worked steps, then
  ``Answer: 221``) and *think* (``<think>steps</think>\\nAnswer: 221``, the shape the format
  reward checks). Traces are short and regular so a tiny model can learn them:

  - ``×`` splits the second operand by place value: ``17 × 10 = 170``, ``17 × 3 = 51``,
    ``170 + 51 = 221``;
  - ``+`` adds column by column from the ones, with explicit carries, then states the sum;
  - ``-`` subtracts the second operand's place-value parts one at a time (``43 - 10 = 33``,
    ``33 - 7 = 26``). Subtraction keeps ``a >= b`` so answers are never negative, and uses the
    ASCII ``-`` (the embedded tokenizer was trained on it; U+2212 costs three byte tokens).

- **Splits by hashing the problem.** A problem's split is a pure function of the canonical
  ``(op, a, b)`` triple (operands sorted for the commutative ``+`` and ``×``), so train and
  held-out sets never share an operand pair, whatever the seed or sizes. The seed only picks
  which problems of a split are drawn.

- **A strict checker.** ``extract_answer`` takes the last line that is exactly
  ``Answer: <integer>`` (canonical digits, no sign other than ``-``, no punctuation); anything
  looser is a format failure, not a right answer.

- **Preference pairs** for DPO / reward models: *chosen* is the correct trace; *rejected* is the
  same trace with one plausible slip carried through to a wrong answer (a partial product or a
  subtraction step off by 10, or an addition carry dropped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Sequence
from pathlib import Path

from posttrain.data.records import write_jsonl

# CLI spelling -> symbol shown in prompts.
OPS: dict[str, str] = {"+": "+", "-": "-", "x": "×"}
FORMATS = ("trace", "direct", "think")
EVAL_FRACTION = 0.2
"""Share of the problem space reserved for held-out evaluation (by hash, not by sampling)."""
_SPLIT_SALT = "posttrain-arithmetic-v1"
_ANSWER_RE = re.compile(r"^Answer: (-?(?:0|[1-9][0-9]*))[ \t]*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One arithmetic problem; ``op`` is a key of `OPS` ("+", "-", "x")."""

    op: str
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"Solve: {self.a} {OPS[self.op]} {self.b}"

    @property
    def answer(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b


def place_parts(n: int) -> list[int]:
    """Non-zero place-value parts of ``n``, largest first: 403 -> [400, 3]; 0 -> [0]."""
    digits = str(n)
    parts = [int(d) * 10 ** (len(digits) - i - 1) for i, d in enumerate(digits) if d != "0"]
    return parts or [0]


def trace_steps(p: Problem, slip: int | None = None) -> tuple[list[str], int]:
    """The worked steps for ``p`` and the answer they reach.

    ``slip`` (an index into the steps that can go wrong) injects one plausible mistake that
    the remaining steps carry through faithfully, as a careless student would.
    """
    if p.op == "x":
        return _multiply_steps(p.a, p.b, slip)
    if p.op == "-":
        return _subtract_steps(p.a, p.b, slip)
    return _add_steps(p.a, p.b, slip)


def _multiply_steps(a: int, b: int, slip: int | None) -> tuple[list[str], int]:
    parts = place_parts(b)
    products = [a * part for part in parts]
    if slip is not None:
        products[slip] += 10
    lines = [f"{a} × {part} = {prod}" for part, prod in zip(parts, products)]
    if len(products) > 1:
        lines.append(" + ".join(map(str, products)) + f" = {sum(products)}")
    return lines, sum(products)


def _subtract_steps(a: int, b: int, slip: int | None) -> tuple[list[str], int]:
    lines, current = [], a
    for i, part in enumerate(place_parts(b)):
        result = current - part
        if i == slip:  # off by ten, the way a forgotten borrow is; never below zero
            result += -10 if result >= 10 else 10
        lines.append(f"{current} - {part} = {result}")
        current = result
    return lines, current


def _add_steps(a: int, b: int, slip: int | None) -> tuple[list[str], int]:
    """Column addition from the ones; ``slip`` = index of a column whose carry is dropped."""
    names = ["ones", "tens", "hundreds", "thousands", "ten-thousands", "hundred-thousands"]
    da, db = str(a)[::-1], str(b)[::-1]
    lines, carry, total = [], 0, 0
    for col in range(max(len(da), len(db))):
        x = int(da[col]) if col < len(da) else 0
        y = int(db[col]) if col < len(db) else 0
        s = x + y + carry
        terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
        name = names[col] if col < len(names) else f"10^{col}"
        new_carry = 0 if col == slip else s // 10
        lines.append(f"{name}: {terms} = {s}" + (f", carry {new_carry}" if new_carry else ""))
        total += (s % 10) * 10**col
        carry = new_carry
    total += carry * 10 ** max(len(da), len(db))
    lines.append(f"{a} + {b} = {total}")
    return lines, total


def slip_positions(p: Problem) -> list[int]:
    """Steps of ``p`` where a slip changes the final answer (for ``+``: the columns that carry)."""
    if p.op == "+":
        lines, _ = _add_steps(p.a, p.b, None)
        carries = [i for i, line in enumerate(lines[:-1]) if ", carry" in line]
        # A dropped carry inside the number reads more naturally than losing the leading digit.
        inner = [i for i in carries if i < len(lines) - 2]
        return inner or carries
    return list(range(len(place_parts(p.b))))


def completion(p: Problem, fmt: str, slip: int | None = None) -> str:
    """The completion text for ``p`` in format ``fmt`` ("trace", "direct" or "think")."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    lines, result = trace_steps(p, slip)
    if fmt == "direct":
        return f"Answer: {result}"
    steps = "\n".join(lines)
    if fmt == "think":
        return f"<think>{steps}</think>\nAnswer: {result}"
    return f"{steps}\nAnswer: {result}"


def extract_answer(text: str) -> str | None:
    """The integer on the last line that is exactly ``Answer: N``, or None.

    Strict on purpose: ``Answer: 221.``, ``answer: 221``, ``Answer: 0221`` or ``Answer: 2,21``
    are not answers, so a reward for them cannot be earned by sloppy output.
    """
    matches = _ANSWER_RE.findall(text)
    return matches[-1] if matches else None


def check_answer(completion_text: str, answer: str | int) -> bool:
    """True when the completion's final ``Answer:`` line equals ``answer`` exactly."""
    got = extract_answer(completion_text)
    return got is not None and got == str(answer).strip()


def split_of(p: Problem) -> str:
    """"train" or "eval", fixed by a hash of the canonical problem (see module docstring)."""
    a, b = (min(p.a, p.b), max(p.a, p.b)) if p.op in ("+", "x") else (p.a, p.b)
    digest = hashlib.sha256(f"{_SPLIT_SALT}:{p.op}:{a}:{b}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "eval" if u < EVAL_FRACTION else "train"


def parse_ops(spec: str | Sequence[str]) -> list[str]:
    """``"x"``, ``"+,-,x"``, ``"+-x"``, ``("×",)`` -> a list of `OPS` keys (no duplicates)."""
    aliases = {"×": "x", "*": "x", "−": "-"}
    text = spec if isinstance(spec, str) else "".join(spec)
    ops = []
    for ch in text.replace(",", "").replace(" ", ""):
        op = aliases.get(ch, ch)
        if op not in OPS:
            raise ValueError(f"unknown operation {ch!r} in {spec!r}; use +, - and x")
        if op not in ops:
            ops.append(op)
    if not ops:
        raise ValueError("no operations given; use +, - and x")
    return ops


def _operand_range(digits: int) -> tuple[int, int]:
    if digits < 1 or digits > 6:
        raise ValueError(f"digits must be in 1..6, got {digits}")
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def sample_problems(n: int, *, split: str, digits: int | tuple[int, int], ops: list[str],
                    seed: int) -> list[Problem]:
    """``n`` distinct problems of ``split``, drawn with ``seed``.

    ``digits`` is the number of digits of both operands, or a pair (first, second).
    """
    da, db = (digits, digits) if isinstance(digits, int) else tuple(digits)
    (low_a, high_a), (low_b, high_b) = _operand_range(da), _operand_range(db)
    rng = random.Random(f"{seed}:{split}")
    seen: set[Problem] = set()
    out: list[Problem] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"only {len(out)} distinct {split} problems found for digits={digits}, "
                             f"ops={''.join(ops)}; ask for fewer (n={n}) or more digits")
        op = rng.choice(ops)
        a, b = rng.randint(low_a, high_a), rng.randint(low_b, high_b)
        if op == "-" and a < b:
            a, b = b, a
        p = Problem(op, a, b)
        if p in seen or split_of(p) != split:
            continue
        seen.add(p)
        out.append(p)
    return out


def sft_record(p: Problem, fmt: str) -> dict:
    return {"prompt": p.prompt, "completion": completion(p, fmt), "answer": str(p.answer)}


def prompt_record(p: Problem) -> dict:
    return {"prompt": p.prompt, "answer": str(p.answer)}


def preference_record(p: Problem, fmt: str, rng: random.Random) -> dict | None:
    """A chosen/rejected pair, or None when no slip changes the answer (e.g. ``5 + 3``)."""
    slips = slip_positions(p)
    if not slips:
        return None
    fmt = "think" if fmt == "think" else "trace"
    return {"prompt": p.prompt, "chosen": completion(p, fmt),
            "rejected": completion(p, fmt, slip=rng.choice(slips)), "answer": str(p.answer)}


def write_arithmetic(out_dir: str | Path, *, n_train: int = 2000, n_eval: int = 200, seed: int = 0,
                     digits: int | tuple[int, int] = 2, ops: str | Sequence[str] = "x",
                     fmt: str = "trace") -> dict[str, Path]:
    """Write the six arithmetic files into ``out_dir``; returns name -> path.

    ``digits``: digits per operand, or a (first, second) pair; ``ops``: e.g. ``"x"``, ``"+,-,x"``
    or ``("×",)``; ``fmt``: "trace", "direct" or "think" (pairs always carry traces).
    """
    op_list = parse_ops(ops)
    out = Path(out_dir)
    written = {}
    for split, n in (("train", n_train), ("eval", n_eval)):
        problems = sample_problems(n, split=split, digits=digits, ops=op_list, seed=seed)
        rng = random.Random(f"{seed}:{split}:pairs")
        pairs = [r for p in problems if (r := preference_record(p, fmt, rng)) is not None]
        written[split] = write_jsonl(out / f"{split}.jsonl", [sft_record(p, fmt) for p in problems])
        written[f"prompts_{split}"] = write_jsonl(out / f"prompts_{split}.jsonl",
                                                  [prompt_record(p) for p in problems])
        written[f"pairs_{split}"] = write_jsonl(out / f"pairs_{split}.jsonl", pairs)
    return written
