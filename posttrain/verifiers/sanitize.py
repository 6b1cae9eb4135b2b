"""The program in a chat answer, extracted as evalplus' ``sanitize`` extracts it.

Chat models wrap code in prose and fences, and not always in pairs: a small instruct model answers
with code, then a closing fence it never opened, then prose. Fences are therefore not trusted;
as evalplus (``evalplus/sanitize.py``) does, the program is found by parsing:

1. `longest_valid_code`: the span of whole lines, at least two, that parses as Python and has the
   most non-blank lines (the first such span wins a tie; ANSI escapes removed first). Fence lines
   and prose do not parse, so they bound the span.
2. `sanitize`: from that span, the imports, then the classes, the functions that contain a
   ``return``, and the assignments, each name's first definition only; with an entry point, only
   the definitions it reaches through the names they mention (a breadth-first walk). Everything
   else at top level goes: example calls, ``print``s, ``if __name__ == "__main__":`` blocks. If
   nothing is left, the span itself.

evalplus parses with tree-sitter; this uses the standard library's ``ast`` and reproduces
tree-sitter's view where the two differ: decorated definitions, augmented assignments and
``from __future__`` imports are not among the kept node types, and a definition's dependencies
are every identifier in it (attribute names and parameters included). Two differences are
deliberate: where no span parses the result is empty (evalplus returns the answer's first line,
which cannot run either), and the span search skips spans that cannot beat the best one found and
spans that run past the line a longer span with the same start failed on (same result: a few parses
per start line where evalplus parses every span, cubic in the answer's length).
"""

from __future__ import annotations

import ast
import re
import warnings

_ANSI_RE = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")


def parses(code: str) -> bool:
    """Whether ``code`` is syntactically valid Python (parsed, never run)."""
    return _error_line(code) == 0


def _error_line(code: str) -> int | None:
    """0 when ``code`` parses, else the 1-based line the parser failed on (None when not known)."""
    try:
        with warnings.catch_warnings():  # an invalid escape in the program is its business, not the log's
            warnings.simplefilter("ignore")
            ast.parse(code)
    except SyntaxError as e:
        return e.lineno or None
    except (ValueError, MemoryError, RecursionError):  # ValueError: a NUL byte
        return None
    return 0


def longest_valid_code(text: str) -> str:
    """The span of at least two whole lines that parses and has the most non-blank lines (evalplus'
    ``code_extract``); the first line alone when no such span exists and it parses, else ""."""
    lines = _ANSI_RE.sub("", text).split("\n")
    filled = [0]  # filled[k]: non-blank lines among lines[:k]
    for line in lines:
        filled.append(filled[-1] + bool(line.strip()))
    best, best_span = 0, None
    for i in range(len(lines)):
        if filled[-1] - filled[i] <= best:  # no span from i can beat the best: evalplus keeps the first
            break
        j = len(lines) - 1
        while j > i and filled[j + 1] - filled[i] > best:
            error = _error_line("\n".join(lines[i:j + 1]))
            if error == 0:
                best, best_span = filled[j + 1] - filled[i], _shortest_end(lines, filled, i, j)
                break
            # Every shorter span from i that still reaches the line the parser failed on feeds it the
            # same tokens up to that line, so it fails there too: go on with those ending before it.
            j = min(j - 1, i + error - 2) if error else j - 1
    if best_span is None:
        return lines[0] if parses(lines[0]) else ""
    return "\n".join(lines[best_span[0]:best_span[1] + 1])


def _shortest_end(lines: list[str], filled: list[int], i: int, j: int) -> tuple[int, int]:
    """evalplus scans ends upwards and keeps the first span reaching a count: the smallest end with
    the same count of non-blank lines that still parses (only trailing blank lines can go)."""
    count = filled[j + 1] - filled[i]
    end = j
    while end - 1 > i and filled[end] - filled[i] == count and parses("\n".join(lines[i:end])):
        end -= 1
    return i, end


def _identifiers(node: ast.AST) -> set[str]:
    """Every identifier in ``node``, as tree-sitter names them: variables, attribute names,
    parameters, keyword names, definition and import names."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.keyword) and n.arg:
            names.add(n.arg)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, ast.alias):
            names.update(n.name.split("."))
            names.update([n.asname] if n.asname else [])
        elif isinstance(n, ast.Global | ast.Nonlocal):
            names.update(n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _assigned_name(node: ast.Assign | ast.AnnAssign) -> str | None:
    """The name tree-sitter gives an assignment: its target when that is a plain name, else its
    value when that is one (``a, b = c`` is named ``c``)."""
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    if isinstance(target, ast.Name):
        return target.id
    return node.value.id if isinstance(node.value, ast.Name) else None


def _definitions(tree: ast.Module) -> tuple[list[ast.stmt], list[tuple[str | None, ast.stmt]]]:
    """(imports, [(name, definition)]) at top level, each name's first definition only."""
    imports, defs, seen = [], [], set()
    for node in tree.body:
        if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imports.append(node)
            continue
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.decorator_list:  # tree-sitter: a decorated_definition, not a kept node type
                continue
            name = node.name
            keep = isinstance(node, ast.ClassDef) or any(isinstance(n, ast.Return) for n in ast.walk(node))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            name, keep = _assigned_name(node), True
        else:
            continue
        if keep and name not in seen:
            seen.add(name)
            defs.append((name, node))
    return imports, defs


def _reachable(entry_point: str, deps: dict[str | None, set[str]]) -> set[str]:
    """Names reached from ``entry_point`` through the names each definition mentions."""
    seen, queue = {entry_point}, [entry_point]
    while queue:
        for name in deps.get(queue.pop(0), ()):
            if name not in seen:
                seen.add(name)
                queue.append(name)
    return seen


def sanitize(text: str, entry_point: str | None = None) -> str:
    """The program evalplus' ``sanitize(text, entrypoint)`` gives: the imports and the definitions
    ``entry_point`` needs from the longest valid code in ``text`` (all definitions without an
    entry point); that code itself when none are found; "" when no code parses."""
    code = longest_valid_code(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    imports, defs = _definitions(tree)
    if entry_point:
        wanted = _reachable(entry_point, {name: _identifiers(node) for name, node in defs})
        defs = [(name, node) for name, node in defs if name in wanted]
    lines = code.split("\n")
    kept = [_source(code, lines, node) for node in [*imports, *(node for _, node in defs)]]
    return "\n".join(kept).strip() or code


def _source(code: str, lines: list[str], node: ast.stmt) -> str:
    """A kept statement's text as tree-sitter spans it: a class or function also takes the comment
    ending its last line and the comment lines after it indented as its body (tree-sitter's block
    runs to them), so the text equals evalplus' byte for byte."""
    if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return ast.get_source_segment(code, node) or ""
    end = node.end_lineno - 1
    tail = lines[end].encode()[node.end_col_offset:].decode(errors="replace")
    if tail.lstrip().startswith("#"):
        text = "\n".join(lines[node.lineno - 1:end + 1])
    else:
        text = ast.get_source_segment(code, node) or ""
    body_indent, extra = node.body[0].col_offset, []
    for line in lines[end + 1:]:
        if not line.strip():
            extra.append(line)
        elif line.lstrip().startswith("#") and len(line) - len(line.lstrip()) >= body_indent:
            text += "\n" + "\n".join([*extra, line])
            extra = []
        else:
            break
    return text
