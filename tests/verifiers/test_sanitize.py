"""Code extraction as evalplus' ``sanitize``: one hand-made case per rule, the fast span search
against evalplus' own loop, and a real model's raw answers against evalplus' recorded output."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from posttrain.verifiers.sanitize import longest_valid_code, sanitize

ANSWERS = Path(__file__).parents[1] / "data" / "chat_answers" / "smollm2_humaneval.jsonl"


def _answers() -> list[dict]:
    return [json.loads(line) for line in ANSWERS.read_text().splitlines()]


def evalplus_code_extract(text: str) -> str:
    """evalplus' ``code_extract`` loop as published (every span parsed), the slow reference."""
    lines = text.split("\n")
    best, pair = 0, (0, 0)
    for i in range(len(lines)):
        for j in range(i + 1, len(lines)):
            try:
                ast.parse("\n".join(lines[i:j + 1]))
            except SyntaxError:
                continue
            count = sum(1 for line in lines[i:j + 1] if line.strip())
            if count > best:
                best, pair = count, (i, j)
    return "\n".join(lines[pair[0]:pair[1] + 1])


CLOSING_FENCE_THEN_PROSE = (
    "def add(a, b):\n    return a + b\n\n# Example usage:\nprint(add(1, 2))  # 3\n```\n\n"
    "In this code, the `add` function takes two numbers and returns their sum.")


def test_a_closing_fence_never_opened_and_the_prose_after_it_are_left_out():
    assert sanitize(CLOSING_FENCE_THEN_PROSE, "add") == "def add(a, b):\n    return a + b"


def test_the_longest_valid_span_wins_and_the_first_of_equals():
    two = "```python\ndef f():\n    return 1\n```\nor\n```python\ndef g():\n    return 2\n```"
    assert longest_valid_code(two) == "def f():\n    return 1"
    longer = "```\nx = 1\n```\n```\nimport math\ny = 2\nz = 3\n```"
    assert longest_valid_code(longer) == "import math\ny = 2\nz = 3"


def test_no_code_at_all_is_empty():
    assert sanitize("I cannot help with that request, sorry.") == ""
    assert sanitize("```python\n```") == ""


def test_top_level_calls_and_main_blocks_go_definitions_stay():
    text = ("import os\nfrom __future__ import annotations\nLIMIT = 3\n\nclass Box:\n    pass\n\n"
            "def f(x):\n    return x\n\ndef show():\n    print(1)\n\nf(2)\nprint(f(3))\n"
            "if __name__ == \"__main__\":\n    show()\n")
    # __future__ imports, functions without a return, calls and the main block are not kept
    assert sanitize(text) == "import os\nLIMIT = 3\nclass Box:\n    pass\ndef f(x):\n    return x"


def test_the_entry_point_keeps_what_it_needs_through_names():
    text = ("import re\nSCALE = 2\nUNUSED = 5\n\ndef helper(x):\n    return x * SCALE\n\n"
            "def other():\n    return 0\n\ndef solve(x):\n    return helper(x)\n")
    assert sanitize(text, "solve") == ("import re\nSCALE = 2\ndef helper(x):\n    return x * SCALE\n"
                                       "def solve(x):\n    return helper(x)")
    assert sanitize("class A:\n    def m(self):\n        return T\nT = 1\nV = 2", "A") == \
        "class A:\n    def m(self):\n        return T\nT = 1"  # method bodies count


def test_only_the_first_definition_of_a_name_is_kept():
    text = "def f():\n    return 1\n\ndef f():\n    return 2\n"
    assert sanitize(text, "f") == "def f():\n    return 1"


def test_decorated_definitions_are_not_kept_as_evalplus_does_not():
    text = "import functools\n\n@functools.cache\ndef f(n):\n    return n\n"
    assert sanitize(text, "f") == "import functools"


def test_a_function_keeps_its_trailing_comments_as_tree_sitter_spans_it():
    text = "def f():\n    return 1  # done\n\n    # more\nx = 2  # not kept\n# nor this\n"
    assert sanitize(text) == "def f():\n    return 1  # done\n\n    # more\nx = 2"


def test_ansi_escapes_are_removed_first():
    assert longest_valid_code("\x1b[32mdef f():\n    return 1\x1b[0m") == "def f():\n    return 1"


def test_the_span_search_equals_evalplus_loop_on_real_answers_and_cut_variants():
    texts = [a["answer"] for a in _answers()]
    texts += [t[:len(t) // 2] for t in texts] + [t.replace("```", "") for t in texts]
    texts += ["one line", "x = 1", "", "\n\n", "def f():\n\n    return 1\n\n\nprint(1)\nbad line here"]
    for text in texts:
        want = evalplus_code_extract(text)
        got = longest_valid_code(text)
        assert got == want or (got == "" and not _parses(want)), text


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


@pytest.mark.parametrize("answer", _answers(), ids=lambda a: a["task_id"])
def test_real_answers_extract_as_evalplus_sanitize_does(answer):
    """``evalplus_sanitized`` is what evalplus' own ``sanitize`` (tree-sitter) gave for the answer;
    where that is not Python (no code in the answer: evalplus returns its first line), ""."""
    want = answer["evalplus_sanitized"]
    assert sanitize(answer["answer"], answer["entry_point"]) == (want if _parses(want) else "")


def test_the_real_closing_fence_answer_hand_checked():
    answer = next(a for a in _answers() if a["task_id"] == "HumanEval/0")
    assert "```\n\nIn this code" in answer["answer"] and "```python" not in answer["answer"]
    assert sanitize(answer["answer"], answer["entry_point"]) == (
        "from typing import List\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(num - threshold <= 0 for num in numbers)")


def test_the_span_search_equals_evalplus_loop_on_spliced_fragments():
    """Fragments of real answers cut at random lines and joined with stray fences, brackets and
    quotes: open brackets and strings across lines are where skipping spans could go wrong."""
    import random

    rng = random.Random(0)
    texts = [a["answer"] for a in _answers()]
    strays = ["```", "```python", "Here it is:", "", "    ", "print(x)", ")", "'''", '"""', "  # note", "\tx = (", "]"]
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(1, 3)):
            lines = rng.choice(texts).split("\n")
            start = rng.randrange(len(lines))
            parts += lines[start:rng.randint(start, min(len(lines), start + 25))]
            parts += [rng.choice(strays)] if rng.random() < 0.5 else []
        text = "\n".join(parts[:45])
        want, got = evalplus_code_extract(text), longest_valid_code(text)
        assert got == want or (got == "" and not _parses(want)), text


def test_a_long_answer_costs_a_few_parses_per_line_not_one_per_span(monkeypatch):
    """evalplus parses every span (cubic in the lines): 150 lines of code then 150 of prose took
    over a minute; a span that reaches a line a longer one failed on is skipped."""
    from posttrain.verifiers import sanitize as module

    calls = []
    real = module._error_line
    monkeypatch.setattr(module, "_error_line", lambda code: calls.append(1) or real(code))
    code = "\n".join(f"x{i} = {i}" for i in range(150))
    prose = "\n".join(f"Line {i} explains the code: it works." for i in range(150))
    assert longest_valid_code(code + "\n" + prose) == code
    assert len(calls) <= 3 * 300
