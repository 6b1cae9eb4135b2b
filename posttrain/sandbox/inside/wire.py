"""The wire: length-prefixed frames and the typed value codec, for every channel in the sandbox.

Standard library only (the sandbox's interpreter has no site-packages); the host imports it too.

Who writes what, and who parses it:

- host <-> zygote: JSON frames (`write_frame`, `read_frame`) on the sandbox's stdin/stdout.
- zygote -> candidate (the program and its limits) and judge -> candidate (each call's
  arguments): ``marshal``. The candidate trusts what its judge and zygote write; marshal is
  never parsed on a trusted side.
- candidate -> judge (return values, exceptions): JSON frames whose values are tagged
  (`encode`) and rebuilt with `decode`, which only ever makes exact builtin types and never
  runs code the candidate defined. This is the one channel that carries untrusted data to a
  side that decides a verdict.
"""

from __future__ import annotations

import json
import os
import struct
import sys

MAX_FRAME = 64 << 20


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps with options builds one per call


def write_frame(fd: int, obj) -> None:
    """Send one length-prefixed JSON message."""
    _write_all(fd, _ENCODER.encode(obj).encode())


def _write_all(fd: int, body: bytes) -> None:
    data = memoryview(struct.pack(">I", len(body)) + body)  # slices of a view copy nothing
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame(fd: int):
    """Read one message; None on a clean end of stream. Raises ValueError on garbage."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
    body = _read_exact(fd, n)
    if body is None:
        raise ValueError("stream ended inside a frame")
    return json.loads(body)


# Values as JSON. Strings, floats, booleans, None and ints below `_INT_LIMIT` are JSON's own
# scalars (json writes a float's repr, which reads back bit for bit, NaN and -0.0 included);
# everything else is a list whose first item is a tag:
#   ["i", hex]  a larger int (json's decimal ints stop at 4300 digits)   ["y", hex]  bytes
#   ["c", hex, hex]  complex          [k, items]  list "l", tuple "t", set "S", frozenset "F"
#   ["A", k, "d"|"q", base64]  a list, tuple, set or frozenset of floats (or of 64-bit ints)
#   packed as C doubles (longs) on this machine: a large value crosses as one string, not an
#   object per item; ["A", k, "m", base64, positions]: ints and floats mixed, packed as doubles,
#   the ints (each exact as a double) at the ascending positions listed
#   ["d", pairs]  dict   ["C", pairs]  Counter   ["O", pairs]  OrderedDict
#   ["D", factory, pairs]  defaultdict (factory a builtin type's name, or "" for none)
#   ["T", typename, fields, items]  a namedtuple, rebuilt on the reading side from its names
# The older one-tag-per-scalar forms (["N"], ["b", x], ["f", hex], ["s", x]) are still read.
_INT_LIMIT = 1 << 1000
_SCALARS = frozenset({str, float, bool, int, type(None)})
_KINDS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_MAKE = {"l": list, "t": tuple, "S": set, "F": frozenset}
_PACK_MIN = 16  # shorter lists are cheaper item by item
_PACKS = {float: "d", int: "q"}
_NUMBERS = frozenset({int, float})
_EXACT = 1 << 53
_FACTORIES = ("int", "float", "str", "bool", "list", "tuple", "set", "frozenset", "dict", "bytes", "complex")
_BUILTINS = sys.modules["builtins"]
_MAPPINGS: dict = {}  # tag -> class, filled on first use (collections is imported lazily)
_TUPLES: dict = {}  # (typename, fields) -> a namedtuple class made on this side


def _collections():
    if not _MAPPINGS:
        import collections

        _MAPPINGS.update({"C": collections.Counter, "O": collections.OrderedDict, "D": collections.defaultdict})
    return _MAPPINGS


def encode(x, depth: int = 0):
    """A value made only of exact builtin types (and `collections`' Counter, OrderedDict,
    defaultdict and namedtuples) as JSON-ready data; anything else, subclasses too, is refused
    (TypeError). Never calls a method the value's own class defines."""
    if depth > 100:
        raise ValueError("value nested deeper than 100")
    t = type(x)
    if t is str or t is float or t is bool or x is None:
        return x
    if t is int:
        return x if -_INT_LIMIT < x < _INT_LIMIT else ["i", int.__format__(x, "x")]
    kind = _KINDS.get(t)
    if kind is not None:
        return _encode_items(kind, x if t is list or t is tuple else list(t.__iter__(x)), depth)
    if t is dict:
        return ["d", _encode_pairs(x, depth)]
    if t is complex:
        return ["c", float.hex(x.real), float.hex(x.imag)]
    if t is bytes:
        return ["y", bytes.hex(x)]
    return _encode_other(x, t, depth)


