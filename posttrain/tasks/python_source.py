"""Python source every machine has: the interpreter's own standard library, as mid-training text.

`stdlib_documents` reads the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (nothing is
downloaded) and returns them as documents for a tokenizer and for raw-mode SFT (mid-training).

Design choices:
- Test suites, IDLE, the old 2to3 fixers and installed packages are left out: they are mostly
  data, fixtures and long literal tables, not the everyday code a small model should see first.
- Files are taken in an order fixed by a hash of their relative path (not by name), so a small
  character budget still samples the whole library instead of the modules starting with ``a``.
- Runs of blank lines are squeezed and files larger than `MAX_FILE_CHARS` skipped (generated
  tables); the rest is kept as written, comments and docstrings included.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "turtledemo",
             "ensurepip", "pydoc_data", "encodings"}
MAX_FILE_CHARS = 120_000


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The library's ``.py`` files, in a fixed hash order."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in base.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(base).parts[:-1])]
    return sorted(files, key=lambda p: hashlib.sha256(str(p.relative_to(base)).encode()).hexdigest())


def stdlib_documents(max_chars: int, root: str | Path | None = None) -> list[str]:
    """Up to ``max_chars`` characters of standard-library source, one document per file."""
    docs, total = [], 0
    for path in stdlib_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > MAX_FILE_CHARS:
            continue
        text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
        docs.append(text[: max_chars - total])
        total += len(docs[-1])
        if total >= max_chars:
            break
    return docs
