"""Pytest-style tests judged in the judge process: real pytest, with the program behind a proxy.

Runs inside the sandbox, in the judge (imported there as ``posttrain_pytest_judge`` from the
read-only library folder the worker binds next to the pytest library; standard library and
pytest only). The task's test module imports the program as a module (KodCode's ``from solution
import f``); here that module is a `RemoteModule` whose every name lives in the candidate's
process. The test module, pytest and the verdict live in the judge, so nothing the program does
in its own process (``sys.exit(0)`` or ``os._exit`` at import, patching ``pytest`` or
``builtins``, writing a ``conftest.py``) reaches the verdict.

What crosses from the program, and how the judge reads it:

- **values**: exact builtin types only (`zygote.decode`, strict), so an object "equal to
  everything" cannot come back as a value. Any other object stays in the candidate and comes
  back as a `RemoteObject` handle: attribute access, calls, ``len``/``bool``/``str``/``repr``,
  iteration and indexing go to the candidate and answer with data of the type the operation
  needs (``len`` an int, ``bool`` a bool...). Equality of a handle is identity and ``in`` is
  decided in the judge over the items as data: the program's ``__eq__`` and ``__contains__``
  are never asked, so a handle never equals, nor claims to hold, an expected value.
- **exceptions**: by name. A builtin exception comes back as a subclass of that builtin; an
  exception class the program defines becomes a local class with its nearest builtin base, so
  ``pytest.raises`` and ``except`` work; ``SystemExit``/``KeyboardInterrupt`` end the run.
  Only builtin exception classes cross, never pytest's own outcome exceptions (skip, xfail).
- **printed text**: what the program prints during a call is captured there and written to
  the judge's ``sys.stdout``/``sys.stderr`` (``capsys`` reads it).
- **in-place changes** to list, dict and set arguments are copied back after each call.

Arguments go to the program as data, handles it gave out, or paths (``tmp_path``); anything else
(a lambda, a judge-side object) cannot be sent and fails that test: such a task's reference
fails too, and `posttrain sandbox audit` flags it. The test module is written to the judge's own
tmpfs (mode 0700, the program's uid cannot enter) and run with ``--noconftest``, a trusted ini
file and no plugin autoloading; the tests' working folder is a fresh folder there too (files they
write by a relative name stay the judge's; the program's own working folder is ``/tmp``);
``tmp_path`` is under the shared ``/tmp``, opened to the program's uid, since tests hand it files
there.

``from solution import *`` (KodCode's harness puts it before every test module) imports what
plain Python would (the program's ``__all__``, else every name not starting with ``_``) except a
name that shadows a builtin or one the test module binds itself (its imports, constants,
helpers) or one by which a module steers pytest itself (``pytest_plugins``,
``pytest_generate_tests``): so pytest sees the program's ``setup_function``/``teardown_function``
(called with None for the function, which cannot cross) and its ``test_*`` functions, as plain
pytest does.
A program's name for a standard-library module (``sys``, ``math``; bound under the module's own
name) or for a class or typing construct of `TWIN_MODULES` (``List``, ``deque``) is the judge's
own object of that name, as it is the same object under plain pytest: never a function, so the
program cannot make a test call a judge-side function of its choosing. ``isinstance`` and
``issubclass`` with a program class ask the candidate for the class of the instance and its MRO.
Test functions that are generators are left out as pytest 8 left them out (an expected failure
that never runs; KodCode's harness ran pytest 8.3), where pytest 9 fails the collection.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import marshal
import os
import pathlib
import sys
import types

PROTECTED = frozenset(dir(builtins))
# The names by which a test module steers pytest itself (plugins to load, how tests are generated):
# a program that defines them is aiming at the runner, so a star import never brings them.
RUNNER_NAMES = frozenset({"pytest_plugins", "pytest_generate_tests"})
# Module-level set-up and tear-down functions pytest calls (`_pytest.python`'s xunit fixtures).
XUNIT_NAMES = frozenset({"setup_module", "setUpModule", "teardown_module", "tearDownModule",
                         "setup_function", "teardown_function"})
# Standard-library modules whose classes and typing constructs stand in the judge for the program's
# names of them (pure data types: no function of theirs is ever looked up this way).
TWIN_MODULES = frozenset({"typing", "collections", "collections.abc", "decimal", "fractions", "datetime",
                          "enum", "abc", "numbers", "array"})
# Standard-library modules whose import has effects beyond defining names.
UNTWINNED = frozenset({"this", "antigravity", "__hello__", "__phello__", "idlelib", "turtle", "tkinter"})
# pytest's plugins that never change a verdict, left out: they cost more than a short task (the
# unraisable- and thread-exception plugins collect garbage at every session's end, half of it).
LEAN = [arg for name in ("cacheprovider", "faulthandler", "pastebin", "junitxml", "doctest", "stepwise",
                         "setuponly", "setupplan", "unraisableexception", "threadexception")
        for arg in ("-p", f"no:{name}")]
TASK_REASONS = ("bad_test", "no_tests")


class Remote:
    """The connection to the candidate: requests go out marshalled (the candidate reads only what
    the judge wrote), replies come back as JSON decoded strictly (the candidate wrote them)."""

    def __init__(self, z, call_fd: int, reply_fd: int):
        import threading

        self.z, self.call_fd, self.reply_fd = z, call_fd, reply_fd
        self.calls = 0
        self.handles: dict[int, object] = {}
        self.exc_classes: dict[str, type] = {}
        self.lock = threading.Lock()  # tests that call from threads: one request on the pipes at a time
        self.printed, self.output_limit = 0, 1 << 20

    def request(self, op: str, obj: int, **fields):
        with self.lock:
            return self._request(op, obj, **fields)

    def _request(self, op: str, obj: int, **fields):
        z = self.z
        self.calls += 1
        try:
            z._write_all(self.call_fd, marshal.dumps({"op": op, "obj": obj, **fields}))
        except BrokenPipeError:
            raise z.CandidateGone("candidate exited") from None
        try:
            reply = z.read_frame(self.reply_fd)
        except ValueError as e:
            raise z.CandidateGone(f"bad reply: {e}") from None
        if reply is None:
            raise z.CandidateGone("candidate exited before answering")
        if type(reply) is not dict:
            raise z.CandidateGone("bad reply")
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            if type(reply.get(key)) is str:
                self.printed += len(reply[key])
                if self.printed > self.output_limit:  # what it prints ends up in the judge's memory (capsys)
                    raise OutputLimit(f"the program printed over {self.output_limit} characters")
                stream.write(reply[key])
        if "ok" in reply:
            return reply
        if "exc" in reply:
            raise self.exception(reply)
        raise z.CandidateGone("bad reply")

    def value(self, op: str, obj: int, **fields):
        return self.decode(self.request(op, obj, **fields)["ok"])

    def call(self, obj: int, args: tuple, kwargs: dict):
        reply = self.request("call", obj, args=self.encode(list(args)), kwargs=self.encode(dict(kwargs)))
        result = self.decode(reply["ok"])
        if "after" in reply:
            new_args, new_kwargs = self.decode(reply["after"][0]), self.decode(reply["after"][1])
            for old, new in [*zip(args, new_args), *((kwargs[k], new_kwargs.get(k)) for k in kwargs)]:
                _write_back(old, new)
        return result

    def special(self, obj: int, name: str, *args, want: type | None = None):
        got = self.value("special", obj, name=name, args=self.encode(list(args)))
        if want is not None and type(got) is not want:
            raise TypeError(f"{name} of a program object returned {type(got).__name__}, not {want.__name__}")
        return got

    # ------------------------------------------------------------------ values
    def encode(self, x, depth: int = 0):
        """What the judge may send: data, the program's own handles, paths."""
        if depth > 100:
            raise ValueError("value nested deeper than 100")
        t = type(x)
        if t is RemoteObject and x._remote is self:
            return ["h", x._id]
        if isinstance(x, pathlib.PurePath):
            return ["p", str(x)]
        if t in (list, tuple, set, frozenset):
            tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
            return [tag, [self.encode(v, depth + 1) for v in x]]
        if t is dict:
            return ["d", [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in x.items()]]
        if t is bytearray:
            return self.z.encode(bytes(x))
        try:
            return self.z.encode(x)
        except TypeError:
            raise TypeError(f"cannot pass a {t.__name__} to the program (only data, its own objects "
                            "and paths cross)") from None

    def decode(self, v, depth: int = 0):
        """A reply value: strictly typed data, or a handle to an object left in the candidate."""
        if type(v) is list and v and v[0] == "h":
            return self.handle(v)
        if type(v) is list and len(v) == 2 and v[0] in ("l", "t", "S", "F") and type(v[1]) is list and depth < 100:
            items = [self.decode(x, depth + 1) for x in v[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[v[0]](items)
        if type(v) is list and len(v) == 2 and v[0] == "d" and type(v[1]) is list and depth < 100:
            return {self.decode(k, depth + 1): self.decode(w, depth + 1) for k, w in v[1]}
        try:
            return self.z.decode(v, depth)
        except ValueError as e:
            raise self.z.CandidateGone(f"bad reply: {e}") from None

    def handle(self, v: list):
        if len(v) != 5 or type(v[1]) is not int or not all(type(x) is str for x in v[2:]):
            raise self.z.CandidateGone("bad handle")
        _, hid, kind, name, base = v
        if kind == "exc":
            return self.exc_class(name, base, key=f"#{hid}")
        if hid not in self.handles:
            self.handles[hid] = RemoteObject(self, hid, kind, name)
        return self.handles[hid]

    def exc_class(self, name: str, base_name: str, key: str) -> type:
        """A local exception class standing for one of the program's (or a builtin's, by name)."""
        if key not in self.exc_classes:
            base = getattr(builtins, base_name, None)
            if not (isinstance(base, type) and issubclass(base, Exception)):
                base = Exception
            try:
                cls = type(name, (base, self.z.CandidateRaised), {"exc_name": name})
            except TypeError:  # a builtin whose layout cannot be mixed in
                cls = type(name, (self.z.CandidateRaised,), {"exc_name": name})
            self.exc_classes[key] = cls
        return self.exc_classes[key]

    def exception(self, reply: dict) -> BaseException:
        name, text = str(reply["exc"]), str(reply.get("msg", ""))
        if name in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
            return self.z.CandidateGone(f"candidate raised {name}")
        if "cls" in reply and type(reply["cls"]) is list:
            cls = self.decode(reply["cls"])
        else:
            cls = self.exc_class(name, name, key=name)
        if not (isinstance(cls, type) and issubclass(cls, self.z.CandidateRaised)):
            return self.z.CandidateGone("bad exception reply")
        try:
            return cls(text)
        except TypeError:  # e.g. UnicodeDecodeError wants five arguments
            return self.exc_class(name, "Exception", key=f"plain:{name}")(text)


class OutputLimit(BaseException):
    """The program printed more than the task's output limit (a BaseException, as `CandidateGone`,
    so that a test's ``except Exception`` cannot swallow it)."""


def _write_back(old, new) -> None:
    """Copy the candidate's in-place change of a list, dict or set argument into the judge's."""
    if type(old) is list and type(new) is list:
        old[:] = new
    elif type(old) is dict and type(new) is dict:
        old.clear()
        old.update(new)
    elif type(old) is set and type(new) is set:
        old.clear()
        old.update(new)
    elif type(old) is bytearray and type(new) is bytes:
        old[:] = new


class RemoteObject:
    """An object of the program, left in the candidate's process. Its ``__eq__`` is identity."""

    __slots__ = ("_remote", "_id", "_kind", "_name")

    def __init__(self, remote: Remote, hid: int, kind: str, name: str):
        for key, value in (("_remote", remote), ("_id", hid), ("_kind", kind), ("_name", name)):
            object.__setattr__(self, key, value)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):  # probes by pytest and inspect stay here
            raise AttributeError(name)
        return self._remote.value("get", self._id, name=name)

    def __setattr__(self, name: str, value) -> None:
        self._remote.request("set", self._id, name=name, value=self._remote.encode(value))

    def __call__(self, *args, **kwargs):
        return self._remote.call(self._id, args, kwargs)

    def __eq__(self, other) -> bool:
        return self is other

    def __ne__(self, other) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return hash((id(self._remote), self._id))

    def __len__(self) -> int:
        return self._remote.special(self._id, "__len__", want=int)

    def __bool__(self) -> bool:
        return self._remote.special(self._id, "__bool__", want=bool)

    def __str__(self) -> str:
        return self._remote.special(self._id, "__str__", want=str)

    def __repr__(self) -> str:
        return self._remote.special(self._id, "__repr__", want=str)

    def __contains__(self, item) -> bool:
        # Membership is decided here, over the items as data: a program's __contains__ that says
        # yes to everything would otherwise pass every `x in result` an always-equal object would.
        return any(x is item or x == item for x in self)

    def __getitem__(self, key):
        return self._remote.special(self._id, "__getitem__", key)

    def __setitem__(self, key, value) -> None:
        self._remote.special(self._id, "__setitem__", key, value)

    def __delitem__(self, key) -> None:
        self._remote.special(self._id, "__delitem__", key)

    def __next__(self):
        return self._remote.special(self._id, "__next__")

    def __instancecheck__(self, instance) -> bool:
        # Only the program's objects are instances of its classes (no judge value is one).
        if type(instance) is not RemoteObject or instance._remote is not self._remote:
            return False
        return self.__subclasscheck__(self._remote.value("get", instance._id, name="__class__"))

    def __subclasscheck__(self, cls) -> bool:
        if self._kind not in ("class", "exc"):
            raise TypeError(f"isinstance() arg 2 must be a type, not a program {self._name}")
        if type(cls) is not RemoteObject or cls._remote is not self._remote:
            return False
        mro = self._remote.value("get", cls._id, name="__mro__")
        return type(mro) is tuple and any(c is self for c in mro)

    def __iter__(self):
        it = self._remote.special(self._id, "__iter__")
        if type(it) is not RemoteObject:
            raise TypeError("iter() of a program object returned data, not an iterator")
        while True:
            try:
                item = it.__next__()
            except StopIteration:
                return
            yield item


class RemoteModule(types.ModuleType):
    """The program as the module the tests import; every name is looked up in the candidate."""

    def __init__(self, name: str, remote: Remote, hidden: frozenset):
        super().__init__(name)
        self.__dict__["_remote"], self.__dict__["_hidden"] = remote, hidden

    def __getattr__(self, name: str):
        if name == "__all__":  # `from solution import *`: never over a builtin or a name the tests bind
            return [n for n in self._star_names() if n not in PROTECTED and n not in self._hidden
                    and n not in RUNNER_NAMES]
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = self._remote.value("get", 0, name=name)
        if type(value) is not RemoteObject:
            return value
        if name in XUNIT_NAMES:
            return _xunit(value)
        return _twin(value, name)

    def _star_names(self) -> list[str]:
        """The names ``import *`` takes: the program's ``__all__``, else those not starting with ``_``."""
        try:
            names = self._remote.value("get", 0, name="__all__")
        except AttributeError:
            names = self._remote.value("names", 0)
        if type(names) not in (list, tuple):
            raise TypeError("the program's __all__ is not a list of names")
        return [n for n in names if type(n) is str]

    def __setattr__(self, name: str, value) -> None:
        self._remote.request("set", 0, name=name, value=self._remote.encode(value))


def _xunit(function: RemoteObject):
    """A program's ``setup_function`` (or another `XUNIT_NAMES` function) as pytest calls it: with
    the module or test function when it takes an argument (None stands for it: judge objects do
    not cross), else with none."""
    takes = function._remote.value("get", function._id, name="__code__").co_argcount
    if type(takes) is not int:
        raise TypeError(f"the program's {function._name} is not a function")

    def call(arg=None):
        return function(None) if takes else function()

    call.__name__ = call.__qualname__ = function._name
    return call


def _twin(value: RemoteObject, name: str):
    """The judge's own object for a program's name of a standard-library module or of a class or
    typing construct of `TWIN_MODULES`, as under plain pytest where both are one object; else
    ``value``. The name must be the object's own, and no function is ever looked up this way."""
    is_module = value._kind == "obj" and value._name == "module"
    try:
        module = value._remote.value("get", value._id, name="__name__" if is_module else "__module__")
    except AttributeError:  # the candidate's AttributeError is one too
        return value
    if type(module) is not str or module in UNTWINNED:
        return value
    if is_module and (module != name or name not in sys.stdlib_module_names):
        return value
    if not is_module and module not in TWIN_MODULES:
        return value
    try:
        found = importlib.import_module(module)
    except Exception:
        return value
    if is_module:
        return found
    twin = getattr(found, name, None)
    return twin if isinstance(twin, type) or type(twin).__module__ == "typing" else value


def warm() -> None:
    """Import pytest and its built-in plugins; the zygote calls it once, so every judge forked
    from it starts with them loaded and no task's time limit pays for the import."""
    import _pytest.config
    import pytest  # noqa: F401

    for name in _pytest.config.default_plugins:
        try:
            __import__(f"_pytest.{name}")
        except ImportError:
            pass
    scan_plugin_fixtures_once()


def scan_plugin_fixtures_once() -> None:
    """Make each session's fixture manager take a plugin's fixtures from definitions parsed once.

    A fresh session parses every registered plugin for fixtures, walking all of each module's
    names and unwrapping each one (pytest 9 looks for fixtures hidden behind decorators, to warn),
    and builds a definition per fixture (reading its signature): most of a one-test session's
    setup. The plugins are the same objects every session, so each one's definitions are parsed
    once per configuration and every later session gets fresh copies (no cached value, no
    finalizer: what one session computed never reaches the next), registered where pytest would
    register them. A plugin object whose class holds no fixture is skipped; every
    ``conftest.py`` is parsed as pytest parses it."""
    from _pytest import fixtures

    original = fixtures.FixtureManager.pytest_plugin_registered
    if getattr(original, "scans_once", False):
        return
    parsed: dict[int, tuple[object, list]] = {}  # id(plugin) -> (plugin, its fixture definitions)
    owner: list = [None]  # the configuration the definitions were parsed under
    plain: dict[type, bool] = {}
    is_fixture = fixtures.FixtureFunctionDefinition

    def pytest_plugin_registered(self, plugin, plugin_name):
        if plugin_name and plugin_name.endswith("conftest.py"):
            return original(self, plugin, plugin_name)
        cls = type(plugin)
        if cls is not types.ModuleType:
            if cls not in plain:
                plain[cls] = not any(type(getattr(v, "__func__", v)) is is_fixture for k in cls.__mro__
                                     for v in list(vars(k).values()))
            if plain[cls]:
                return None
        if owner[0] is not self.config:  # a scope may depend on the configuration
            parsed.clear()
            owner[0] = self.config
        kept = parsed.get(id(plugin))
        if kept is None or kept[0] is not plugin:
            kept = parsed[id(plugin)] = (plugin, _parse_plugin(self, plugin, plugin_name, original))
            return None
        for template in kept[1]:
            _add_fixture(self, template)
        return None

    pytest_plugin_registered.scans_once = True
    fixtures.FixtureManager.pytest_plugin_registered = pytest_plugin_registered
    check_wrapped = fixtures.FixtureManager._check_for_wrapped_fixture

    def _check_for_wrapped_fixture(self, name, obj):
        # Only warns about a fixture behind a decorator; the program's objects are never a fixture
        # (no judge-side object crosses), and the check would ask the candidate for `_mock_name`.
        if type(obj) is not RemoteObject:
            check_wrapped(self, name, obj)

    fixtures.FixtureManager._check_for_wrapped_fixture = _check_for_wrapped_fixture


def _parse_plugin(manager, plugin, plugin_name: str, original) -> list:
    """Register ``plugin``'s fixtures as pytest does; return blank copies of their definitions."""
    import copy

    before = {id(d) for d in manager._get_all_fixture_defs()}
    original(manager, plugin, plugin_name)
    found = [copy.copy(d) for d in manager._get_all_fixture_defs() if id(d) not in before]
    for template in found:
        template.node, template.cached_result, template._finalizers = None, None, []
    return found


def _add_fixture(manager, template) -> None:
    """A fresh copy of a plugin's fixture definition, registered as `_register_fixture` does for
    a plugin (visible from the session down)."""
    import copy

    fixturedef, session = copy.copy(template), manager.session
    fixturedef.node, fixturedef.cached_result, fixturedef._finalizers = session, None, []
    manager._arg2node2fixturedefs.setdefault(fixturedef.argname, {}).setdefault(session, []).insert(0, fixturedef)
    if fixturedef._autouse:
        manager._node_autousenames.setdefault(session, []).append(fixturedef.argname)


@functools.lru_cache(maxsize=256)  # a task's tests come back once per sample, and are read twice
def imported_names(tests: str) -> tuple[frozenset[str], frozenset[str]]:
    """(top-level modules the tests import, every name the test module binds at its top level:
    imports, assignments, functions, classes). Raises SyntaxError, or ValueError for a NUL byte
    (the sandbox's Python 3.11 says so with a ValueError)."""
    modules, bound = set(), set()
    tree = ast.parse(tests)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    for statement in tree.body:
        bound |= _bindings(statement)
    return frozenset(modules), frozenset(bound)


def _bindings(node) -> set[str]:
    """Names a module-level statement binds (not those bound inside the functions it defines)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names if a.name != "*"}
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return {node.id}
    if isinstance(node, ast.Lambda):
        return set()
    return set().union(*(_bindings(child) for child in ast.iter_child_nodes(node)))


def task_problem(tests: str, module: str) -> str:
    """Why the tests cannot run here whatever the program does ('' when they can): a syntax
    error, or a module they import that this sandbox does not have."""
    import importlib.util

    try:
        modules, _ = imported_names(tests)
    except (SyntaxError, ValueError) as e:
        return f"the tests do not parse: {e}"
    for name in sorted(modules - {module}):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            return f"the tests import {name!r}, which the sandbox does not have"
    return ""


def _loaded(z, reply_fd: int) -> dict | None:
    """The verdict when the program did not load (None when it did)."""
    try:
        first = z.read_frame(reply_fd)
    except ValueError:
        first = None
    if first is None:
        return z._verdict("MODEL_FAIL", "no_verdict", "program exited while loading")
    if type(first) is dict and "exc" in first:
        name = str(first["exc"])
        reason = {"MemoryError": "memory", "SystemExit": "no_verdict"}.get(name, "runtime_error")
        return z._verdict("MODEL_FAIL", reason, f"loading the program raised {name}: {first.get('msg')}")
    return None


class PytestRun:
    """What one pytest session said: its exit code, each test's outcome (``passed``, ``failed``,
    ``skipped``; a failure in setup or teardown counts), and each failure's reason and text."""

    def __init__(self):
        self.exit_code = -1
        self.outcomes: dict[str, str] = {}
        self.failures: list[tuple[str, str]] = []  # (reason, text), in the order they happened

    @property
    def passed(self) -> int:
        return sum(v == "passed" for v in self.outcomes.values())


