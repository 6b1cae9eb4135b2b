"""What the sandbox's processes ask of the kernel: the C library, a bare fork, the seccomp
filter, resource limits, uids and capabilities.

The seccomp filter (`posttrain.sandbox.seccomp_filter`) arrives as BPF bytes compiled on the
host with libseccomp; the forker and the judge install it with ``prctl(PR_SET_SECCOMP)`` before
they take any work, and every candidate inherits the forker's (a filter is kept across fork
and exec and can never be removed). It is installed there, and not for the whole sandbox with
bubblewrap's ``--seccomp FD``, because the zygote itself needs ``mount`` and ``umount2`` to
replace the tmpfs, calls the filter denies: a sandbox-wide filter would have to allow them.
Installed in the two processes that handle untrusted input, the filter holds all of it, with no
exemption; a process that cannot install it, or finds it not in force afterwards
(``PR_GET_SECCOMP``), exits before taking work, and the worker fails to start (INFRA_FAIL
after retries, never a silently weaker sandbox).
"""

from __future__ import annotations

import os

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
PR_SET_PDEATHSIG, PR_GET_SECCOMP, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 21, 22, 2
CAP_SETGID, CAP_SETUID = 6, 7


_LIBC = []
_FILTER = []


def libc():
    if not _LIBC:  # loaded once in the zygote, before any fork
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
        # fork through a PyDLL: the call keeps the GIL, so the child does not start by
        # re-acquiring it (fewer pages written in a fresh child).
        _LIBC.append(ctypes.PyDLL(None, use_errno=True).fork)
    return _LIBC[0]


def fork() -> int:
    """fork(2) through the C library, without CPython's at-fork work.

    ``os.fork`` runs the interpreter's at-fork hooks (threading's, random's) and re-initialises
    its locks in the child; with a CPU bound pool, that work and the copy-on-write faults it
    causes cost more than a short program. It is safe to skip here: the forker runs a single
    thread and holds no lock while it forks, and every child leaves through ``os._exit``. The
    one hook whose effect matters, a fresh seed for ``random``, the candidate runs by hand when
    its program mentions ``random``."""
    libc()
    pid = _LIBC[1]()
    if pid < 0:
        import ctypes

        raise OSError(ctypes.get_errno(), "fork")
    return pid


def prepare_filter(bpf_hex: str) -> None:
    """Hold the filter as a ``struct sock_fprog`` in the zygote, so a child only calls prctl."""
    import ctypes

    bpf = bytes.fromhex(bpf_hex)
    if not bpf or len(bpf) % 8:
        raise ValueError("malformed seccomp filter")

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bpf, len(bpf))
    _FILTER[:] = [buf, SockFprog(len(bpf) // 8, ctypes.addressof(buf))]


def install_filter() -> None:
    """Install the seccomp filter on this process (for good: it is inherited and never lifted)."""
    import ctypes

    lib = libc()
    if lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_FILTER[1]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    if lib.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != SECCOMP_MODE_FILTER:
        raise OSError("the seccomp filter is not in force")


def set_limits(cfg: dict, cpu_s: int | None, nproc: int) -> None:
    import resource as r

    mem = cfg["memory_mb"] << 20
    limits = [(r.RLIMIT_AS, mem), (r.RLIMIT_NPROC, nproc), (r.RLIMIT_FSIZE, cfg["file_mb"] << 20),
              (r.RLIMIT_NOFILE, 64), (r.RLIMIT_CORE, 0)]
    if cpu_s is not None:
        limits.append((r.RLIMIT_CPU, cpu_s))
    for lim, val in limits:
        hard = val + 1 if lim == r.RLIMIT_CPU else val  # soft CPU limit sends SIGXCPU first
        r.setrlimit(lim, (val, hard))


def drop_to(uid: int) -> None:
    """Drop to ``uid`` for real, effective and saved ids (each call raises if it fails)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from uid 0 to non-zero: permitted and effective capabilities are cleared


def place_fds(fds: list[int]) -> None:
    """Move fds to 3, 4, ... in order and close everything else from there on."""
    tmp = [os.dup(fd) for fd in fds]
    for i, fd in enumerate(tmp):
        os.dup2(fd, 3 + i)
    os.closerange(3 + len(fds), 1 << 16)


CAP_SETGID, CAP_SETUID = 6, 7


def keep_only_caps(*caps: int) -> None:
    """Reduce this process's effective and permitted capabilities to ``caps`` (capset(2))."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    mask = sum(1 << c for c in caps)
    data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
    if libc().capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:  # _LINUX_CAPABILITY_VERSION_3
        raise OSError(ctypes.get_errno(), "capset")