def _encode_items(kind: str, items, depth: int) -> list:
    types = set(map(type, items))
    if len(items) >= _PACK_MIN and types <= _NUMBERS:
        packed = _pack_numbers(kind, items, types)
        if packed is not None:
            return packed
    if types <= _SCALARS and (int not in types or _small_ints(items)):
        return [kind, list(items)]
    return [kind, [encode(v, depth + 1) for v in items]]


def _pack_numbers(kind: str, items, types: set) -> list | None:
    """A long run of ints and floats as one packed string (see the table above); None where an
    int does not fit."""
    if types == {float} or types == {int}:
        code = "d" if float in types else "q"
        packed = _pack(items, code)
        return None if packed is None else ["A", kind, code, packed]
    kinds = list(map(type, items))
    ints, i = [], -1
    for _ in range(kinds.count(int)):  # list.index scans in C: fast where ints are few
        i = kinds.index(int, i + 1)
        if not -_EXACT < items[i] < _EXACT:
            return None
        ints.append(i)
    return ["A", kind, "m", _pack(items, "d"), ints]


def _small_ints(items) -> bool:
    ints = [v for v in items if type(v) is int]
    return -_INT_LIMIT < min(ints) and max(ints) < _INT_LIMIT


def _pack(items, code: str) -> str | None:
    import base64
    from array import array

    try:
        return base64.b64encode(array(code, items).tobytes()).decode("ascii")
    except OverflowError:  # an int beyond 64 bits
        return None


def _encode_pairs(x, depth: int) -> list:
    keys, values = set(map(type, dict.keys(x))), set(map(type, dict.values(x)))
    if keys <= _SCALARS and values <= _SCALARS and (int not in keys | values or _small_ints(
            [*dict.keys(x), *dict.values(x)])):
        return list(map(list, dict.items(x)))
    return [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(x)]


def _decode_pairs(pairs: list, depth: int) -> list:
    """The (key, value) pairs of a mapping, for its constructor."""
    try:  # keys that are tagged values (lists) are unhashable: not plain
        plain = dict(pairs) if set(map(type, pairs)) <= {list} else None
    except TypeError:
        plain = None
    if plain is not None and len(plain) == len(pairs) and set(map(type, plain.values())) <= _SCALARS:
        return pairs
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        raise ValueError("a mapping's items must be pairs")
    return [(decode(k, depth + 1), decode(w, depth + 1)) for k, w in pairs]


def _encode_other(x, t, depth: int) -> list:
    maps = _collections()
    if t is maps["C"]:
        return ["C", _encode_pairs(x, depth)]
    if t is maps["O"]:
        return ["O", _encode_pairs(x, depth)]
    if t is maps["D"]:
        factory = next((n for n in _FACTORIES if x.default_factory is getattr(_BUILTINS, n)), "")
        return ["D", factory, _encode_pairs(x, depth)]
    fields = t.__dict__.get("_fields") if t.__bases__ == (tuple,) else None
    if type(fields) is tuple and all(type(f) is str for f in fields) and type(t.__name__) is str:
        return ["T", t.__name__, list(fields), [encode(v, depth + 1) for v in tuple.__iter__(x)]]
    raise TypeError(f"cannot send a value of type {t.__name__!r}")