def _hookimpl(**options) -> dict:
    """pytest's hook options for a method (what ``pytest.hookimpl`` sets, without importing pytest)."""
    return {"wrapper": False, "hookwrapper": False, "optionalhook": False, "tryfirst": False,
            "trylast": False, "specname": None, **options}


class Recorder:
    """A pytest plugin filling the current task's `PytestRun`. ``classify(excinfo)`` names a
    failure's reason; ``open_dir``: a folder opened to every uid before each test (``tmp_path``
    for the program). Registered once per configuration (registering a plugin is not free): each
    task sets its state with `start` and clears it with `stop`, so no task reads another's."""

    def __init__(self):
        self.stop()

    def start(self, run: PytestRun, classify, open_dir: str | None) -> None:
        self.run, self.classify, self.open_dir = run, classify, open_dir

    def stop(self) -> None:
        self.run, self.classify, self.open_dir = PytestRun(), None, None

    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        run = self.run
        if report.failed:
            run.outcomes[report.nodeid] = "failed"
            reason = self.classify(call.excinfo) if call.excinfo is not None else "wrong_answer"
            run.failures.append((reason, f"{report.nodeid} ({report.when}): {report.longreprtext[-300:]}"))
        elif report.when == "call" or (report.skipped and report.nodeid not in run.outcomes):
            run.outcomes.setdefault(report.nodeid, report.outcome)

    pytest_runtest_makereport.pytest_impl = _hookimpl(hookwrapper=True)

    def pytest_collectreport(self, report):
        if report.failed:
            self.run.failures.append(("collect", f"collecting: {report.longreprtext[-300:]}"))

    def pytest_runtest_call(self, item):
        if self.open_dir:  # pytest makes tmp_path 0700 for its own uid
            open_folders(self.open_dir)

    pytest_runtest_call.pytest_impl = _hookimpl(tryfirst=True)


