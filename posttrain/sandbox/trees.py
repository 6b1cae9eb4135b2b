"""Read-only project trees shared by every program that runs on them, seen through an overlay.

A program that runs a project's test suite needs the project's files (megabytes) plus the few an
episode changed. Writing the whole tree into the sandbox per run costs seconds; here the tree is
written once per process, to a folder named by its content under `store_root`, which every
sandbox binds read-only at `zygote.TREES_DIR`. A job names the tree (`Tree`) and carries only
its overlay; the zygote mounts an overlay filesystem (the tree as its lower layer, an upper layer
on the sandbox's fresh ``/tmp``) at `zygote.TREE_DIR` before the program starts, and the program
writes its changed files and removes its deleted ones there. Where the kernel refuses an overlay
mount in the sandbox's user namespace, the zygote copies the tree instead (same result, the old
cost); the reply says which (``tree``).

Layout choices:

* **Content-addressed, immutable.** A tree's folder is the SHA-256 of its paths and texts; it is
  written to a temporary name and renamed into place, so a sandbox never sees half a tree, and
  an overlay's lower layer never changes under it.
* **Writable by the program through the overlay.** Files are 0666 and folders 0777, since the
  program runs as an unprivileged uid that owns nothing in the tree and tests write files next to
  their modules. A job's hidden files (`pool.Job.hidden`) are the exception: the zygote places
  them over the tree read-only (`inside.mounts.place_hidden`); the store's root is 0700, so on the host no other user reaches them, and in the
  sandbox the program cannot list the store (other trees: another task's files).
* **One store per process**, removed at exit; a pool in another process (a Ray farm actor)
  writes the trees its jobs name into its own store, from the job's copy of the files.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping

_LOCK = threading.Lock()
_ROOT: list[str] = []


class Tree:
    """A project's files (relative path -> text), never changed once made; ``name`` is its
    content's hash, computed on first use."""

    __slots__ = ("files", "_name")

    def __init__(self, files: Mapping[str, str]):
        self.files, self._name = files, ""

    @property
    def name(self) -> str:
        if not self._name:
            h = hashlib.sha256()
            for path in sorted(self.files):
                data = self.files[path].encode()
                h.update(f"{path}\0{len(data)}\0".encode())
                h.update(data)
            self._name = h.hexdigest()
        return self._name

    def __reduce__(self):  # to a farm actor: the files go, the name is recomputed there
        return Tree, (dict(self.files),)


def store_root() -> str:
    """This process's store folder (0700), made on first use and removed at exit."""
    with _LOCK:
        if not _ROOT:
            root = tempfile.mkdtemp(prefix="posttrain-trees-")
            atexit.register(shutil.rmtree, root, True)
            _ROOT.append(root)
        return _ROOT[0]


def materialize(tree: Tree) -> str:
    """Write ``tree`` under the store unless it is there; returns its folder name."""
    name, root = tree.name, store_root()
    final = os.path.join(root, name)
    if os.path.isdir(final):
        return name
    tmp = tempfile.mkdtemp(prefix=".part-", dir=root)
    try:
        os.chmod(tmp, 0o777)
        for path, text in tree.files.items():
            _write(tmp, path, text)
        try:
            os.rename(tmp, final)
        except OSError:  # another thread put the same tree there first
            if not os.path.isdir(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return name


def _write(root: str, path: str, text: str) -> None:
    full = os.path.join(root, path)
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        os.makedirs(parent)
        for d in _parents(root, parent):
            os.chmod(d, 0o777)  # makedirs' mode is cut by the umask
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _parents(root: str, folder: str) -> list[str]:
    out = []
    while folder != root:
        out.append(folder)
        folder = os.path.dirname(folder)
    return out


def overlay(base: Mapping[str, str], view: Mapping[str, str]) -> dict[str, str | None]:
    """What turns ``base`` into ``view``: each added or changed file's text, None for each
    removed one."""
    changed: dict[str, str | None] = {}
    for path, text in view.items():
        old = base.get(path)
        if old is not text and old != text:
            changed[path] = text
    changed.update({path: None for path in base if path not in view})
    return changed
