"""The import picture: packages stand on floors and arrows only point down or sideways, no two
packages import each other, and no module imports itself back through others (function-level
imports included: a lazy import is still a dependency); ``if TYPE_CHECKING:`` imports are
annotations."""

import ast
from pathlib import Path

import pytest

import posttrain

ROOT = Path(posttrain.__file__).parent
FLOORS = [
    {"algos", "rollout", "outcome", "errors", "config", "jsonl", "tracking"},
    {"core", "data", "models", "sandbox", "tasks", "distributed"},
    {"verifiers", "envs"},
    {"train", "rl"},
    {"eval", "study", "demo", "cli", "__main__", "serve", "tinker"},
]
FLOOR = {pkg: i for i, names in enumerate(FLOORS) for pkg in names}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = set() if annotations else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
        and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posttrain"):
            # ``from package import submodule`` depends on the submodule, not on the package's __init__
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs if len(subs) == len(node.names) else {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("posttrain")}
    return out


def _graph(annotations: bool = False) -> dict[str, set[str]]:
    paths = list(ROOT.rglob("*.py"))
    modules = {_module(p) for p in paths}
    return {_module(p): _imports(p, modules, annotations) for p in paths}


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else "posttrain"


def test_every_package_has_a_floor():
    assert {_package(m) for m in _graph()} - {"posttrain"} <= set(FLOOR)


def test_arrows_never_point_up():
    bad = [f"{a} -> {b}" for a, bs in _graph().items() for b in bs
           if FLOOR.get(_package(b), 0) > FLOOR.get(_package(a), 0)]
    assert not bad, bad


def test_no_two_packages_import_each_other():
    edges = {(_package(a), _package(b)) for a, bs in _graph().items() for b in bs}
    mutual = sorted((a, b) for a, b in edges if a < b and (b, a) in edges)
    assert not mutual, mutual


@pytest.mark.parametrize("annotations", [False, True])
def test_no_module_imports_itself_back(annotations):
    """Not even for an annotation: a type two modules both need belongs below them both."""
    graph = {m: {b for b in bs if b in _graph_modules} for m, bs in _graph(annotations).items()}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not cycles, [" -> ".join(c) for c in cycles[:5]]


_graph_modules = set(_graph())