def decode(v, depth: int = 0):
    """Rebuild a value `encode` made; only the types it names come out, built here, never a
    class the other side defined. Raises ValueError on anything odd."""
    t = type(v)
    if t is str or t is float or t is bool or t is int or v is None:
        return v
    if depth > 100 or t is not list or not v or type(v[0]) is not str:
        raise ValueError("malformed tagged value")
    tag, rest = v[0], v[1:]
    try:
        if tag in _MAKE and len(rest) == 1 and type(rest[0]) is list:
            items = rest[0]
            if not set(map(type, items)) <= _SCALARS:
                items = [decode(x, depth + 1) for x in items]
            return _MAKE[tag](items)
        if tag == "A" and rest[0] in _MAKE and rest[1] in ("d", "q") and type(rest[2]) is str and len(rest) == 3:
            return _MAKE[rest[0]](_unpack(rest[1], rest[2]))
        if tag == "A" and rest[0] in _MAKE and rest[1] == "m" and type(rest[2]) is str and type(rest[3]) is list:
            return _MAKE[rest[0]](_unpack_mixed(rest[2], rest[3]))
        if tag == "d" and type(rest[0]) is list:
            return dict(_decode_pairs(rest[0], depth))
        if tag == "C" and type(rest[0]) is list:
            out = _collections()["C"]()
            dict.update(out, _decode_pairs(rest[0], depth))  # Counter's own update would count
            return out
        if tag == "O" and type(rest[0]) is list:
            return _collections()["O"](_decode_pairs(rest[0], depth))
        if tag == "D" and rest[0] in _FACTORIES + ("",) and type(rest[1]) is list:
            factory = getattr(_BUILTINS, rest[0]) if rest[0] else None
            return _collections()["D"](factory, _decode_pairs(rest[1], depth))
        if tag == "T" and type(rest[0]) is str and type(rest[1]) is list and type(rest[2]) is list:
            return _tuple_type(rest[0], rest[1])(*[decode(x, depth + 1) for x in rest[2]])
        return _decode_scalar(tag, rest)
    except (TypeError, IndexError, ValueError, OverflowError) as e:
        raise ValueError(f"malformed tagged value: {e}") from None


def _decode_scalar(tag: str, rest: list):
    if tag == "i" and type(rest[0]) is str:
        return int(rest[0], 16)
    if tag == "c":
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "y":
        return bytes.fromhex(rest[0])
    if tag == "N" and not rest:
        return None
    if tag == "b" and type(rest[0]) is bool:
        return rest[0]
    if tag == "f":
        return float.fromhex(rest[0])
    if tag == "s" and type(rest[0]) is str:
        return rest[0]
    raise ValueError(f"unknown tag {tag!r}")


def _unpack(code: str, text: str) -> list:
    import base64
    from array import array

    data = base64.b64decode(text, validate=True)
    if len(data) % 8:
        raise ValueError("packed array of a partial item")
    out = array(code)
    out.frombytes(data)
    return out.tolist()


def _unpack_mixed(text: str, ints: list) -> list:
    """Doubles, the ones at ``ints`` (ascending positions) turned back into the ints they were."""
    out = _unpack("d", text)
    last = -1
    for i in ints:
        if type(i) is not int or not last < i < len(out) or not float.is_integer(out[i]):
            raise ValueError("bad int position in a packed array")
        out[i] = int(out[i])
        last = i
    return out


def _tuple_type(name: str, fields: list):
    """A namedtuple class with this name and these fields, made here (and kept: values of one
    type arrive many at a time); `collections.namedtuple` refuses names that are not identifiers."""
    key = (name, tuple(fields))
    cls = _TUPLES.get(key)
    if cls is None:
        if len(fields) > 256 or not all(type(f) is str for f in fields):  # bounded: a class is compiled per type
            raise ValueError("namedtuple fields must be at most 256 names")
        import collections

        cls = collections.namedtuple(name, fields)
        if len(_TUPLES) < 1024:
            _TUPLES[key] = cls
    return cls
