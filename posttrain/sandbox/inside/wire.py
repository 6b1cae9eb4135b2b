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

MAX_FRAME = 64 << 20


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps with options builds one per call


def write_frame(fd: int, obj) -> None:
    """Send one length-prefixed JSON message."""
    _write_all(fd, _ENCODER.encode(obj).encode())


def _write_all(fd: int, body: bytes) -> None:
    data = struct.pack(">I", len(body)) + body
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


def encode(x, depth: int = 0):
    """Tag a value made only of exact builtin types; anything else (subclasses too) is refused."""
    if depth > 100:
        raise ValueError("value nested deeper than 100")
    t = type(x)
    if x is None:
        return ["N"]
    if t is bool:
        return ["b", bool(x)]
    if t is int:
        return ["i", int.__format__(x, "x")]
    if t is float:
        return ["f", float.hex(x)]
    if t is complex:
        return ["c", float.hex(x.real), float.hex(x.imag)]
    if t is str:
        return ["s", str.__str__(x)]
    if t is bytes:
        return ["y", bytes.hex(x)]
    if t in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
        return [tag, [encode(v, depth + 1) for v in t.__iter__(x)]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(x)]]
    raise TypeError(f"cannot send a value of type {t.__name__!r}")


def decode(v, depth: int = 0):
    """Rebuild a tagged value; only builtin types come out. Raises ValueError on anything odd."""
    if depth > 100 or type(v) is not list or not v or type(v[0]) is not str:
        raise ValueError("malformed tagged value")
    tag, rest = v[0], v[1:]
    try:
        if tag == "N" and not rest:
            return None
        if tag == "b" and type(rest[0]) is bool:
            return rest[0]
        if tag == "i" and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "f":
            return float.fromhex(rest[0])
        if tag == "c":
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "s" and type(rest[0]) is str:
            return rest[0]
        if tag == "y":
            return bytes.fromhex(rest[0])
        if tag in ("l", "t", "S", "F") and type(rest[0]) is list:
            items = [decode(x, depth + 1) for x in rest[0]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and type(rest[0]) is list:
            return {decode(k, depth + 1): decode(w, depth + 1) for k, w in rest[0]}
    except (TypeError, IndexError, ValueError, OverflowError) as e:
        raise ValueError(f"malformed tagged value: {e}") from None
    raise ValueError(f"unknown tag {tag!r}")
