"""JSON Lines input: one JSON object per line, read the same way by every command.

Blank lines are skipped; a ``.gz`` file is read through gzip. Bad input is a `UserError` in one
format, ``FILE:LINE: what is wrong`` (``FILE: what is wrong`` where no line is to blame):

- ``data.jsonl: no such file``
- ``data.jsonl:3: invalid JSON (Expecting ',' delimiter at column 17)``
- ``data.jsonl:4: expected a JSON object, got an array``
- ``data.jsonl:5: not UTF-8 text (...)``
- ``data.jsonl: no records (the file is empty)``, unless the caller accepts an empty file.

``FILE`` is the path as the caller gave it. Lines are numbered from 1 and count blank lines, so a
``FILE:LINE`` opens at the right place in an editor.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Iterator

from posttrain.errors import UserError

_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}


def iter_jsonl(path: str | Path, *, allow_empty: bool = False) -> Iterator[tuple[int, str, dict]]:
    """Yield ``(line number, raw line, record)`` for each non-blank line, streaming.

    Raises `UserError` for a missing file, an unreadable line, a line that is not a JSON object and,
    after the last line, for a file without records unless ``allow_empty``."""
    name, p = str(path), Path(path)
    if not p.exists():
        raise UserError(f"{name}: no such file")
    if p.is_dir():
        raise UserError(f"{name}: a folder, not a JSONL file")
    opener = gzip.open if p.suffix == ".gz" else open
    records = blank = 0
    with opener(p, "rb") as f:
        lines = enumerate(f, start=1)
        while True:
            try:
                lineno, data = next(lines)
            except StopIteration:
                break
            except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz
                raise UserError(f"{name}: cannot read gzip ({e})") from None
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{name}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not raw.strip():
                blank += 1
                continue
            try:
                record = json.loads(raw.rstrip("\r\n"))  # columns count within the line
            except json.JSONDecodeError as e:
                raise UserError(f"{name}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(record, dict):
                got = _JSON_TYPES.get(type(record), type(record).__name__)
                raise UserError(f"{name}:{lineno}: expected a JSON object, got {got}")
            records += 1
            yield lineno, raw, record
    if not records and not allow_empty:
        raise UserError(f"{name}: no records (the file is {'blank' if blank else 'empty'})")


def read_jsonl(path: str | Path, *, allow_empty: bool = False) -> list[tuple[int, dict]]:
    """All ``(line number, record)`` of a JSONL file, checked as `iter_jsonl` does."""
    return [(lineno, record) for lineno, _, record in iter_jsonl(path, allow_empty=allow_empty)]