def open_folders(top: str) -> None:
    """Make ``top`` and every real folder below it 0777, never following a link.

    The program writes in these folders and may plant links there, and the judge's uid owns
    ``/judge``: a chmod through a link would open the hidden tests to it. Each folder is opened
    relative to its parent's descriptor with ``O_NOFOLLOW``, so a link swapped in mid-walk is
    refused too (ELOOP, ENOTDIR), not followed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(top, flags)
    except OSError:
        return
    _open_below(fd, flags)


def _open_below(fd: int, flags: int) -> None:
    try:
        os.fchmod(fd, 0o777)
        names = os.listdir(fd)
    except OSError:
        names = []
    try:
        for name in names:
            try:
                child = os.open(name, flags, dir_fd=fd)
            except OSError:  # a link, a file, or gone
                continue
            _open_below(child, flags)
    finally:
        os.close(fd)


def pytest_args(paths: list[str], *, rootdir: str, ini: str, basetemp: str, conftest: bool = False,
                stop_first: bool = True, lean: bool = True, import_mode: str = "importlib") -> list[str]:
    """pytest's command line for a verdict: no output capture (the judge's output goes nowhere),
    the verdict-neutral plugins off (`LEAN`; ``lean=False`` keeps them, for a project whose own
    ini names their options), imports that leave ``sys.path`` alone (``import_mode``), the given
    ini file and root (no discovery: nothing found on disk configures the run), no
    ``conftest.py`` unless the caller trusts the tree, ``-x`` unless every test's outcome counts."""
    args = ["-q", "-s", *LEAN * lean, f"--import-mode={import_mode}", "-c", ini, "--rootdir", rootdir,
            "--basetemp", basetemp]
    return args + ["--noconftest"] * (not conftest) + ["-x"] * stop_first + list(paths)


