"""The seccomp filter: one test per denied family. The program calls each system call itself
through ``syscall(2)`` and returns what came back; the tests pass only if every call failed
with EPERM (clone3: ENOSYS) while the program went on running. The ``guard`` fixture then
checks that nothing leaked and that the canaries still pass.

Where the kernel would refuse a call anyway (an unprivileged uid cannot load a module), the
arguments are chosen, where possible, so that without the filter it would fail differently
(EFAULT, EBADF, EINVAL, ESRCH) or succeed; the program also reports ``Seccomp: 2`` from
/proc/self/status."""

from __future__ import annotations

import errno

import pytest

from posttrain.sandbox import seccomp_filter, worker
from posttrain.sandbox.pool import Job, SandboxPool, SandboxUnavailable
from posttrain.sandbox.seccomp_filter import NAMESPACE_FLAGS

CLONE_SIGHAND = 0x800  # without CLONE_VM: EINVAL, so an unfiltered clone creates nothing
NULL, BAD_FD, NO_PID = 0, -1, 999999

CALLS = {  # family -> [(label, syscall, args)]
    "namespaces": [("unshare(CLONE_NEWUSER)", "unshare", (NAMESPACE_FLAGS["CLONE_NEWUSER"],)),
                   ("unshare(CLONE_NEWNET)", "unshare", (NAMESPACE_FLAGS["CLONE_NEWNET"],)),
                   ("setns", "setns", (BAD_FD, 0))]
                  + [(f"clone({flag})", "clone", (bit | CLONE_SIGHAND, 0, 0, 0, 0))
                     for flag, bit in NAMESPACE_FLAGS.items()],
    "bpf": [("bpf", "bpf", (0, NULL, 0))],
    "perf": [("perf_event_open", "perf_event_open", (NULL, 0, -1, -1, 0))],
    "ptrace": [("ptrace", "ptrace", (2, NO_PID, 0, 0)),  # PTRACE_PEEKDATA
               ("process_vm_readv", "process_vm_readv", (NO_PID, NULL, 0, NULL, 0, 0)),
               ("process_vm_writev", "process_vm_writev", (NO_PID, NULL, 0, NULL, 0, 0)),
               ("pidfd_getfd", "pidfd_getfd", (BAD_FD, 0, 0))],
    "keyring": [("keyctl", "keyctl", (0, -4, 0)),  # KEYCTL_GET_KEYRING_ID of the user keyring
                ("add_key", "add_key", (NULL, NULL, NULL, 0, -2)),
                ("request_key", "request_key", (NULL, NULL, NULL, 0))],
    "userfaultfd": [("userfaultfd", "userfaultfd", (1,))],  # UFFD_USER_MODE_ONLY
    "mount": [("mount", "mount", (NULL, NULL, NULL, 0, NULL)), ("umount2", "umount2", (NULL, 0)),
              ("pivot_root", "pivot_root", (NULL, NULL)), ("chroot", "chroot", (NULL,)),
              ("fsopen", "fsopen", (NULL, 0)), ("fsmount", "fsmount", (BAD_FD, 0, 0)),
              ("fsconfig", "fsconfig", (BAD_FD, 0, NULL, NULL, 0)), ("fspick", "fspick", (BAD_FD, NULL, 0)),
              ("move_mount", "move_mount", (BAD_FD, NULL, BAD_FD, NULL, 0)),
              ("open_tree", "open_tree", (BAD_FD, NULL, 0)),
              ("mount_setattr", "mount_setattr", (BAD_FD, NULL, 0, NULL, 0))],
    "io_uring": [("io_uring_setup", "io_uring_setup", (1, NULL)),
                 ("io_uring_enter", "io_uring_enter", (BAD_FD, 0, 0, 0, NULL, 0)),
                 ("io_uring_register", "io_uring_register", (BAD_FD, 0, NULL, 0))],
    "kexec": [("kexec_load", "kexec_load", (0, 0, NULL, 0)),
              ("kexec_file_load", "kexec_file_load", (BAD_FD, BAD_FD, 0, NULL, 0))],
    "modules": [("init_module", "init_module", (NULL, 0, NULL)),
                ("finit_module", "finit_module", (BAD_FD, NULL, 0)),
                ("delete_module", "delete_module", (NULL, 0))],
    "reboot": [("reboot", "reboot", (0, 0, 0, NULL))],
    "system": [("swapon", "swapon", (NULL, 0)), ("swapoff", "swapoff", (NULL,)), ("acct", "acct", (NULL,)),
               ("syslog", "syslog", (10, NULL, 0))],  # SYSLOG_ACTION_SIZE_BUFFER
    "ipc": [("shmget", "shmget", (0, 4096, 0o600)), ("semget", "semget", (0, 1, 0o600)),
            ("msgget", "msgget", (0, 0o600)), ("mq_open", "mq_open", (NULL, 0, 0, NULL))],
}

