"""The judge: runs a task's tests against the candidate through a proxy, and the zygote's end
of it (`Judge`).

The judge (function-call and pytest-style tasks) runs each task's prelude and
``check(candidate)`` as a second uid, under the same filter, with ``candidate`` a proxy that
ships each call's arguments to the candidate and decodes the answer as strictly typed data
(`wire.decode`). The verdict is computed here, never in the candidate, so custom ``__eq__``,
patched builtins, stack walking or an early exit in the candidate cannot produce a pass.

It serves one task after another (it receives each candidate's pipes over a socket), which
saves a fork per program; it runs each task in a fresh namespace with a freshly seeded
``random``, and it is replaced by a fresh one whenever a task leaves state behind (a thread, an
open file, a changed builtin, ``sys.modules`` entry, ``sys.path``, recursion limit, signal
handler, timer, umask, working directory or environment), times out, or is abandoned for any
other reason. Attributes a task's code sets on an imported module (``math.pi = 3``) are not
looked for: tests and preludes are the task's own trusted code, not the program's.

Who may write where: the judge writes test modules under `mounts.JUDGE_DIR` (its uid only) and
its verdict to the zygote's pipe; the candidate reaches it only through the call and reply
pipes. Pytest-style tasks go to `posttrain_pytest_judge` (bound read-only at
`mounts.JUDGE_LIB`), which is handed this module for the names it uses: `encode`, `decode`,
`read_frame`, `_write_all`, `_verdict`, `CandidateGone`, `CandidateRaised`, `JUDGE_DIR`.
"""

from __future__ import annotations

import json
import marshal
import os
import signal
import struct
import sys

from . import kernel
from .mounts import JUDGE_DIR, JUDGE_LIB  # noqa: F401  JUDGE_DIR: for posttrain_pytest_judge
from .wire import MAX_FRAME, _read_exact, _write_all, decode, encode, read_frame, write_frame


class CandidateGone(BaseException):
    """The candidate stopped answering (exited, was killed, sent garbage). BaseException so that
    a test's ``except Exception`` cannot swallow it."""


class CandidateRaised(Exception):
    """The candidate raised; ``exc_name`` is its exception's class name."""

    exc_name = "Exception"


def _raised(name: str, text: str) -> BaseException:
    """An exception the test can catch by its builtin type, still marked as the candidate's."""
    import builtins

    if name in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        return CandidateGone(f"candidate raised {name}")
    base = getattr(builtins, name, None)
    cls = CandidateRaised
    if isinstance(base, type) and issubclass(base, Exception):
        try:
            cls = type(name, (base, CandidateRaised), {"exc_name": name})
        except TypeError:  # layout conflict with some builtin exceptions
            pass
    e = cls(f"{name}: {text}")
    e.exc_name = name
    return e


def _make_proxy(call_fd: int, reply_fd: int, counter: list):
    """The ``candidate`` the tests call. Arguments go out tagged (`encode`) and marshalled (the
    candidate only reads what the judge wrote); answers come back as JSON, parsed and decoded
    strictly, since the candidate wrote them."""

    def candidate(*args, **kwargs):
        counter[0] += 1
        try:
            _write_all(call_fd, marshal.dumps({"args": encode(list(args)), "kwargs": encode(dict(kwargs))}))
        except BrokenPipeError:
            raise CandidateGone("candidate exited") from None
        try:
            reply = read_frame(reply_fd)
        except ValueError as e:
            raise CandidateGone(f"bad reply: {e}") from None
        if reply is None:
            raise CandidateGone("candidate exited before returning")
        if type(reply) is dict and "ok" in reply:
            try:
                return decode(reply["ok"])
            except ValueError as e:
                raise CandidateGone(f"bad reply: {e}") from None
        if type(reply) is dict and "exc" in reply:
            raise _raised(str(reply["exc"]), str(reply.get("msg", "")))
        raise CandidateGone("bad reply")

    return candidate


