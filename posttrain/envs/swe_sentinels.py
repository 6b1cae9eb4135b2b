"""Sentinel tests for the SWE verdict: a forged "passed" shows, because some tests must fail.

A project's test suite imports the code under test into the process that runs it, so that code
can change anything the runner holds (its plugins, its reports, the test modules, the report's
channel). What it cannot do is tell apart tests it has not seen run. Before each verdict,
`hide` rewrites the hidden test modules (on the host; the sandbox gets only the result):

* every required test (FAIL_TO_PASS, PASS_TO_PASS) that can be found as a ``def`` is renamed to a
  fresh random name (same prefix, so the project's collection rules still pick it up), and
  its body is wrapped in ``try: ... finally: assert <a> % <m> == <r>``, a check that holds;
* next to some of them (FAIL_TO_PASS first) a copy is added under another random name, with
  the same decorators and body, whose final check does not hold: a **sentinel**, which fails
  whatever the code under test does (an early ``return``, a skip or an exception in its body
  still reaches the ``finally``).

The host keeps the map from random names back to the record's node ids; the sandbox sees only
random names. `Hidden.tampered` reads the report: a sentinel reported passed, or reported
anything but failed (missing, skipped) while its original passed, is tampering. A forgery that
makes every test pass, stops tests from running, serves stub modules, or writes a report of its
own passes the sentinels too. To forge a verdict the code under test must instead find which
tests are sentinels, by reading their code and working out the final check (docs/envs.md, "What
the SWE verdict trusts").

Tests that cannot be found as a ``def`` (doctests, generated tests), whose name also occurs
elsewhere in their module, or whose body starts on the ``def`` line keep their names and get no
sentinel; a test marked xfail, skip or expectedFailure gets no sentinel.
"""

from __future__ import annotations

import ast
import collections
import io
import re
import secrets
import tokenize
from dataclasses import dataclass, field

MAX_SENTINELS = 3
NOT_COPIED = re.compile(r"xfail|skip|expectedFailure")


@dataclass
class Hidden:
    """The rewritten test modules and the host's key to them.

    ``files``: path -> new text (only the modules rewritten); ``ids``: what pytest runs (renamed
    required ids and sentinel ids); ``original``: renamed id -> the record's id; ``sentinels``:
    sentinel id -> the renamed id of the test it copies (without parameters)."""

    files: dict[str, str] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    original: dict[str, str] = field(default_factory=dict)
    sentinels: dict[str, str] = field(default_factory=dict)

    def outcomes(self, reported: dict[str, str]) -> dict[str, str]:
        """The report's outcomes under the record's node ids."""
        return {self.original.get(k, k): v for k, v in reported.items()}

    def tampered(self, reported: dict[str, str]) -> list[str]:
        """Why the report cannot be true: each sentinel that did not fail where it had to."""
        out = []
        for sentinel, source in self.sentinels.items():
            mine = [v for k, v in reported.items() if _under(k, sentinel)]
            source_passed = any(v == "passed" for k, v in reported.items() if _under(k, source))
            if "passed" in mine or (source_passed and (not mine or any(v != "failed" for v in mine))):
                copied = next((old for new, old in self.original.items() if _under(new, source)), source)
                out.append(f"a test that must fail was reported {'passed' if 'passed' in mine else 'missing'} "
                           f"(a copy of {copied.partition('[')[0]})")
        return out


def _under(node_id: str, prefix: str) -> bool:
    """Whether ``node_id`` is the test ``prefix`` names, or one of its parameter sets."""
    return node_id == prefix or node_id.startswith(prefix + "[")


def _split(node_id: str) -> tuple[str, list[str], str, str]:
    """(path, enclosing classes, function name, parameters part) of a pytest node id."""
    path, *names = node_id.split("::")
    last = names[-1] if names else ""
    name, bracket, params = last.partition("[")
    return path, names[:-1], name, bracket + params


def _index(tree: ast.Module) -> dict[tuple[str, ...], object]:
    """(enclosing classes..., name) -> the function's node, for the module's functions and the
    methods of its top-level (and nested) classes; None where a name is defined twice."""
    out: dict[tuple[str, ...], object] = {}

    def walk(body, scope: tuple[str, ...]) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = (*scope, n.name)
                out[key] = None if key in out else n
            elif isinstance(n, ast.ClassDef):
                walk(n.body, (*scope, n.name))

    walk(tree.body, ())
    return out


def _string_lines(text: str) -> set[int]:
    """Line numbers (1-based) that start inside a string spanning lines: never re-indented."""
    out, opened = set(), []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        kind = tokenize.tok_name[tok.type]
        if kind == "FSTRING_START":
            opened.append(tok.start[0])
        elif kind == "FSTRING_END" and opened:
            out.update(range(opened.pop() + 1, tok.end[0] + 1))
        elif kind == "STRING":
            out.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return out


def _new_name(name: str) -> str:
    prefix = re.match(r"[A-Za-z]*", name).group(0) or "test"
    return prefix + ("_" if name[len(prefix):].startswith("_") else "") + secrets.token_hex(6)