class GeneratorTests:
    """A pytest plugin: a test function that is a generator is an expected failure that never runs,
    as pytest 8 had it (KodCode's harness ran pytest 8.3, and its tests import e.g. ``heapq.merge``
    as ``test_merge``); pytest 9 fails the whole collection."""

    def __init__(self, pytest):
        self.pytest = pytest

    def pytest_pycollect_makeitem(self, collector, name, obj):
        if not (inspect.isgeneratorfunction(obj) and collector.istestfunction(obj, name)):
            return None
        item = self.pytest.Function.from_parent(collector, name=name)
        item.add_marker(self.pytest.mark.xfail(run=False, reason=f"{name} is a generator, not a test"))
        return item

    pytest_pycollect_makeitem.pytest_impl = _hookimpl(tryfirst=True)


def run_pytest(args: list[str], classify, open_dir: str | None = None, plugins: tuple = ()) -> PytestRun:
    """Run one pytest session in this process (``plugins``: more plugin objects); the modules it
    imported from the run's files are dropped afterwards, so the next session imports its own."""
    import pytest

    run, before = PytestRun(), set(sys.modules)
    umask = os.umask(0)  # files the tests write stay writable by the program's uid
    try:
        recorder = Recorder()
        recorder.start(run, classify, open_dir)
        run.exit_code = int(pytest.main(args, plugins=[recorder, *plugins]))
    finally:
        os.umask(umask)
        for name in set(sys.modules) - before:
            if not name.startswith(("_pytest", "pytest", "pluggy")) and _from_a_file_of(sys.modules[name], args):
                del sys.modules[name]
    return run


