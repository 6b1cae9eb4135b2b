"""Where things are inside the sandbox, and the mounts the zygote makes there.

Who may write where (every other path is a read-only bind or does not exist):

- ``/tmp`` and ``/dev/shm`` (`TMPFS`): everyone in the sandbox; size-capped tmpfs the zygote
  mounts itself and replaces after a program that touched them (`fresh_tmpfs`), so nothing a
  program writes reaches the next.
- `JUDGE_DIR`: the judge's uid only (mode 0700): where test modules are written. The candidate
  cannot name anything in it.
- `TREE_DIR`: the program, through an overlay whose lower layer is the read-only tree and whose
  upper layer lies under `LAYERS_DIR` on this run's ``/tmp`` (only the zygote's uid enters it).
  Except a job's hidden files (`place_hidden`): the zygote writes each one and binds it
  read-only over itself before the program starts, so the program cannot write, truncate,
  chmod, unlink or rename over one; their folders are mount points too (so cannot be renamed
  away and replaced), and each folder holding one gets an empty read-only ``__pycache__``.
- `BOX_DIR`, `JUDGE_LIB`, `SITE_DIR`, `TREES_DIR`: read-only binds from the host (this code,
  pytest and the pytest judge, a site-packages, the project trees).
"""

from __future__ import annotations

import errno
import os

from . import kernel
from .kernel import MNT_DETACH, MS_NODEV, MS_NOSUID

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096

TMPFS = ("/tmp", "/dev/shm")
BOX_DIR = "/sandbox/box"  # read-only: the modules of this package (the zygote compiles `warm` from here)
JUDGE_LIB = "/sandbox/lib"  # read-only: the pytest library and `pytest_judge`, for the judge
SITE_DIR = "/sandbox/site"  # read-only: a virtual environment's site-packages, when the pool names one
JUDGE_DIR = "/judge"  # a tmpfs only the judge's uid can enter: where test modules are written
TREES_DIR = "/sandbox/trees"  # read-only: the host's project trees (`posttrain.sandbox.trees`)
TREE_DIR = "/tmp/work"  # where a job's tree is mounted (an overlay) or copied
LAYERS_DIR = "/tmp/.layers"  # the overlay's upper and work folders: only the zygote's uid enters


def _tree_name(name) -> str:
    if not (isinstance(name, str) and len(name) == 64 and all(c in "0123456789abcdef" for c in name)):
        raise ValueError("a tree is named by 64 hex digits")
    if not os.path.isdir(f"{TREES_DIR}/{name}"):
        raise FileNotFoundError(f"tree {name[:12]} is not in the store")
    return name


def mount_tree(name: str) -> str:
    """Show the tree ``name`` at `TREE_DIR`, writable by the program: an overlay mount (the tree
    read-only below, an upper layer on this run's ``/tmp``), or, where the kernel refuses one in
    this user namespace, a copy. Returns which."""
    import ctypes

    lower = f"{TREES_DIR}/{_tree_name(name)}"
    os.mkdir(LAYERS_DIR, 0o700)
    os.mkdir(f"{LAYERS_DIR}/up", 0o777)
    os.chmod(f"{LAYERS_DIR}/up", 0o777)  # the merged root takes the upper root's mode: the program writes there
    os.mkdir(f"{LAYERS_DIR}/work", 0o700)
    os.mkdir(TREE_DIR, 0o777)
    opts = f"lowerdir={lower},upperdir={LAYERS_DIR}/up,workdir={LAYERS_DIR}/work"
    for extra in ("", ",userxattr"):
        if kernel.libc().mount(b"overlay", TREE_DIR.encode(), b"overlay", MS_NOSUID | MS_NODEV, (opts + extra).encode()) == 0:
            _MOUNTED.add(TREE_DIR)
            return "overlay"
    errno_ = ctypes.get_errno()
    if errno_ not in (errno.EPERM, errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP):
        raise OSError(errno_, f"mount overlay {TREE_DIR}")
    copy_tree(lower, TREE_DIR)
    return "copy"


def copy_tree(src: str, dst: str) -> None:
    for folder, dirs, files in os.walk(src):
        out = dst + folder[len(src):]
        for d in dirs:
            os.mkdir(f"{out}/{d}")
            os.chmod(f"{out}/{d}", 0o777)
        for name in files:
            with open(f"{folder}/{name}", "rb") as f:
                data = f.read()
            fd = os.open(f"{out}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)
            while data:
                data = data[os.write(fd, data):]
            os.close(fd)


_MOUNTED: set = set()


def fresh_tmpfs(cfg: dict, force: bool = False) -> None:
    """Mount a fresh size-capped tmpfs on each of ``TMPFS`` that a program has touched (or on
    all of them with ``force``), and stamp its root with mtime 0. Creating, renaming or deleting
    anything in it sets the root's mtime to now, and only the root's owner (here, root) can set
    it back, so a mount whose root still says 0 holds nothing a program put there."""
    import ctypes

    lib = kernel.libc()
    opts = f"size={cfg['tmpfs_mb']}m,nr_inodes=4096,mode=1777".encode()
    for where in TMPFS:
        if not force and os.stat(where).st_mtime_ns == 0:
            continue
        path = where.encode()
        if where in _MOUNTED and lib.umount2(path, MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), f"umount {where}")
        _MOUNTED.discard(where)
        if lib.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs {where}")
        _MOUNTED.add(where)
        os.utime(where, ns=(0, 0))