def _check(holds: bool) -> str:
    """A final check whose truth shows only by working it out."""
    m = 7 + secrets.randbelow(90)
    a = m * (10 + secrets.randbelow(900)) + secrets.randbelow(m)
    r = a % m if holds else (a % m + 1 + secrets.randbelow(m - 1)) % m
    return f"assert {a} % {m} == {r}"


def _copy(lines: list[str], node, name: str, strings: set[int], holds: bool) -> list[str]:
    """The function ``node`` under ``name``, its body in try/finally with a final check."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    first = node.body[0].lineno
    header = lines[start - 1:first - 1]
    at = node.lineno - start
    header[at] = header[at].replace(f"def {node.name}", f"def {name}", 1)
    indent = " " * node.body[0].col_offset
    body = ["    " + ln if ln.strip() and n not in strings else ln
            for n, ln in enumerate(lines[first - 1:node.end_lineno], start=first)]
    return header + [indent + "try:", *body, indent + "finally:", indent + "    " + _check(holds)]


def _rewritable(words: collections.Counter, lines: list[str], node) -> bool:
    first, at = node.body[0], node.lineno - 1
    return (f"def {node.name}" in lines[at] and first.lineno > node.lineno and not lines[first.lineno - 1][:first.col_offset].strip()
            and words[node.name] == 1)


def _rewrite(text: str, wanted: list[tuple[str, bool]], hidden: Hidden, budget: list[int]) -> dict[str, str]:
    """Rewrite one module: ``wanted`` holds (node id, whether a sentinel may copy it). Returns the
    new name of each renamed test's node id prefix (``path::Class::name`` -> new one)."""
    try:
        tree = ast.parse(text)
        strings = _string_lines(text)
    except (SyntaxError, tokenize.TokenError, ValueError):
        return {}
    lines, edits, names = text.splitlines(), [], {}
    words = collections.Counter(re.findall(r"\w+", text))  # a name used once is only its def
    index = _index(tree)
    for node_id, may_copy in wanted:
        path, classes, name, _ = _split(node_id)
        prefix = "::".join([path, *classes, name])
        if prefix in names:
            continue
        node = index.get((*classes, name))
        if node is None or not _rewritable(words, lines, node):
            continue
        new = _new_name(name)
        names[prefix] = "::".join([path, *classes, new])
        block = _copy(lines, node, new, strings, True)
        decorators = "\n".join(lines[min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1:node.lineno])
        if may_copy and budget[0] > 0 and not NOT_COPIED.search(decorators):
            budget[0] -= 1
            sentinel = _new_name(name)
            hidden.sentinels["::".join([path, *classes, sentinel])] = names[prefix]
            copy = _copy(lines, node, sentinel, strings, False)
            block = [*copy, "", *block] if secrets.randbelow(2) else [*block, "", *copy]  # no tell in the order
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        edits.append((start, node.end_lineno, block))
    for start, end, block in sorted(edits, reverse=True):
        lines[start - 1:end] = block
    if edits:
        hidden.files[path] = "\n".join(lines) + "\n"
    return names


def hide(files: dict[str, str], f2p: list[str], p2p: list[str]) -> Hidden:
    """Rename the required tests in ``files`` (the verdict's tree) and add sentinels; see the
    module docstring. FAIL_TO_PASS tests are copied; where none can be, one PASS_TO_PASS test."""
    required = list(dict.fromkeys(f2p + p2p))
    hidden, renamed = _rewrite_all(files, required, set(f2p), MAX_SENTINELS)
    if not hidden.sentinels and renamed:
        hidden, renamed = _rewrite_all(files, required, set(required), 1)
    return _ids(required, renamed, hidden)


def _rewrite_all(files: dict[str, str], required: list[str], copyable: set[str], budget: int):
    hidden, renamed = Hidden(), {}
    by_path: dict[str, list[tuple[str, bool]]] = {}
    for node_id in sorted(required, key=lambda i: i not in copyable):  # copyable ones first
        by_path.setdefault(_split(node_id)[0], []).append((node_id, node_id in copyable))
    left = [budget]
    for path, wanted in by_path.items():
        if path.endswith(".py") and files.get(path) is not None:
            renamed.update(_rewrite(files[path], wanted, hidden, left))
    return hidden, renamed


def _ids(required: list[str], renamed: dict[str, str], hidden: Hidden) -> Hidden:
    by_source: dict[str, list[str]] = {}
    for sentinel, source in hidden.sentinels.items():
        by_source.setdefault(source, []).append(sentinel)
    for node_id in required:
        path, classes, name, params = _split(node_id)
        prefix = "::".join([path, *classes, name])
        new = renamed[prefix] + params if prefix in renamed else node_id
        copies = by_source.pop(renamed.get(prefix, ""), [])
        at = secrets.randbelow(2)  # each sentinel runs just before or just after its original
        hidden.ids += [*copies[:at], new, *copies[at:]]
        hidden.original[new] = node_id
    return hidden
