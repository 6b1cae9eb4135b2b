"""The embedded calculator environment: multiplication the tiny model cannot do in its head.

Problems are the arithmetic task's (`posttrain.tasks.arithmetic`: same prompts ``Solve: 347 × 86``,
same hash split, the strict ``Answer: N`` checker), with 3- and 4-digit operands by default. The
model has one tool, ``calculator(expression)``; a good episode is two turns:

    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "347 * 86"}}</tool_call>
    tool:      29842
    assistant: Answer: 29842

The calculator evaluates + - * / // % ** and parentheses on numbers (``×`` and ``÷`` read as
``*`` and ``/``) by walking the parsed expression: no names, calls or attributes, and operands
bounded so that ``9**9**9`` is refused rather than hanging. A bad expression raises, which the
tool environment shows to the model as an error (its fault, counted in ``tool_errors``).

`sft_record` writes the trace above as a chat conversation for `posttrain sft` (the way a user
would make a warm start for tool use); `write_calculator_data` writes train/eval prompts and traces.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from posttrain.envs.tool_env import ToolEnv
from posttrain.envs.tools import Tool, format_call, with_tools_message
from posttrain.outcome import Outcome
from posttrain.tasks.arithmetic import Problem, extract_answer, parse_ops, sample_problems

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_LIMIT = 10 ** 30


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 10 ** 6):
            raise ValueError("exponent too large")
        out = _BINARY[type(node.op)](a, b)
        if abs(out) > _LIMIT:
            raise ValueError("result too large")
        return out
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. 347 * 86
    """
    text = expression.replace("×", "*").replace("÷", "/").replace("−", "-")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


CALCULATOR = Tool.from_function(calculator)


class CalculatorEnv(ToolEnv):
    """Arithmetic with a calculator; the final answer is judged like the arithmetic task's."""

    def __init__(self, *, tools_style: str = "compact", on_malformed: str = "continue", max_turns: int | None = None):
        super().__init__([CALCULATOR], tools_style=tools_style, on_malformed=on_malformed, max_turns=max_turns)

    def judge(self, text: str) -> Outcome:
        answer = self.example.get("answer")
        if answer is None:
            return Outcome.task_fail("no_answer", "the example has no 'answer'")
        got = extract_answer(text)
        if got is None:
            return Outcome.model_fail("format", detail="no line 'Answer: <integer>'")
        if got != str(answer).strip():
            return Outcome.model_fail("wrong_answer", detail=f"got {got}, expected {answer}")
        return Outcome.passed()


def _expression(p: Problem) -> str:
    return f"{p.a} {'*' if p.op == 'x' else p.op} {p.b}"


def sft_record(p: Problem, tools_style: str = "compact", direct: bool = False) -> dict:
    """The two-turn tool-using trace of ``p`` as a chat conversation (``messages``); with ``direct``
    the answer written at once, without the tool (what a model that guesses does)."""
    user = with_tools_message([{"role": "user", "content": p.prompt}], [CALCULATOR], tools_style)
    if direct:
        return {"messages": user + [{"role": "assistant", "content": f"Answer: {p.answer}"}]}
    return {"messages": user + [
        {"role": "assistant", "content": format_call("calculator", {"expression": _expression(p)})},
        {"role": "tool", "content": calculator(_expression(p))},
        {"role": "assistant", "content": f"Answer: {p.answer}"}]}


def write_calculator_data(out_dir: str | Path, *, n_train: int = 2000, n_eval: int = 200, seed: int = 0,
                          digits: tuple[int, int] = (3, 3), ops: str = "x", tools_style: str = "compact",
                          direct_frac: float = 0.0) -> dict[str, Path]:
    """``prompts_train.jsonl`` / ``prompts_eval.jsonl`` ({prompt, answer}) and ``sft_train.jsonl``
    (tool-using traces; ``direct_frac`` of them answer at once instead) in ``out_dir``."""
    import random

    from posttrain.data.records import write_jsonl

    out, written, rng = Path(out_dir), {}, random.Random(seed)
    for split, n in (("train", n_train), ("eval", n_eval)):
        problems = sample_problems(n, split=split, digits=digits, ops=parse_ops(ops), seed=seed)
        written[f"prompts_{split}"] = write_jsonl(out / f"prompts_{split}.jsonl",
                                                  [{"prompt": p.prompt, "answer": str(p.answer)} for p in problems])
        if split == "train":
            written["sft_train"] = write_jsonl(out / "sft_train.jsonl", [
                sft_record(p, tools_style, direct=rng.random() < direct_frac) for p in problems])
    return written
