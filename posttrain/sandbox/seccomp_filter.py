"""The seccomp filter every sandboxed program runs under, generated with libseccomp.

The filter allows every system call except the ones below, which fail with ``EPERM`` (``clone3``:
``ENOSYS``), so a program that tries one sees an ordinary error and its verdict stays its own.
Calls from a foreign ABI (32-bit ``int 0x80`` or x32 on x86_64) would bypass a per-number list,
so they kill the process instead.

- **namespaces**: ``unshare`` and ``setns`` always; ``clone`` when its flags ask for a new
  namespace (``CLONE_NEWNS``, ``NEWUTS``, ``NEWIPC``, ``NEWUSER``, ``NEWPID``, ``NEWNET``,
  ``NEWCGROUP``). ``clone3`` passes its flags in a struct that seccomp cannot read, so it fails
  with ``ENOSYS``: glibc then falls back to ``clone``, whose flags the filter does check
  (threads, ``fork``, ``posix_spawn`` and ``subprocess`` keep working). An unprivileged user
  namespace would otherwise hand the program every capability inside it.
- **kernel attack surface**: ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_setup``,
  ``io_uring_enter``, ``io_uring_register``.
- **other processes**: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``pidfd_getfd``.
- **kernel keyrings**: ``keyctl``, ``add_key``, ``request_key`` (a user keyring outlives the
  program and would carry state to the next one).
- **mounts**: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API
  (``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``,
  ``mount_setattr``).
- **the machine**: ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``, ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``syslog``.
- **state that outlives a program**: SysV IPC (``shmget``, ``semget``, ``msgget``) and POSIX
  message queues (``mq_open``) live in the sandbox's IPC namespace, which one worker keeps for
  many programs; without them one program could leave data for the next.

The filter is compiled once, on the host, with libseccomp (through ``pyseccomp``, a ctypes
binding with the API of libseccomp's own Python module, which is used instead where it is
installed), and exported as classic BPF bytes. The zygote installs those bytes with
``prctl(PR_SET_SECCOMP)`` in each program process and in the judge, after they have built their
sandbox and dropped to their uid; see `posttrain.sandbox.zygote` for why there and not with
bubblewrap's ``--seccomp``. Without libseccomp, :func:`build` raises
:class:`SeccompUnavailable` and the pool refuses to start, as it does without bubblewrap.
"""

from __future__ import annotations

import errno
import functools
import tempfile

# clone(2) flags that create a namespace. CLONE_NEWTIME (0x80) overlaps the exit-signal byte
# of clone(2) and is only accepted by unshare and clone3, which are denied whole.
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
                   "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000,
                   "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}

DENIED = {  # family -> system calls that fail with EPERM
    "namespaces": ("unshare", "setns"),
    "bpf": ("bpf",),
    "perf": ("perf_event_open",),
    "ptrace": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    "keyring": ("keyctl", "add_key", "request_key"),
    "userfaultfd": ("userfaultfd",),
    "mount": ("mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
              "fspick", "move_mount", "open_tree", "mount_setattr"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "kexec": ("kexec_load", "kexec_file_load"),
    "modules": ("init_module", "finit_module", "delete_module"),
    "reboot": ("reboot",),
    "system": ("swapon", "swapoff", "acct", "syslog"),
    "ipc": ("shmget", "semget", "msgget", "mq_open"),
}
ENOSYS_CALLS = ("clone3",)


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) is missing, or it cannot build the filter."""


def _binding():
    try:
        import pyseccomp as seccomp
    except ImportError:
        try:
            import seccomp  # libseccomp's own binding (Debian's python3-seccomp), if importable
        except ImportError:
            raise SeccompUnavailable("libseccomp's Python binding (pip install pyseccomp)") from None
    except (OSError, RuntimeError) as e:  # pyseccomp raises when the shared library is absent
        raise SeccompUnavailable(f"libseccomp (apt-get install libseccomp2; {e})") from None
    return seccomp


@functools.lru_cache(maxsize=1)
def build() -> bytes:
    """The filter as classic BPF (``struct sock_filter`` array, native byte order)."""
    seccomp = _binding()
    try:
        f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
        for name in (n for names in DENIED.values() for n in names):
            f.add_rule(seccomp.ERRNO(errno.EPERM), _number(seccomp, name))
        for name in ENOSYS_CALLS:
            f.add_rule(seccomp.ERRNO(errno.ENOSYS), _number(seccomp, name))
        clone = _number(seccomp, "clone")
        for bit in NAMESPACE_FLAGS.values():
            f.add_rule(seccomp.ERRNO(errno.EPERM), clone, seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            bpf = tmp.read()
    except SeccompUnavailable:
        raise
    except Exception as e:  # an old or broken libseccomp
        raise SeccompUnavailable(f"a working libseccomp (it could not build the filter: {type(e).__name__}: {e})") from None
    if not bpf or len(bpf) % 8 or len(bpf) // 8 > 4096:
        raise SeccompUnavailable(f"a working libseccomp (it exported a filter of {len(bpf)} bytes)")
    return bpf


def _number(seccomp, name: str) -> int:
    """The syscall number libseccomp uses for ``name`` on this machine (a negative pseudo-number
    for a call this architecture lacks, which libseccomp then leaves out)."""
    nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    if nr == -1:  # __NR_SCMP_ERROR: a name this libseccomp does not know
        raise SeccompUnavailable(f"a newer libseccomp (this one does not know the system call {name!r})")
    return nr


def syscall_number(name: str) -> int:
    """The native number of a system call (for tests that call it through ``syscall(2)``)."""
    return _number(_binding(), name)


def denied() -> list[str]:
    """Every system call the filter refuses, for docs and messages."""
    return sorted({n for names in DENIED.values() for n in names} | set(ENOSYS_CALLS) | {"clone"})