def _from_a_file_of(module, args: list[str]) -> bool:
    path = str(getattr(module, "__file__", None) or "")
    return bool(path) and any(path.startswith(os.path.dirname(a) + os.sep) for a in args if a.endswith(".py"))


def _classify(z):
    def classify(excinfo) -> str:
        if issubclass(excinfo.type, z.CandidateGone):
            return "no_verdict"
        if issubclass(excinfo.type, OutputLimit):
            return "output_limit"
        if issubclass(excinfo.type, z.CandidateRaised):
            return "memory" if excinfo.type.exc_name == "MemoryError" else "runtime_error"
        if excinfo.type.__name__ == "FixtureLookupError":  # a fixture from a plugin we lack
            return "bad_test"
        return "wrong_answer"

    return classify


def verdict(z, run: PytestRun, calls: int) -> dict:
    """The outcome of a task from its pytest session. A collection failure is the program's:
    the tests' own imports were checked before pytest ran (`task_problem`)."""
    if run.failures:
        task = [f for f in run.failures if f[0] in TASK_REASONS]
        reason, text = task[0] if task else run.failures[0]
        reason = "runtime_error" if reason == "collect" else reason
        return z._verdict("TASK_FAIL" if task else "MODEL_FAIL", reason, text)
    if run.exit_code == 5 or not run.passed:
        return z._verdict("TASK_FAIL", "no_tests", "the tests define no test that runs")
    if run.exit_code != 0:
        return z._verdict("MODEL_FAIL", "no_verdict", f"pytest ended with exit code {run.exit_code}")
    return z._verdict("PASS", "", f"{run.passed} tests, {calls} calls")


