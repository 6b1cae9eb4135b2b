"""Tools: plain Python functions offered to the model, and the tool-call syntax.

A tool is a function with typed parameters and a docstring. `Tool.from_function` derives its
JSON schema (OpenAI's ``{"type": "function", "function": {name, description, parameters}}``)
from the signature (``int`` -> integer, ``float`` -> number, ``str``, ``bool``, ``list[X]``,
``dict``, ``Literal[...]`` -> enum; a parameter without a default is required) and from the
docstring (first paragraph = description; an ``Args:`` section describes the parameters).

The call syntax (the embedded ChatML template has no tool format of its own, so we use the
Hermes/Qwen one that many templates share): the assistant writes one or more

    <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>

blocks; each result comes back as a ``{"role": "tool", "name": ..., "content": ...}`` message.
How the tools are offered (`render_tools`): through the template itself when it takes
``tools=`` (its source mentions ``tools``), else in a system message — the schemas as JSON
(``json``), one line per tool (``compact``), or not at all (``none``: a model taught the tools
by SFT does not need them spelled out).

Faults: a call that does not parse, names an unknown tool or passes arguments that do not fit
the signature is `MalformedCall` (the model's fault); a tool that raises is the model's fault
too (its arguments were bad: the error text is shown to it) unless it raises `EnvInfraError`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from typing import Any, Callable, Literal

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "array"}


class MalformedCall(ValueError):
    """A tool call the model got wrong; the message says how."""


def _json_type(tp) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple):
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _json_type(rest[0]) if len(rest) == 1 else {"anyOf": [_json_type(a) for a in rest]}
    raise TypeError(f"tool parameter type {tp!r} has no JSON schema; use int, float, str, bool, list, dict, Literal")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) of a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:")
    description = " ".join(head.split("\n\n")[0].split())
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        m = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if m:
            current = m[1]
            params[current] = m[2].strip()
        elif current and line.strip() and line.startswith("        "):
            params[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break  # the next section (Returns:, Raises:)
    return description, params


@dataclasses.dataclass
class Tool:
    """A callable offered to the model, with its JSON schema."""

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict
    """JSON schema of the arguments (an object)."""

    @staticmethod
    def from_function(fn: Callable[..., Any], name: str | None = None) -> "Tool":
        hints = typing.get_type_hints(fn)
        description, docs = _docstring_parts(fn.__doc__ or "")
        props, required = {}, []
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {fn.__name__}: *args/**kwargs have no schema")
            if p.name not in hints:
                raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} needs a type annotation")
            props[p.name] = _json_type(hints[p.name]) | ({"description": docs[p.name]} if p.name in docs else {})
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        return Tool(name or fn.__name__, fn, description,
                    {"type": "object", "properties": props, "required": required})

    @property
    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def check_arguments(self, arguments: dict) -> None:
        """Raise `MalformedCall` unless ``arguments`` fit the signature (names and JSON types)."""
        props, required = self.parameters["properties"], self.parameters["required"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise MalformedCall(f"{self.name}: unknown argument(s) {', '.join(unknown)}")
        missing = [r for r in required if r not in arguments]
        if missing:
            raise MalformedCall(f"{self.name}: missing argument(s) {', '.join(missing)}")
        for key, value in arguments.items():
            if not _fits(value, props[key]):
                raise MalformedCall(f"{self.name}: argument {key!r} should be {_describe(props[key])}, "
                                    f"got {json.dumps(value)}")


def _fits(value, schema: dict) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    if "anyOf" in schema:
        return any(_fits(value, s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(_fits(v, schema.get("items", {})) for v in value)
    py = {"string": str, "boolean": bool, "object": dict}.get(kind)
    return py is None or isinstance(value, py)


def _describe(schema: dict) -> str:
    return f"one of {schema['enum']}" if "enum" in schema else schema.get("type", "any")


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Decorator form of `Tool.from_function`: ``@tool`` or ``@tool(name="calc")``."""
    if fn is None:
        return lambda f: Tool.from_function(f, name)
    return Tool.from_function(fn, name)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_tool_calls(text: str, tools: dict[str, Tool]) -> list[ToolCall]:
    """The tool calls in an assistant turn, in order ([] when it makes none).

    Raises `MalformedCall` for an unclosed block, a body that is not a JSON object with a string
    ``name`` and an object ``arguments``, an unknown tool, or arguments that do not fit.
    """
    if OPEN not in text and CLOSE not in text:
        return []
    bodies = TOOL_CALL_RE.findall(text)
    if text.count(OPEN) != len(bodies) or text.count(CLOSE) != len(bodies):
        raise MalformedCall(f"every {OPEN} needs its own {CLOSE}")
    calls = []
    for body in bodies:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            raise MalformedCall(f"the tool call is not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise MalformedCall('a tool call is {"name": ..., "arguments": {...}}')
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            raise MalformedCall("'arguments' must be a JSON object")
        if obj["name"] not in tools:
            raise MalformedCall(f"unknown tool {obj['name']!r}; tools: {', '.join(tools)}")
        tools[obj["name"]].check_arguments(args)
        calls.append(ToolCall(obj["name"], args))
    return calls


def format_call(name: str, arguments: dict) -> str:
    """The text of a call in our syntax (what a trace for SFT writes)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


TOOLS_STYLES = ("json", "compact", "none")


def template_takes_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` argument itself."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tools_system_text(tools: list[Tool], style: str) -> str:
    """The system message offering ``tools`` when the template has no tool format of its own."""
    if style == "none" or not tools:
        return ""
    how = f'To call a tool write {OPEN}{{"name": NAME, "arguments": {{...}}}}{CLOSE}; its result comes back.'
    if style == "compact":
        sigs = [f"{t.name}({', '.join(f'{k}: {_describe(v)}' for k, v in t.parameters['properties'].items())})"
                f": {t.description}" for t in tools]
        return "Tools: " + "; ".join(sigs) + "\n" + how
    return "You may call these tools:\n<tools>\n" + "\n".join(json.dumps(t.schema) for t in tools) + \
        "\n</tools>\n" + how


def with_tools_message(messages: list[dict], tools: list[Tool], style: str) -> list[dict]:
    """``messages`` with the tools offered in the system message (merged into an existing one)."""
    system = tools_system_text(tools, style)
    if not system:
        return list(messages)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + system}] + list(messages[1:])
    return [{"role": "system", "content": system}] + list(messages)
