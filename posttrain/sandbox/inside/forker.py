"""The forker: forks one fresh candidate per program, and the zygote's end of it (`Forker`).

It stays root with only CAP_SETUID and CAP_SETGID, so no program can signal it, and it holds
the rlimits and the seccomp filter every candidate inherits. A separate forker keeps the
zygote's own work off the fork path: after a fork, every page the parent writes costs a
copy-on-write fault, and the forker's loop writes few. It reads nothing but fork and wait
requests from the zygote; no request or test ever reaches it.
"""

from __future__ import annotations

import os
import select
import signal
import struct

from . import kernel
from .candidate import candidate_main


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("peer closed the socket")
        data += chunk
    return data


def forker_main(cfg: dict, sock_fd: int) -> None:
    """The forker's loop: on each request, fork one candidate with the pipes that came with it.

    The forker does what every candidate would otherwise repeat: rlimits (all but the CPU limit,
    set per program), capabilities cut to CAP_SETUID and CAP_SETGID (the child needs them to drop
    to its uid; it keeps neither), an oom score of 1000 (under memory pressure the cgroup kills
    a program before the zygote or the judge), and the seccomp filter, which children inherit
    and cannot lift. It stays root, so no program can signal it. Its loop is small on purpose:
    after each fork, every page the parent writes costs a copy-on-write fault.

    It reaps its children itself, but never the latest candidate while it is idle: that one's
    exit status and CPU time are the zygote's to ask for (``W``), and reaping it first would
    lose them."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        kernel.libc().prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open("/dev/null", os.O_RDWR)
        kernel.place_fds([sock_fd, null])  # socket=3, /dev/null=4
        kernel.set_limits(cfg, cpu_s=None, nproc=cfg["nproc"])
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
        kernel.keep_only_caps(kernel.CAP_SETUID, kernel.CAP_SETGID)
        kernel.install_filter()
        import socket

        sock = socket.socket(fileno=3)
    except BaseException:
        os._exit(70)
    poller = select.poll()
    poller.register(3, select.POLLIN)
    poll, recvmsg, anc_size = poller.poll, sock.recvmsg, socket.CMSG_SPACE(5 * 4)
    sol_socket, scm_rights = socket.SOL_SOCKET, socket.SCM_RIGHTS
    children: set[int] = set()  # forked and not yet reaped
    current = 0  # the latest candidate: its status is the zygote's to ask for, so never reaped idly
    while True:
        while not poll(50):
            _reap_children(children, keep=current)  # while idle, collect killed candidates
        try:
            head, anc, _, _ = recvmsg(8, anc_size)
        except OSError:
            os._exit(70)
        fds = []
        for level, kind, data in anc:
            if level == sol_socket and kind == scm_rights:
                fds = list(struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4]))
        if not head:
            os._exit(0)
        if len(head) < 8:
            head += _recv_exact(sock, 8 - len(head))
        if head[:1] == b"F" and len(fds) == 5:
            _reap_children(children, keep=0)  # the last candidates: before the fork, not after
            try:
                pid = kernel.fork()
            except OSError as e:
                pid = -(e.errno or 1)
            if pid == 0:
                try:
                    candidate_main(cfg, *fds)
                finally:
                    os._exit(71)
            if pid > 0:
                children.add(pid)
                current = pid
            for fd in fds:
                os.close(fd)
            sock.sendall(struct.pack(">i", pid))
        elif head[:1] == b"W":
            pid, block = struct.unpack(">iB", head[1:6])
            try:
                got, status, ru = os.wait4(pid, 0 if block else os.WNOHANG)
                cpu = ru.ru_utime + ru.ru_stime
            except ChildProcessError:
                got, status, cpu = -1, 0, 0.0
            if got:
                children.discard(pid)
            sock.sendall(struct.pack(">iid", got, status, cpu))
        else:
            os._exit(70)


def _reap_children(children: set, keep: int) -> None:
    """Reap the forker's dead children, all but ``keep``."""
    for pid in list(children):
        if pid == keep:
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                children.discard(pid)
        except ChildProcessError:
            children.discard(pid)


class Forker:
    """Zygote-side end of the forker: fork requests (with the candidate's five pipe ends
    attached) and wait requests go over one socket, strictly one at a time."""

    def __init__(self, cfg: dict):
        import socket

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                forker_main(cfg, theirs.fileno())
            finally:
                os._exit(71)
        theirs.close()
        self.sock = mine

    def fork(self, fds: list[int]) -> int:
        import socket

        socket.send_fds(self.sock, [b"F" + bytes(7)], fds)
        (pid,) = struct.unpack(">i", _recv_exact(self.sock, 4))
        if pid < 0:
            raise OSError(-pid, f"forking a candidate: {os.strerror(-pid)}")
        return pid

    def wait(self, pid: int, block: bool) -> tuple[int, int, float]:
        """(pid or 0 if still running or -1 if unknown, wait status, CPU seconds)."""
        self.sock.sendall(b"W" + struct.pack(">iB", pid, block) + bytes(2))
        return struct.unpack(">iid", _recv_exact(self.sock, 16))
