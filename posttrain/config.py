"""Typed configuration: YAML overlays onto component-owned dataclasses, plus dotted overrides.

Each component owns a ``@dataclass(kw_only=True)`` with a docstring line under every field and its
checks in ``__post_init__``. A recipe's config nests them. ``load_config(Cls, "run.yaml",
["optim.lr=3e-4"])`` starts from the dataclass defaults, overlays the YAML file, then the
command-line overrides, coercing every value to the field's declared type.

Everything the user can get wrong is a `UserError` whose one-line message names where the value
came from (the YAML file, or "command line") and the dotted key: unknown keys (with a suggestion),
wrong types, values rejected by ``__post_init__``, missing required keys, malformed YAML (with the
line). Nothing is silently ignored.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from posttrain.errors import UserError

CLI = "command line"


def load_config(cls: type, path: str | Path | None, overrides: typing.Sequence[str] = ()):
    """Build ``cls`` from its defaults, the YAML file at ``path`` (optional) and ``key=value`` overrides."""
    data: dict = {}
    origins: dict[str, str] = {}
    if path is not None:
        data = read_yaml_mapping(path)
        for key in _dotted_keys(data):
            origins[key] = str(path)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{CLI}: override {item!r} is not of the form key=value")
        key = key.strip()
        _set_dotted(data, key, _parse_scalar(raw), CLI)
        origins[key] = CLI
    return from_dict(cls, data, origins=origins, default_origin=str(path) if path else CLI)


def read_yaml_mapping(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: config file not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}: malformed YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def from_dict(cls: type, data: Any, *, prefix: str = "", origins: dict[str, str] | None = None,
              default_origin: str = CLI):
    """Construct dataclass ``cls`` from a nested mapping, coercing and validating every key."""
    origins = origins or {}

    def origin(key: str) -> str:
        # The most specific recorded origin of this key or one of its parents/children.
        for k in (key, *[k for k in origins if k.startswith(key + ".")]):
            if k in origins:
                return origins[k]
        return default_origin

    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise UserError(f"{origin(where)}: {where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise UserError(f"{origin(dotted)}: unknown key {dotted!r}{_suggest(key, fields, prefix)}")
        if isinstance(value, dict):
            value = _deep_merge(_factory_default(fields[key]), value)
        kwargs[key] = _coerce(value, hints[key], dotted, origin, origins, default_origin)
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise UserError(f"{default_origin}: missing required key {prefix}{missing[0]!r}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        bad = getattr(e, "key", None)
        key = f"{prefix}{bad}" if bad else where
        raise UserError(f"{origin(key)}: {key}: {e}") from None


def _factory_default(f: dataclasses.Field) -> dict:
    """A nested section's own default values (e.g. ``DistillConfig.rollout`` defaults to
    ``RolloutConfig(group_size=4)``), so setting one key of it keeps the others' defaults rather
    than falling back to the section class's plain defaults."""
    if f.default_factory is dataclasses.MISSING:
        return {}
    value = f.default_factory()
    return to_dict(value) if dataclasses.is_dataclass(value) else {}


