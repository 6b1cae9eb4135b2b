"""An embedded family of small function-writing problems, written in the published code formats.

A problem is a template (what the function does, e.g. "how many numbers of ``nums`` are greater
than k") and its constant ``k``. Each problem can be written as a KodCode record (``question``,
a pytest ``test`` module doing ``from solution import NAME``, ``test_info``, ``solution``), an
MBPP record (``text``, ``code``, ``test_list``), an evalplus record in the HumanEval or MBPP+
shape (``prompt``, ``canonical_solution``, ``base_input``, ``plus_input``, ``atol``) and a
LiveCodeBench functional record (``question_content``, ``starter_code`` with a ``Solution``
class, JSON public tests, private tests as base64 of zlib of a pickle of JSON, ``difficulty``).
The records go through the same loaders (`posttrain.data.formats`) as the published files, so the
miniature of the seed experiment (`posttrain demo --task code`) exercises them end to end.

Design choices:
- A problem's split is a pure function of (template, k) (a hash, as in the toy tasks): a held-out
  problem is never trained on, whatever the seed; templates are shared, constants are not.
- Held-out problems are dealt to the benchmarks by hash too (HumanEval, MBPP, LiveCodeBench), so
  no problem appears in two benchmarks except where the real ones overlap (MBPP and MBPP+ are the
  same problems, HumanEval and HumanEval+ one file with two input sets).
- LiveCodeBench difficulty is the template's (`Template.level`): one line, a loop or comprehension,
  or a loop with an early exit / sliding window.
- Reasoning traces (for the thinking SFT start) are a short plan written from the template, closed
  with ``</think>`` before the program, the shape ``code_format`` rewards.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import pickle
import zlib
from pathlib import Path

from posttrain.data.records import write_jsonl

EVAL_FRACTION = 0.2
KS = tuple(range(2, 50))
_SALT = "posttrain-code-family-v1"
BENCHMARKS = ("humaneval", "mbpp", "lcb")
"""Where a held-out problem goes (by hash)."""
LEVELS = ("easy", "medium", "hard")


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    args: str
    """The parameter list, e.g. ``nums``."""
    types: str
    """The annotated parameter list and return type, e.g. ``nums: List[int]) -> int``."""
    does: str
    """What it returns, with ``{k}``: "the number of items of nums greater than {k}"."""
    body: str
    """The reference body (indented 4), with ``{k}``."""
    plan: str
    """The reasoning trace, with ``{k}``."""
    level: str
    inputs: tuple
    """Argument tuples the tests call it with (the first three are the public / base ones)."""
    atol: float = 0.0


_INTS = ((3,), (0,), (-5,), (12,), (7,), (100,), (-1,), (41,))
_LISTS = (([1, 5, 9],), ([],), ([4, -2, 30, 7],), ([10, 20, 30, 40, 50],), ([-3, -8],), ([2, 2, 2, 2],),
          ([15, 1, 44, 3, 9, 27],), ([0],))
# Windows up to k = 49 need lists that long: with _LISTS alone (at most 6 numbers) every k past 6
# answered 0 on every test, and a program returning 0 passed.
_WINDOWS = (([1, 5, 9],), ([],), ([(i * 37) % 23 - 7 for i in range(60)],), ([10, 20, 30, 40, 50],),
            ([(i * 11) % 17 - 4 for i in range(55)],), ([2] * 50,), ([15, 1, 44, 3, 9, 27],), ([-3] * 52,))
_WORDS = (("ab",), ("",), ("xyz",), ("hello",), ("a",), ("q r",), ("1234",), ("zz",))
_FLOATS = (([1.5, 2.5],), ([0.1, 0.2, 0.3],), ([10.0],), ([-2.25, 4.75, 1.0],), ([3.3, 3.3, 3.4],),
           ([100.125, 0.5],), ([7.0, 8.0, 9.0, 10.0],), ([1e-3, 2e-3],))

TEMPLATES = (
    Template("add_k", "x", "x: int) -> int", "x plus {k}", "    return x + {k}\n",
             "Add {k} to x and return the sum.", "easy", _INTS),
    Template("times_k", "x", "x: int) -> int", "x multiplied by {k}", "    return x * {k}\n",
             "Multiply x by {k} and return the product.", "easy", _INTS),
    Template("is_multiple", "x", "x: int) -> bool", "True if x is divisible by {k}, else False",
             "    return x % {k} == 0\n", "x is divisible by {k} when x % {k} is 0.", "easy", _INTS),
    Template("repeat_text", "s", "s: str) -> str", "the string s repeated {k} times", "    return s * {k}\n",
             "Repeating a string {k} times is s * {k}.", "easy", _WORDS),
    Template("count_above", "nums", "nums: List[int]) -> int", "how many numbers of the list nums are greater than {k}",
             "    return sum(1 for n in nums if n > {k})\n",
             "Go through nums and count each n with n > {k}.", "medium", _LISTS),
    Template("add_to_all", "nums", "nums: List[int]) -> List[int]", "a new list with {k} added to each number of nums",
             "    return [n + {k} for n in nums]\n", "Build a new list of n + {k} for each n in nums.", "medium", _LISTS),
    Template("keep_below", "nums", "nums: List[int]) -> List[int]",
             "the numbers of the list nums that are less than {k}, in their order",
             "    return [n for n in nums if n < {k}]\n", "Keep each n of nums with n < {k}, in order.", "medium", _LISTS),
    Template("sum_times", "nums", "nums: List[int]) -> int", "the sum of the list nums multiplied by {k}",
             "    return sum(nums) * {k}\n", "Sum nums, then multiply the sum by {k}.", "medium", _LISTS),
    Template("mean_plus", "nums", "nums: List[float]) -> float", "the average of the list nums plus {k}",
             "    return sum(nums) / len(nums) + {k}\n", "The average is sum(nums) / len(nums); add {k}.",
             "medium", _FLOATS, atol=1e-6),
    Template("first_over", "nums", "nums: List[int]) -> int",
             "the index of the first number of nums greater than {k}, or -1 if there is none",
             "    for i, n in enumerate(nums):\n        if n > {k}:\n            return i\n    return -1\n",
             "Walk nums with its index; return the index of the first n > {k}; after the loop return -1.",
             "hard", _LISTS),
    Template("window_max", "nums", "nums: List[int]) -> int",
             "the largest sum of {k} consecutive numbers of nums, or 0 if nums has fewer than {k} numbers",
             "    if len(nums) < {k}:\n        return 0\n    return max(sum(nums[i:i + {k}]) for i in range(len(nums) - {k} + 1))\n",
             "If nums is shorter than {k} return 0; else take the sum of each window nums[i:i + {k}] and the max.",
             "hard", _WINDOWS),
    Template("count_vowels_over", "s", "s: str) -> bool", "True if the string s has more than {k} vowels (aeiou)",
             "    return sum(1 for c in s if c in 'aeiou') > {k}\n",
             "Count the characters of s that are in 'aeiou'; compare the count with {k}.", "hard",
             (("education",), ("",), ("aeiouaeiouaeiou",), ("rhythm",), ("banana",), ("queueing",), ("a" * 60,),
              ("oi",))),
)


@dataclasses.dataclass(frozen=True)
class Problem:
    template: Template
    k: int

    @property
    def name(self) -> str:
        return self.template.name

    @property
    def key(self) -> str:
        return f"{self.template.name}_{self.k}"

    @property
    def does(self) -> str:
        return self.template.does.format(k=self.k)

    @property
    def signature(self) -> str:
        return f"def {self.name}({self.template.args}):\n"

    @property
    def solution(self) -> str:
        return self.signature + self.template.body.format(k=self.k)

    @property
    def plan(self) -> str:
        return self.template.plan.format(k=self.k)

    def outputs(self) -> list:
        env: dict = {}
        exec(self.solution, env)  # our own reference, written above
        return [env[self.name](*args) for args in self.template.inputs]


def _hash01(text: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{_SALT}:{text}".encode()).digest()[:8], "big") / 2 ** 64


def split_of(p: Problem) -> str:
    return "eval" if _hash01(p.key) < EVAL_FRACTION else "train"


def benchmark_of(p: Problem) -> str:
    return BENCHMARKS[int(_hash01("bench:" + p.key) * len(BENCHMARKS))]


def all_problems() -> list[Problem]:
    return [Problem(t, k) for t in TEMPLATES for k in KS]


def _call(p: Problem, args: tuple) -> str:
    return f"{p.name}({', '.join(repr(a) for a in args)})"


def _assert(p: Problem, args: tuple, out) -> str:
    if p.template.atol:
        return f"assert abs({_call(p, args)} - {out!r}) <= {p.template.atol}"
    return f"assert {_call(p, args)} == {out!r}"


# ----------------------------------------------------------------------------- the formats
def kodcode_record(p: Problem) -> dict:
    """KodCode's shape: the question, a pytest module (a parametrized test and a plain one), test_info."""
    outs = p.outputs()
    cases = ", ".join(f"({args!r}, {out!r})" for args, out in zip(p.template.inputs[3:], outs[3:]))
    approx = "pytest.approx(expected)" if p.template.atol else "expected"
    test = (f"import pytest\nfrom solution import {p.name}\n\n\n"
            f"def test_{p.name}_examples():\n" + "".join(f"    {_assert(p, a, o)}\n" for a, o in
                                                         zip(p.template.inputs[:3], outs[:3]))
            + f"\n\n@pytest.mark.parametrize('args, expected', [{cases}])\n"
            f"def test_{p.name}_more(args, expected):\n    assert {p.name}(*args) == {approx}\n")
    return {"question_id": f"family_{p.key}", "subset": "family", "style": "instruct",
            "question": f"Write a function {p.name}({p.template.args}) that returns {p.does}.",
            "solution": p.solution, "test": test, "gpt_difficulty": p.template.level,
            "test_info": [{"function_name": p.name, "parameter_list": f"({p.template.args})",
                           "function_declaration": f"def {p.name}({p.template.args}):", "docstring": None}]}