class Sessions:
    """One pytest configuration for every pytest-style task of this judge process, a fresh session
    per task. Configuring pytest (its options, registering its plugins) was most of a one-test
    task's cost; the configuration depends only on the fixed paths below, so it is made once.

    What a session leaves behind is checked after each task: a test that registered a plugin or
    changed an option drops the configuration (the next task makes a new one). Asserts run plain
    (``--assert=plain``: no import hook stays in ``sys.meta_path`` between tasks; an assert fails
    the same either way, only the message is shorter), the log plugin's ``/dev/null`` file is
    closed (no descriptor stays open between tasks: the judge checks both), and there is no
    terminal reporter (``-p no:terminal``: its output went nowhere, and it kept each session's
    state); the outcomes come from the recorder, as before."""

    def __init__(self, folder: str):
        self.folder, self.config, self.plugins, self.options = folder, None, None, None
        self.recorder = Recorder()
        self.tests, self.ini = os.path.join(folder, "test_task.py"), os.path.join(folder, "pytest.ini")

    def configure(self, pytest) -> None:
        from _pytest.config import _prepareconfig

        args = pytest_args([self.tests], rootdir=self.folder, ini=self.ini, basetemp=os.path.join(self.folder, "t"))
        args = [a for a in args if a != "-q"] + ["--assert=plain", "-p", "no:terminal"]
        self.recorder = Recorder()
        config = _prepareconfig(args, plugins=[GeneratorTests(pytest), self.recorder])
        config._do_configure()
        logging_plugin = config.pluginmanager.get_plugin("logging-plugin")
        if logging_plugin is not None:
            logging_plugin.log_file_handler.close()
        self.config, self.plugins = config, set(config.pluginmanager.get_plugins())
        self.options = dict(vars(config.option))
        self.history = len(config.hook.pytest_plugin_registered._call_history)

    def run(self, pytest, classify, basetemp: str, open_dir: str) -> PytestRun:
        """One session over the test module now at ``self.tests``."""
        from _pytest.main import Failed, Session, _main

        if self.config is None:
            self.configure(pytest)
        config, run, before = self.config, PytestRun(), set(sys.modules)
        factory = config._tmp_path_factory
        factory._given_basetemp, factory._basetemp = pathlib.Path(basetemp), None
        self.recorder.start(run, classify, open_dir)
        session = Session.from_config(config)
        session.exitstatus = pytest.ExitCode.OK
        umask, version = os.umask(0), os.environ.get("PYTEST_VERSION")
        os.environ["PYTEST_VERSION"] = pytest.__version__  # as pytest.main sets it
        started = False
        try:
            config.hook.pytest_sessionstart(session=session)
            started = True
            session.exitstatus = _main(config, session) or pytest.ExitCode.OK
        except Failed:  # -x: the first failure stops the session, as under pytest.main
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        except (KeyboardInterrupt, pytest.exit.Exception):  # -x after a collection error, pytest.exit()
            session.exitstatus = getattr(sys.exc_info()[1], "returncode", None) or pytest.ExitCode.INTERRUPTED
            config.hook.pytest_keyboard_interrupt(excinfo=pytest.ExceptionInfo.from_current())
        finally:
            try:
                if started:
                    config.hook.pytest_sessionfinish(session=session, exitstatus=session.exitstatus)
            finally:
                self._end(session, before, umask, version)
        run.exit_code = int(session.exitstatus)
        return run

    def _end(self, session, before: set, umask: int, version: str | None) -> None:
        self.recorder.stop()
        os.umask(umask)
        if version is None:
            os.environ.pop("PYTEST_VERSION", None)
        else:
            os.environ["PYTEST_VERSION"] = version
        manager = self.config.pluginmanager
        for plugin in (session._fixturemanager if hasattr(session, "_fixturemanager") else None, session):
            if plugin is not None and manager.is_registered(plugin):
                manager.unregister(plugin)
        for name in set(sys.modules) - before:
            if not name.startswith(("_pytest", "pytest", "pluggy")):
                del sys.modules[name]
        # Each registration is kept to be replayed to every later plugin (a historic hook): the
        # session's own, unregistered above, go, or every next session would parse them again.
        del self.config.hook.pytest_plugin_registered._call_history[self.history:]
        capture = manager.get_plugin("capturemanager")
        if capture is not None and capture._global_capturing is None:  # an interrupted session stops it
            capture.start_global_capturing()
            capture.suspend_global_capture()
        if set(manager.get_plugins()) != self.plugins or dict(vars(self.config.option)) != self.options:
            self.config._ensure_unconfigure()
            self.config = None