PROGRAM = '''
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(nr, args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

def f():
    out = {label: call(nr, args) for label, nr, args in CALLS}
    out["Seccomp"] = open("/proc/self/status").read().split("\\nSeccomp:")[1].split()[0]
    return out
'''


def syscall_program(calls) -> str:
    resolved = [(label, seccomp_filter.syscall_number(name), args) for label, name, args in calls]
    return f"CALLS = {resolved!r}\n" + PROGRAM


def test_every_family_is_tested():
    assert set(CALLS) == set(seccomp_filter.DENIED)
    tested = {name for calls in CALLS.values() for _, name, _ in calls}
    assert tested == {n for names in seccomp_filter.DENIED.values() for n in names} | {"clone"}


@pytest.mark.parametrize("family", sorted(CALLS))
def test_denied_family_fails_with_eperm(pool, guard, family):
    calls = CALLS[family]
    want = {label: "EPERM" for label, _, _ in calls} | {"Seccomp": "2"}
    tests = f"def check(candidate):\n    got = candidate()\n    assert got == {want!r}, got\n"
    outcome = pool.run([Job(syscall_program(calls), "f", tests)])[0]
    assert (outcome.cls.value, outcome.reason) == ("PASS", ""), outcome.detail


def test_clone3_fails_with_enosys_and_threads_and_subprocesses_still_work(pool, guard):
    program = syscall_program([("clone3", "clone3", (NULL, 0))]) + '''
import subprocess, threading
def g():
    out = f()
    box = []
    t = threading.Thread(target=lambda: box.append("thread ran"))
    t.start(); t.join()
    out["thread"] = box[0]
    out["subprocess"] = subprocess.run(["/usr/bin/python3", "-c", "print(6 * 7)"], capture_output=True).stdout.decode()
    return out
'''
    want = {"clone3": "ENOSYS", "Seccomp": "2", "thread": "thread ran", "subprocess": "42\n"}
    tests = f"def check(candidate):\n    got = candidate()\n    assert got == {want!r}, got\n"
    outcome = pool.run([Job(program, "g", tests)])[0]
    assert (outcome.cls.value, outcome.reason) == ("PASS", ""), outcome.detail


def test_the_judge_runs_under_the_filter_too(pool, guard):
    # The tests themselves (run by the judge) try to make a user namespace.
    nr = seccomp_filter.syscall_number("unshare")
    tests = ("import ctypes\n"
             "def check(candidate):\n"
             "    libc = ctypes.CDLL(None, use_errno=True)\n"
             f"    assert libc.syscall({nr}, {NAMESPACE_FLAGS['CLONE_NEWUSER']}) == -1\n"
             f"    assert ctypes.get_errno() == {errno.EPERM}\n"
             "    assert candidate(2) == 4\n")
    outcome = pool.run([Job("def f(x):\n    return 2 * x\n", "f", tests)])[0]
    assert (outcome.cls.value, outcome.reason) == ("PASS", ""), outcome.detail


def test_without_libseccomp_the_sandbox_refuses_to_start(monkeypatch):
    def missing():
        raise seccomp_filter.SeccompUnavailable("libseccomp (apt-get install libseccomp2; not found)")

    monkeypatch.setattr(worker.seccomp_filter, "build", missing)
    with pytest.raises(SandboxUnavailable, match=r"missing: .*libseccomp \(apt-get install libseccomp2") as e:
        SandboxPool()
    assert "\n" not in str(e.value)