def mbpp_record(p: Problem, task_id: int) -> dict:
    outs = p.outputs()
    return {"task_id": task_id, "text": f"Write a function {p.name} that returns {p.does}.", "code": p.solution,
            "test_list": [_assert(p, a, o) for a, o in zip(p.template.inputs[:3], outs[:3])],
            "test_setup_code": "", "challenge_test_list": []}


def evalplus_record(p: Problem, task_id: str) -> dict:
    """HumanEval+ (``HumanEval/N``: the prompt is the signature and docstring, the solution its body)
    or MBPP+ (``Mbpp/N``: the prompt a docstring with one assert, the solution the whole function)."""
    inputs = [list(a) for a in p.template.inputs]
    first, out = p.template.inputs[0], p.outputs()[0]
    if task_id.startswith("HumanEval/"):
        prompt = (f"def {p.name}({p.template.types}:\n    \"\"\"Return {p.does}.\n    >>> {_call(p, first)}\n"
                  f"    {out!r}\n    \"\"\"\n")
        solution = p.template.body.format(k=p.k)
    else:
        prompt = f'"""\nWrite a function {p.name} that returns {p.does}.\n{_assert(p, first, out)}\n"""\n'
        solution = p.solution
    typed = "from typing import List\n\n\n" if "List" in p.template.types and task_id.startswith("HumanEval/") else ""
    return {"task_id": task_id, "prompt": typed + prompt, "entry_point": p.name, "canonical_solution": solution,
            "base_input": inputs[:3], "plus_input": inputs[3:], "atol": p.template.atol}