def judge_tmpfs(cfg: dict, force: bool = True) -> None:
    """Mount the judge's own tmpfs on `JUDGE_DIR`, mode 0700 and owned by the judge's uid: a test
    module written there cannot be read, replaced or joined by a ``conftest.py`` from the program,
    and the program cannot fill it to make a task fail to load.

    Without ``force``, only when the last task changed it: any write, chmod or link there moves
    the root's ctime past the one recorded at mount time (and no one can set a ctime back), so
    an untouched ``/judge`` is provably the fresh one and every other is replaced before the
    next program runs. A mode or a file one task left there never reaches the next."""
    import ctypes

    if not os.path.isdir(JUDGE_DIR):
        return
    if not force and os.stat(JUDGE_DIR).st_ctime_ns == _JUDGE_CTIME[0]:
        return
    lib = kernel.libc()
    if JUDGE_DIR in _MOUNTED and lib.umount2(JUDGE_DIR.encode(), MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), f"umount {JUDGE_DIR}")
    _MOUNTED.discard(JUDGE_DIR)
    uid = cfg["judge_uid"]
    opts = f"size=64m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    if lib.mount(b"tmpfs", JUDGE_DIR.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs {JUDGE_DIR}")
    _MOUNTED.add(JUDGE_DIR)
    _JUDGE_CTIME[0] = os.stat(JUDGE_DIR).st_ctime_ns


_JUDGE_CTIME = [0]  # the root's ctime right after `judge_tmpfs` mounted it


def place_hidden(files: dict) -> None:
    """Write ``files`` (path under `TREE_DIR` -> text) into the mounted tree, each read-only to
    the program: 0444, owned by the zygote, and bound read-only over itself. A mount point cannot
    be unlinked or renamed over (EBUSY), and a read-only mount refuses writes, truncation and
    chmod (EROFS), whoever asks. Every folder on the way is made a mount point too: renaming
    ``tests`` away and making a new one would otherwise swap the files out from under their
    names. Each folder holding one gets an empty read-only ``__pycache__``, where Python and
    pytest's assertion rewriter look for cached bytecode unless ``sys.pycache_prefix`` is set.
    Runs before the program, so no link a program made can be on these paths."""
    paths = [_hidden_path(p) for p in files]
    folders = sorted({"/".join(p.split("/")[:k]) for p in paths for k in range(1, p.count("/") + 1)},
                     key=lambda d: d.count("/"))
    for path in paths:
        _write_root_file(f"{TREE_DIR}/{path}", files[path])
    caches = sorted({p.rsplit("/", 1)[0] + "/__pycache__" if "/" in p else "__pycache__" for p in paths})
    for cache in caches:
        _empty_folder(f"{TREE_DIR}/{cache}")
    for folder in folders:
        _bind(f"{TREE_DIR}/{folder}", read_only=False)
    for where in caches + paths:
        _bind(f"{TREE_DIR}/{where}", read_only=True)


def _hidden_path(path) -> str:
    parts = path.split("/") if isinstance(path, str) else [""]
    if any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise ValueError(f"a hidden file's path must be relative and plain: {path!r}")
    return path


def _write_root_file(full: str, text: str) -> None:
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        os.makedirs(parent)
        os.chmod(parent, 0o777)  # tests may write beside their modules; makedirs' mode is cut by the umask
    if os.path.lexists(full):
        os.unlink(full)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]
    os.fchmod(fd, 0o444)
    os.close(fd)


def _empty_folder(full: str) -> None:
    if os.path.lexists(full):
        import shutil

        shutil.rmtree(full)
    os.mkdir(full, 0o555)


def _bind(full: str, read_only: bool) -> None:
    import ctypes

    lib, path = kernel.libc(), full.encode()
    if lib.mount(path, path, None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind {full}")
    _HIDDEN.append(full)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    if read_only and lib.mount(None, path, None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), f"remount read-only {full}")


_HIDDEN: list = []  # the binds `place_hidden` made, outermost first


def unmount_tree() -> None:
    """Take the last job's tree away (its upper layer goes with the next fresh ``/tmp``), its
    hidden files' binds first, innermost first."""
    while _HIDDEN:
        where = _HIDDEN.pop()
        if kernel.libc().umount2(where.encode(), MNT_DETACH) != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), f"umount {where}")
    if TREE_DIR in _MOUNTED:
        if kernel.libc().umount2(TREE_DIR.encode(), MNT_DETACH) != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), f"umount {TREE_DIR}")
        _MOUNTED.discard(TREE_DIR)
