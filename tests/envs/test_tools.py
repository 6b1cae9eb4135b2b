"""Tools: schemas from signatures and docstrings, the call syntax, and the calculator."""

from typing import Literal

import pytest

from posttrain.envs.calculator import CALCULATOR, calculator
from posttrain.envs.tools import MalformedCall, Tool, format_call, parse_tool_calls, tools_system_text


def lookup(city: str, days: int = 1, unit: Literal["C", "F"] = "C", hours: list[int] | None = None) -> str:
    """Weather forecast for a city.

    More text that is not the description.

    Args:
        city: the city's name
        days: how many days
            ahead (1-7)
        unit: temperature unit

    Returns:
        the forecast
    """
    return f"{city}:{days}{unit}"


def test_schema_comes_from_the_signature_and_the_docstring():
    t = Tool.from_function(lookup)
    assert t.schema == {"type": "function", "function": {
        "name": "lookup", "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "days": {"type": "integer", "description": "how many days ahead (1-7)"},
            "unit": {"enum": ["C", "F"], "description": "temperature unit"},
            "hours": {"type": "array", "items": {"type": "integer"}}}}}}


def test_untyped_parameters_are_refused():
    def f(x):
        return x

    with pytest.raises(TypeError, match="annotation"):
        Tool.from_function(f)


def test_calls_parse_in_order_and_a_turn_without_one_is_an_answer():
    tools = {"lookup": Tool.from_function(lookup)}
    text = "first " + format_call("lookup", {"city": "Oslo"}) + " then " + format_call("lookup", {"city": "Rome", "days": 3})
    calls = parse_tool_calls(text, tools)
    assert [(c.name, c.arguments) for c in calls] == [("lookup", {"city": "Oslo"}), ("lookup", {"city": "Rome", "days": 3})]
    assert parse_tool_calls("Answer: 12", tools) == []


@pytest.mark.parametrize("text, needle", [
    ('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}', "needs its own"),
    ("<tool_call>{name: lookup}</tool_call>", "not valid JSON"),
    ('<tool_call>["lookup"]</tool_call>', '{"name"'),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown tool 'nope'"),
    ('<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "missing argument(s) city"),
    ('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo", "when": 1}}</tool_call>', "unknown argument(s) when"),
    ('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo", "days": "3"}}</tool_call>', "'days' should be integer"),
    ('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo", "unit": "K"}}</tool_call>', "one of ['C', 'F']"),
    ('<tool_call>{"name": "lookup", "arguments": "Oslo"}</tool_call>', "JSON object"),
])
def test_malformed_calls_say_what_is_wrong(text, needle):
    with pytest.raises(MalformedCall, match=None) as info:
        parse_tool_calls(text, {"lookup": Tool.from_function(lookup)})
    assert needle in str(info.value)


def test_calculator_evaluates_and_refuses_what_it_should():
    assert calculator("347 * 86") == "29842"
    assert calculator("347 × 86") == "29842"
    assert calculator("(2 + 3) * 4 / 2") == "10"
    assert calculator("7 / 2") == "3.5"
    for bad in ("__import__('os')", "9 ** 9 ** 9", "x + 1", "2 +"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculator(bad)
    with pytest.raises(ZeroDivisionError):
        calculator("1 / 0")


def test_tools_are_offered_as_json_or_compact_or_not_at_all():
    assert '"name": "calculator"' in tools_system_text([CALCULATOR], "json")
    assert tools_system_text([CALCULATOR], "compact").startswith("Tools: calculator(expression: string)")
    assert tools_system_text([CALCULATOR], "none") == ""


def test_the_documented_environments_run_and_are_short(tmp_path, monkeypatch, nano_tokenizer, scripted):
    import re
    from pathlib import Path

    from posttrain.envs import run_episodes
    from posttrain.envs.tools import format_call
    from posttrain.outcome import OutcomeClass
    from posttrain.rollout import SamplingParams

    doc = (Path(__file__).resolve().parents[2] / "docs" / "envs.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.DOTALL)[1]
    assert len(code.splitlines()) < 50  # two environments; the first well under 40 lines
    (tmp_path / "doc_envs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    import doc_envs

    guesses = iter(["50", "25", "37"])
    (e,) = run_episodes(scripted(lambda p, i: next(guesses)), nano_tokenizer, doc_envs.Guess, [{"prompt": "", "answer": "37"}],
                        1, SamplingParams())
    assert e.outcome.cls is OutcomeClass.PASS and [m["content"] for m in e.messages[2::2]] == ["lower", "higher"]
    calls = iter([format_call("population", {"city": "Paris"}), format_call("population", {"city": "Oslo"}), "709000"])
    (e,) = run_episodes(scripted(lambda p, i: next(calls)), nano_tokenizer, doc_envs.Census,
                        [{"prompt": "Population of Oslo?", "answer": "709000"}], 1, SamplingParams())
    assert e.outcome.cls is OutcomeClass.PASS and (e.tool_calls, e.tool_errors) == (2, 1)