def verdict(cls: str, reason: str = "", detail: str = "") -> dict:
    return {"cls": cls, "reason": reason, "detail": detail[:500]}


# (source, name) -> code object, least recently used first. In RL a task's tests come back once
# per sample, and compiling them costs more than running them; sources above 16 MiB in total
# push the oldest out.
_CODE: dict = {}
_CODE_CHARS = [0]


def _compiled(source: str, name: str):
    key = (source, name)
    code = _CODE.pop(key, None)
    if code is None:
        code = compile(source, name, "exec", dont_inherit=True)
        _CODE_CHARS[0] += len(source)
        while _CODE and _CODE_CHARS[0] > 16 << 20:
            _CODE_CHARS[0] -= len(next(iter(_CODE))[0])
            del _CODE[next(iter(_CODE))]
    _CODE[key] = code  # reinserted: now the most recently used
    return code


def run_task(msg: dict, call_fd: int, reply_fd: int) -> dict:
    """Run the prelude and ``check(candidate)`` against the proxy; return the verdict. Pytest-style
    tasks go to `pytest_judge` (bound into the sandbox next to the pytest library)."""
    if msg.get("mode") == "pytest":
        try:
            import posttrain_pytest_judge
        except ImportError as e:
            return verdict("INFRA_FAIL", "sandbox", f"pytest is not available in the sandbox: {e}")
        return posttrain_pytest_judge.run(msg, call_fd, reply_fd, sys.modules[__name__])
    ns = {"__name__": "__judge__"}
    try:
        exec(_compiled(msg.get("prelude") or "", "<prelude>"), ns)
        exec(_compiled(msg["tests"], "<tests>"), ns)
        check = ns["check"]
    except BaseException as e:
        return verdict("TASK_FAIL", "bad_test", f"tests do not load: {type(e).__name__}: {e}")
    try:
        first = read_frame(reply_fd)
    except ValueError:
        first = None
    if first is None:
        return verdict("MODEL_FAIL", "no_verdict", "program exited while loading")
    if "exc" in first:
        name = str(first["exc"])
        reason = {"MemoryError": "memory", "SystemExit": "no_verdict"}.get(name, "runtime_error")
        return verdict("MODEL_FAIL", reason, f"loading the program raised {name}: {first.get('msg')}")
    calls = [0]
    proxy = _make_proxy(call_fd, reply_fd, calls)
    ns[msg["entry_point"]] = proxy  # tests that call the function by name reach the candidate too
    try:
        check(proxy)
    except CandidateGone as e:
        return verdict("MODEL_FAIL", "no_verdict", str(e))
    except CandidateRaised as e:
        reason = "memory" if e.exc_name == "MemoryError" else "runtime_error"
        return verdict("MODEL_FAIL", reason, str(e))
    except AssertionError as e:
        return verdict("MODEL_FAIL", "wrong_answer", f"assertion failed after {calls[0]} calls {e}")
    except TimeoutError as e:  # the tests' own limit on a call (evalplus' per-input limits)
        return verdict("MODEL_FAIL", "timeout", f"after {calls[0]} calls: {e}")
    except BaseException as e:
        return verdict("MODEL_FAIL", "wrong_answer", f"test raised {type(e).__name__}: {e}")
    return verdict("PASS", "", f"{calls[0]} calls")


_WATCHED_SIGNALS = ("SIGALRM", "SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGUSR1", "SIGUSR2",
                    "SIGXCPU", "SIGVTALRM", "SIGPROF", "SIGHUP")