def _private_blob(cases: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def livecodebench_record(p: Problem, qid: str) -> dict:
    """A functional (LeetCode-style) problem: a ``Solution`` method, each input one JSON line."""
    outs = p.outputs()
    cases = [{"input": "\n".join(json.dumps(a) for a in args), "output": json.dumps(out), "testtype": "functional"}
             for args, out in zip(p.template.inputs, outs)]
    return {"question_title": p.key, "question_id": qid, "platform": "leetcode", "contest_id": "family",
            "contest_date": "2026-01-01T00:00:00", "difficulty": p.template.level,
            "question_content": f"Given {p.template.args}, return {p.does}.",
            "starter_code": f"class Solution:\n    def {p.name}(self, {p.template.types}:\n        ",
            "public_test_cases": json.dumps(cases[:3]), "private_test_cases": _private_blob(cases[3:]),
            "metadata": json.dumps({"func_name": p.name})}


def lcb_solution(p: Problem) -> str:
    body = p.template.body.format(k=p.k).replace("\n    ", "\n        ")
    return f"class Solution:\n    def {p.name}(self, {p.template.types}:\n    {body}"


# ----------------------------------------------------------------------------- writing
def held_out_files(problems: list[Problem]) -> dict[str, list[dict]]:
    """The held-out problems as benchmark files: HumanEval+ (evalplus), MBPP (original) and MBPP+
    (evalplus) on the same problems, LiveCodeBench."""
    files: dict[str, list[dict]] = {"HumanEvalPlus": [], "mbpp": [], "MbppPlus": [], "lcb": []}
    for i, p in enumerate(problems):
        bench = benchmark_of(p)
        if bench == "humaneval":
            files["HumanEvalPlus"].append(evalplus_record(p, f"HumanEval/{i}"))
        elif bench == "mbpp":
            files["mbpp"].append(mbpp_record(p, 1000 + i))
            files["MbppPlus"].append(evalplus_record(p, f"Mbpp/{1000 + i}"))
        else:
            files["lcb"].append(livecodebench_record(p, f"family{i}"))
    return files


def sft_records(p: Problem, thinking: bool) -> list[dict]:
    """SFT examples of one training problem, its prompt in each published format (as the loaders
    render them) and the reference in a fence, after a reasoning trace when ``thinking``."""
    from posttrain.data.formats import convert

    trace = f"<think>{p.plan}</think>\n" if thinking else ""
    fenced = "```python\n{}```"
    rows = [(kodcode_record(p), p.solution), (mbpp_record(p, 0), p.solution),
            (evalplus_record(p, "HumanEval/0"), p.solution), (evalplus_record(p, "Mbpp/0"), p.solution),
            (livecodebench_record(p, "0"), lcb_solution(p))]
    return [{"prompt": convert(rec, "family")["prompt"], "completion": trace + fenced.format(code)}
            for rec, code in rows]


def write_code_family(out_dir: str | Path) -> dict[str, Path]:
    """Write the training files (KodCode-format ``train_kodcode.jsonl`` for RL, ``sft_direct.jsonl``
    and ``sft_thinking.jsonl``) and the held-out benchmark files; returns name -> path."""
    out = Path(out_dir)
    problems = all_problems()
    train = [p for p in problems if split_of(p) == "train"]
    held = [p for p in problems if split_of(p) == "eval"]
    written = {"train_kodcode": write_jsonl(out / "train_kodcode.jsonl", [kodcode_record(p) for p in train]),
               "sft_direct": write_jsonl(out / "sft_direct.jsonl", [r for p in train for r in sft_records(p, False)]),
               "sft_thinking": write_jsonl(out / "sft_thinking.jsonl", [r for p in train for r in sft_records(p, True)])}
    for name, rows in held_out_files(held).items():
        written[name] = write_jsonl(out / f"{name}.jsonl", rows)
    return written