def _deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class ConfigValueError(ValueError):
    """Raised by ``__post_init__`` checks to name the offending field: ``ConfigValueError("lr", "must be > 0")``."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _coerce(value, tp, dotted, origin, origins, default_origin):
    def bad(expected: str):
        return UserError(f"{origin(dotted)}: {dotted}: expected {expected}, got {value!r}")

    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=dotted + ".", origins=origins, default_origin=default_origin)
    o = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if o in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in [a for a in args if a is not type(None)]:
            try:
                return _coerce(value, arg, dotted, origin, origins, default_origin)
            except UserError as e:
                errors.append(e)
        raise bad(" or ".join(_type_name(a) for a in args))
    if o is Literal:
        if value in args:
            return value
        raise bad("one of " + ", ".join(repr(a) for a in args))
    if o in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad(f"a list of {_type_name(args[0]) if args else 'values'}")
        items = [_coerce(v, args[0], f"{dotted}[{i}]", origin, origins, default_origin) if args else v
                 for i, v in enumerate(value)]
        return items if o is list else tuple(items)
    if o is dict:
        if not isinstance(value, dict):
            raise bad("a mapping")
        return {k: _coerce(v, args[1], f"{dotted}.{k}", origin, origins, default_origin) if args else v
                for k, v in value.items()}
    return _coerce_scalar(value, tp, bad)


def _coerce_scalar(value, tp, bad):
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise bad("an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise bad("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad("a string")
    if value is None and tp is type(None):
        return None
    raise bad(_type_name(tp))


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _suggest(key: str, fields: dict, prefix: str) -> str:
    close = difflib.get_close_matches(key, list(fields), n=1)
    hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
    return f"{hint}; known keys under {prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"


def _parse_scalar(raw: str):
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _set_dotted(data: dict, key: str, value, where: str) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"{where}: {key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _dotted_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in data.items():
        keys.append(prefix + str(k))
        if isinstance(v, dict):
            keys.extend(_dotted_keys(v, f"{prefix}{k}."))
    return keys


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with `load_config`)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True))


def field_docs(cls: type) -> dict[str, str]:
    """The docstring literal under each field of a dataclass (read from its source), base classes
    first so a subclass that redeclares a field also replaces its docstring."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe_config(cls: type, prefix: str = "", defaults=None) -> str:
    """One line per dotted key: type, default and docstring; used by every command's --help.

    Defaults are read from a default instance where one can be built, so a section whose parent
    overrides it (RL's optimizer defaults differ from SFT's) shows the value that really applies."""
    if defaults is None:
        try:
            defaults = cls()
        except Exception:  # a config with required fields: fall back to the field declarations
            defaults = None
    lines = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if defaults is not None:
            default = getattr(defaults, f.name)
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        if dataclasses.is_dataclass(tp):
            lines.append(describe_config(tp, f"{prefix}{f.name}.", default if dataclasses.is_dataclass(default) else None))
            continue
        item = (typing.get_args(tp) or [None])[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(item):  # a list of sections: the list, then each entry's keys
            lines.append(f"  {prefix}{f.name} (list of {item.__name__} mappings, default {_entries(default)})\n"
                         f"      {docs.get(f.name, '')} Each entry's keys:")
            lines.append(describe_config(item, f"{prefix}{f.name}[].", None))
            continue
        tname = str(tp).replace("typing.", "") if typing.get_origin(tp) else _type_name(tp)
        lines.append(f"  {prefix}{f.name} ({tname}, default {default!r})\n      {docs.get(f.name, '')}")
    return "\n".join(lines)


def _entries(default) -> str:
    """A list of sections' default, each entry as the keys it sets away from its class's defaults."""
    if not isinstance(default, list):
        return repr(default)
    out = []
    for entry in default:
        try:
            plain = type(entry)()
        except Exception:  # an entry class with required keys: show every key
            plain = None
        out.append({k: v for k, v in to_dict(entry).items()
                    if plain is None or v != to_dict(plain)[k]})
    return repr(out)


def add_recipe_arguments(parser, cls: type, example: str) -> None:
    """The shared `posttrain <command> CONFIG.yaml [key=value ...]` arguments, with every key in --help."""
    parser.add_argument("config", nargs="?", help="YAML recipe (optional: defaults + overrides also work)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides applied after the YAML, e.g. optim.lr=3e-4")
    parser.epilog = f"example:\n  {example}\n\nconfig keys:\n{describe_config(cls)}"


def load_recipe(cls: type, args):
    """Config from parsed recipe arguments; a first positional that is `key=value` is an override."""
    path, overrides = args.config, list(args.overrides)
    if path is not None and "=" in path and not Path(path).exists():
        path, overrides = None, [path, *overrides]
    return load_config(cls, path, overrides)