def _judge_state():
    """What a task's code could leave behind in the judge, to compare after each task."""
    import builtins
    import gc

    sigs = tuple(signal.getsignal(getattr(signal, name)) for name in _WATCHED_SIGNALS)
    return (dict(builtins.__dict__), dict(sys.modules), sys.getrecursionlimit(), list(sys.path),
            list(sys.meta_path), list(sys.path_hooks), sys.stdin, sys.stdout, sys.stderr,
            sys.gettrace(), sys.getprofile(), gc.isenabled(), dict(os.environ), os.getcwd(),
            _umask(), sigs, sorted(os.listdir("/proc/self/fd")), os.listdir("/proc/self/task"))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _same_state(before) -> bool:
    timers = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    if signal.alarm(0) or any(signal.getitimer(t)[0] for t in timers):
        return False
    now = _judge_state()
    b0, m0, b1, m1 = before[0], before[1], now[0], now[1]
    if b0.keys() != b1.keys() or any(b1[k] is not v for k, v in b0.items()):
        return False
    if any(m1.get(k) is not v for k, v in m0.items()):  # new imports are fine, replaced ones not
        return False
    return before[2:] == now[2:]


def _recv_task(sock):
    """One task from the zygote: (message, [call_fd, reply_fd]), or None at the end."""
    import socket

    head, fds, flags, _ = socket.recv_fds(sock, 4, 2)
    if not head:
        return None
    if flags & socket.MSG_CTRUNC or len(fds) != 2:
        raise OSError("task arrived without its two pipes")
    if len(head) < 4:
        head += _read_exact(sock.fileno(), 4 - len(head)) or b""
    (n,) = struct.unpack(">I", head)
    body = _read_exact(sock.fileno(), n) if n <= MAX_FRAME else None
    if body is None:
        raise OSError("task frame cut short")
    return json.loads(body), fds


def judge_main(cfg: dict, sock_fd: int, result_w: int) -> None:
    """The judge's loop: one task per message, a verdict per task, until told to stop."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        kernel.libc().prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        kernel.place_fds([sock_fd, result_w])  # socket=3, result=4
        kernel.set_limits(cfg, cpu_s=None, nproc=cfg["nproc"])  # CPU: a budget per task, below
        kernel.drop_to(cfg["judge_uid"])
        kernel.install_filter()
        os.chdir("/")
        if os.path.isdir(JUDGE_LIB) and JUDGE_LIB not in sys.path:
            sys.path.append(JUDGE_LIB)  # pytest and pytest_judge (the zygote has loaded them already)
        import resource
        import socket

        sock = socket.socket(fileno=3)
        before = _judge_state()
    except BaseException:
        os._exit(70)
    while True:
        try:
            task = _recv_task(sock)
        except (OSError, ValueError):
            os._exit(70)
        if task is None:
            os._exit(0)
        msg, (call_fd, reply_fd) = task
        ru = resource.getrusage(resource.RUSAGE_SELF)
        budget = int(ru.ru_utime + ru.ru_stime + float(msg["timeout_s"])) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (budget, resource.RLIM_INFINITY))
        if "random" in sys.modules:  # each task a fresh generator, whatever the last one seeded
            sys.modules["random"].seed()
        result = run_task(msg, call_fd, reply_fd)
        os.close(call_fd), os.close(reply_fd)
        clean = _same_state(before)
        result["retire"] = not clean
        write_frame(4, result)
        if not clean:
            os._exit(0)


class Judge:
    """Zygote-side ends of the judge: a socket for tasks (with the candidate's pipes attached)
    and a pipe for verdicts."""

    def __init__(self, cfg: dict):
        import socket

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.res_r, res_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                judge_main(cfg, theirs.fileno(), res_w)
            finally:
                os._exit(71)
        theirs.close()
        os.close(res_w)
        self.sock = mine

    def send(self, msg: dict, fds: list[int]) -> None:
        import socket

        data = json.dumps(msg, separators=(",", ":")).encode()
        frame = struct.pack(">I", len(data)) + data
        sent = socket.send_fds(self.sock, [frame], fds)
        if sent < len(frame):
            self.sock.sendall(frame[sent:])

    def close(self) -> None:
        self.sock.close()
        os.close(self.res_r)


_verdict = verdict  # the name `posttrain_pytest_judge` calls (with `JUDGE_DIR`, imported above)