_SESSIONS: list[Sessions] = []  # this process's, made at its first pytest-style task


def run(msg: dict, call_fd: int, reply_fd: int, z) -> dict:
    """Run ``msg["tests"]`` (a pytest module) against the candidate; return the verdict."""
    import shutil
    import tempfile

    module, tests = msg["module"], msg["tests"]
    problem = task_problem(tests, module)
    if problem:
        return z._verdict("TASK_FAIL", "bad_test", problem)
    failed = _loaded(z, reply_fd)
    if failed:
        return failed
    remote = Remote(z, call_fd, reply_fd)
    remote.output_limit = int(msg.get("output_limit") or remote.output_limit)
    base = z.JUDGE_DIR if os.path.isdir(z.JUDGE_DIR) else tempfile.gettempdir()
    if not _SESSIONS:
        _SESSIONS.append(Sessions(tempfile.mkdtemp(dir=base)))
    sessions = _SESSIONS[0]
    task = sessions.folder
    shutil.rmtree(task, ignore_errors=True)  # /judge may also have been mounted afresh since
    os.makedirs(task, 0o700, exist_ok=True)
    try:
        shared = tempfile.mkdtemp(prefix="pytest-", dir="/tmp")
        os.chmod(shared, 0o711)  # the program may enter tmp_path below, not list or plant here
    except OSError:  # the program filled /tmp: tests that hand it files there fail, as they should
        shared = task
    for name, text in (("pytest.ini", "[pytest]\n"), ("test_task.py", tests)):
        with open(os.path.join(task, name), "w") as f:
            f.write(text)
    cwd = os.path.join(task, "cwd")  # KodCode's tests write files by relative names
    os.mkdir(cwd, 0o700)
    basetemp = os.path.join(shared, "t")
    sys.modules[module] = RemoteModule(module, remote, imported_names(tests)[1])
    import pytest

    home = os.getcwd()
    try:
        os.chdir(cwd)
        result = sessions.run(pytest, _classify(z), basetemp, open_dir=basetemp)
    except (Exception, z.CandidateGone, OutputLimit) as e:  # pytest keeps its own errors; what escapes came with the program's data
        return z._verdict("MODEL_FAIL", "no_verdict", f"the test session broke: {type(e).__name__}: {e}")
    finally:
        os.chdir(home)
        sys.modules.pop(module, None)
        shutil.rmtree(task, ignore_errors=True)
    return verdict(z, result, remote.calls)
