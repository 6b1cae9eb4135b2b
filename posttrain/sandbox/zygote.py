"""The process that lives inside one bubblewrap sandbox and forks a fresh child per program.

Standard library only: it runs under the system interpreter (``/usr/bin/python3.11 -I -S``) as
``python zygote.py CONFIG_JSON`` and is also imported by the host for the wire format
(:func:`write_frame`, :func:`read_frame`, :func:`encode`, :func:`decode`); importing it has no
side effects.

Per program the zygote (root inside the sandbox, holding only CAP_SETUID, CAP_SETGID, CAP_KILL
and CAP_SYS_ADMIN) uses two children:

- the **candidate** runs the untrusted program. It is forked *before* the request is read, so the
  tests and expected outputs never exist in its address space. It unshares a mount namespace,
  mounts its own size-capped tmpfs on ``/tmp`` and ``/dev/shm`` (gone when it dies), sets its
  rlimits, drops to an unprivileged uid (all capabilities go with it), and only then receives
  the program.
- the **judge** (function-call tasks) runs the task's prelude and ``check(candidate)`` as a
  second uid, with ``candidate`` a proxy that ships each call's arguments to the candidate and
  decodes the answer as strictly typed data. The verdict is computed here, never in the
  candidate, so custom ``__eq__``, patched builtins, stack walking or an early exit in the
  candidate cannot produce a pass.

After each program the zygote sends SIGKILL to every other process in the sandbox's PID
namespace (``kill(-1)``), which reaches children that called ``setsid`` or double-forked.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import sys
import time

MAX_FRAME = 64 << 20
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 1 << 14, 1 << 18, 2, 4
EXIT_MEMORY = 3  # the candidate's wrapper exits with this after a MemoryError
PR_SET_PDEATHSIG = 1
# Imported by the zygote before it forks: tests and solutions import these often, and an import
# in every fresh child would cost more than the whole program.
WARM_MODULES = ("math", "random", "re", "collections", "itertools", "functools", "string",
                "hashlib", "heapq", "bisect", "copy", "fractions", "decimal", "statistics",
                "typing", "traceback", "threading", "operator", "array", "datetime")


# ----------------------------------------------------------------------------- wire format
def write_frame(fd: int, obj) -> None:
    """Send one length-prefixed JSON message."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    data = struct.pack(">I", len(data)) + data
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


# ----------------------------------------------------------------------------- the candidate
_LIBC = []


def _libc():
    if not _LIBC:  # loaded once in the zygote, before any fork
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _private_tmpfs(cfg: dict) -> None:
    """New mount namespace with fresh size-capped tmpfs on /tmp and /dev/shm."""
    import ctypes

    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount private /")
    opts = f"size={cfg['tmpfs_mb']}m,nr_inodes=4096,mode=1777".encode()
    for where in (b"/tmp", b"/dev/shm"):
        if libc.mount(b"tmpfs", where, b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs {where!r}")


def _set_limits(cfg: dict, cpu_s: int, nproc: int) -> None:
    import resource as r

    mem = cfg["memory_mb"] << 20
    for lim, val in ((r.RLIMIT_AS, mem), (r.RLIMIT_CPU, cpu_s), (r.RLIMIT_NPROC, nproc),
                     (r.RLIMIT_FSIZE, cfg["file_mb"] << 20), (r.RLIMIT_NOFILE, 64),
                     (r.RLIMIT_CORE, 0)):
        hard = val + 1 if lim == r.RLIMIT_CPU else val  # soft CPU limit sends SIGXCPU first
        r.setrlimit(lim, (val, hard))


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from uid 0 to non-zero: permitted and effective capabilities are cleared
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("uid drop did not take")


def _place_fds(fds: list[int]) -> None:
    """Move fds to 3, 4, ... in order and close everything else from there on."""
    tmp = [os.dup(fd) for fd in fds]
    for i, fd in enumerate(tmp):
        os.dup2(fd, 3 + i)
    os.closerange(3 + len(fds), 1 << 16)


def candidate_main(cfg: dict, ctl_r: int, out_w: int, err_w: int, call_r: int, reply_w: int) -> None:
    """Child side: isolate, wait for the program, run it. Never returns."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # under memory pressure the cgroup kills a candidate, not the zygote
        _private_tmpfs(cfg)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0), os.dup2(out_w, 1), os.dup2(err_w, 2)
        _place_fds([ctl_r, call_r, reply_w])  # ctl=3, call=4, reply=5
        _set_limits(cfg, cpu_s=cfg["cpu_s"], nproc=cfg["nproc"])
        _drop_to(cfg["candidate_uid"])
        os.chdir("/tmp")
        os.write(2, b"ready\n")
    except BaseException as e:  # the sandbox could not be built: the zygote reports INFRA_FAIL
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(70)
    msg = read_frame(3)
    os.close(3)
    if msg is None:
        os._exit(0)
    import resource

    cpu = int(msg["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, cfg["cpu_s"]), min(cpu, cfg["cpu_s"]) + 1))
    if msg["mode"] == "io":
        _child_io(msg)
    _child_func(msg)


def _child_io(msg: dict) -> None:
    fd = os.memfd_create("stdin")
    os.write(fd, msg["stdin"].encode())
    os.lseek(fd, 0, 0)
    os.dup2(fd, 0), os.close(fd)
    os.close(4), os.close(5)
    code = 0
    try:
        exec(compile(msg["program"], "<program>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        code = 1 if code == EXIT_MEMORY else code  # the program's own exit(3) is not a memory verdict
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
    except BaseException:
        code = code or 1
    os._exit(code & 0xFF)


def _child_func(msg: dict) -> None:
    ns = {"__name__": "__candidate__"}
    try:
        exec(compile(msg["program"], "<program>", "exec"), ns)
        fn = ns[msg["entry_point"]]
        if not callable(fn):
            raise TypeError(f"{msg['entry_point']} is not callable")
        write_frame(5, {"ready": True})
    except BaseException as e:
        write_frame(5, {"exc": type(e).__name__, "msg": str(e)[:300]})
        os._exit(EXIT_MEMORY if isinstance(e, MemoryError) else 1)
    while True:
        call = read_frame(4)
        if call is None:
            os._exit(0)
        try:
            args, kwargs = decode(call["args"]), decode(call["kwargs"])
            reply = {"ok": encode(fn(*args, **kwargs))}
        except BaseException as e:
            reply = {"exc": type(e).__name__, "msg": str(e)[:300]}
        write_frame(5, reply)


# ----------------------------------------------------------------------------- the judge
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
    def candidate(*args, **kwargs):
        counter[0] += 1
        try:
            write_frame(call_fd, {"args": encode(list(args)), "kwargs": encode(dict(kwargs))})
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


def _verdict(cls: str, reason: str = "", detail: str = "") -> dict:
    return {"cls": cls, "reason": reason, "detail": detail[:500]}


def judge(msg: dict, call_fd: int, reply_fd: int) -> dict:
    """Run the prelude and ``check(candidate)`` against the proxy; return the verdict."""
    ns = {"__name__": "__judge__"}
    try:
        exec(compile(msg.get("prelude") or "", "<prelude>", "exec"), ns)
        exec(compile(msg["tests"], "<tests>", "exec"), ns)
        check = ns["check"]
    except BaseException as e:
        return _verdict("TASK_FAIL", "bad_test", f"tests do not load: {type(e).__name__}: {e}")
    try:
        first = read_frame(reply_fd)
    except ValueError:
        first = None
    if first is None:
        return _verdict("MODEL_FAIL", "no_verdict", "program exited while loading")
    if "exc" in first:
        name = str(first["exc"])
        reason = {"MemoryError": "memory", "SystemExit": "no_verdict"}.get(name, "runtime_error")
        return _verdict("MODEL_FAIL", reason, f"loading the program raised {name}: {first.get('msg')}")
    calls = [0]
    proxy = _make_proxy(call_fd, reply_fd, calls)
    ns[msg["entry_point"]] = proxy  # tests that call the function by name reach the candidate too
    try:
        check(proxy)
    except CandidateGone as e:
        return _verdict("MODEL_FAIL", "no_verdict", str(e))
    except CandidateRaised as e:
        reason = "memory" if e.exc_name == "MemoryError" else "runtime_error"
        return _verdict("MODEL_FAIL", reason, str(e))
    except AssertionError as e:
        return _verdict("MODEL_FAIL", "wrong_answer", f"assertion failed after {calls[0]} calls {e}")
    except BaseException as e:
        return _verdict("MODEL_FAIL", "wrong_answer", f"test raised {type(e).__name__}: {e}")
    return _verdict("PASS", "", f"{calls[0]} calls")


def judge_main(cfg: dict, msg: dict, call_w: int, reply_r: int, result_w: int) -> None:
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _place_fds([call_w, reply_r, result_w])  # call=3, reply=4, result=5
        _set_limits(cfg, cpu_s=int(msg["timeout_s"]) + 1, nproc=cfg["nproc"])
        _drop_to(cfg["judge_uid"])
    except BaseException:
        os._exit(70)
    write_frame(5, judge(msg, 3, 4))
    os._exit(0)


# ----------------------------------------------------------------------------- the zygote
class _Cand:
    """Zygote-side ends of one pre-forked candidate."""

    def __init__(self, cfg: dict):
        ctl_r, self.ctl_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        call_r, self.call_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                candidate_main(cfg, ctl_r, out_w, err_w, call_r, reply_w)
            finally:
                os._exit(71)  # never fall back into the zygote's loop
        for fd in (ctl_r, out_w, err_w, call_r, reply_w):
            os.close(fd)
        self.fds = [self.ctl_w, self.out_r, self.err_r, self.call_w, self.reply_r]

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def _send_program(cand: _Cand, msg: dict) -> None:
    """Send the program once the candidate has announced that its sandbox is built."""
    if not select.select([cand.err_r], [], [], 5.0)[0]:
        raise OSError("candidate setup timed out")
    line = os.read(cand.err_r, 64)
    if line != b"ready\n":
        raise OSError(f"candidate setup failed: {line[:60]!r}")
    write_frame(cand.ctl_w, msg)
    os.close(cand.ctl_w)
    cand.fds.remove(cand.ctl_w)


def _pump(fds: dict, limit: int, deadline: float, stop_fd: int) -> str:
    """Read output pipes until ``stop_fd`` is readable, the deadline passes or output overflows.

    ``fds`` maps fd -> bytearray. Returns "stop", "timeout" or "output_limit"."""
    open_fds = set(fds) | {stop_fd}
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        ready = select.select(list(open_fds), [], [], left)[0]
        for fd in ready:
            if fd == stop_fd:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
            fds[fd] += chunk
            if sum(len(b) for b in fds.values()) > limit:
                return "output_limit"
        if stop_fd in ready:
            return "stop"


def _drain(fds: dict, limit: int) -> bool:
    """Read what is already buffered; True if output went over the limit."""
    for fd in fds:
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            fds[fd] += chunk
            if sum(len(b) for b in fds.values()) > limit:
                return True
    return False


def _cpu_timeout(pid: int, cpu_limit: float) -> tuple[int | None, bool]:
    """Reap ``pid`` if it has exited; return (wait status, whether it used up its CPU limit)."""
    try:
        got, status, ru = os.wait4(pid, os.WNOHANG)
    except ChildProcessError:
        return None, False
    if got == 0:
        return None, False
    used = ru.ru_utime + ru.ru_stime
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return status, sig == signal.SIGXCPU or (sig == signal.SIGKILL and used >= cpu_limit - 0.05)


def _run_func(cfg: dict, cand: _Cand, req: dict) -> dict:
    _send_program(cand, {"mode": "func", "program": req["program"],
                         "entry_point": req["entry_point"], "timeout_s": req["timeout_s"]})
    res_r, res_w = os.pipe()
    jpid = os.fork()
    if jpid == 0:
        try:
            judge_main(cfg, req, cand.call_w, cand.reply_r, res_w)
        finally:
            os._exit(71)
    os.close(res_w)
    for fd in (cand.call_w, cand.reply_r):
        os.close(fd)
        cand.fds.remove(fd)
    outs = {cand.out_r: bytearray(), cand.err_r: bytearray()}
    try:
        why = _pump(outs, req["output_limit"], time.monotonic() + req["timeout_s"], res_r)
        if why == "timeout":
            return _verdict("MODEL_FAIL", "timeout", f"no verdict within {req['timeout_s']} s")
        if why == "output_limit":
            return _verdict("MODEL_FAIL", "output_limit", f"printed over {req['output_limit']} bytes")
        try:
            verdict = read_frame(res_r)
        except ValueError:
            verdict = None
    finally:
        os.close(res_r)
    if verdict is None:  # the judge died: a CPU-bound test answer or a broken machine
        status, cpu_out = _cpu_timeout(jpid, req["timeout_s"] + 1)
        if cpu_out:
            return _verdict("MODEL_FAIL", "timeout", "the tests ran out of CPU time")
        return {"infra": f"judge died without a verdict (status {status})"}
    if verdict["cls"] == "MODEL_FAIL" and verdict["reason"] == "no_verdict":
        time.sleep(0.002)  # let a dying candidate finish so its rusage is final
        _, cpu_out = _cpu_timeout(cand.pid, min(cfg["cpu_s"], int(req["timeout_s"]) + 1))
        if cpu_out:
            return _verdict("MODEL_FAIL", "timeout", "the program ran out of CPU time")
    stderr = bytes(outs[cand.err_r][-300:]).decode(errors="replace")
    if stderr and verdict["cls"] != "PASS":
        verdict["detail"] = (verdict["detail"] + " | stderr: " + stderr)[:800]
    return verdict


def _run_io_case(cfg: dict, cand: _Cand, req: dict, stdin: str) -> dict:
    """One stdin: run the program, return its status and stdout (compared by the host)."""
    _send_program(cand, {"mode": "io", "program": req["program"], "stdin": stdin,
                         "timeout_s": req["timeout_s"]})
    pidfd = os.pidfd_open(cand.pid)
    outs = {cand.out_r: bytearray(), cand.err_r: bytearray()}
    limit = req["output_limit"]
    try:
        why = _pump(outs, limit, time.monotonic() + req["timeout_s"], pidfd)
        if why == "stop" and _drain(outs, limit):
            why = "output_limit"
    finally:
        os.close(pidfd)
    stdout = bytes(outs[cand.out_r]).decode(errors="replace")
    stderr = bytes(outs[cand.err_r][-300:]).decode(errors="replace")
    if why != "stop":
        return {"status": why, "stdout": "", "stderr": stderr}
    status, cpu_out = _cpu_timeout(cand.pid, min(cfg["cpu_s"], int(req["timeout_s"]) + 1))
    if cpu_out:
        return {"status": "timeout", "stdout": "", "stderr": stderr}
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else -1
    kind = {0: "ok", EXIT_MEMORY: "memory"}.get(code, "runtime_error")
    return {"status": kind, "stdout": stdout if kind == "ok" else "", "stderr": stderr, "code": code}


def _kill_all_but_me() -> None:
    """SIGKILL every process in this PID namespace except pid 1 and us, and reap what is dead.

    Children still tearing down (a mount namespace's teardown waits for an RCU grace period,
    several ms) are reaped on a later call: the SIGKILL is already pending, so they cannot run
    another instruction of their own, and waiting here would only cost throughput."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap()


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _fresh(cfg: dict, state: dict) -> None:
    state["cand"].close()
    _kill_all_but_me()
    state["cand"] = _Cand(cfg)


def _handle(cfg: dict, req: dict, state: dict) -> dict:
    """Judge one request. A function-call run leaves its processes for the caller to clean up
    after the reply is sent, which takes the cleanup off the critical path."""
    if req["mode"] == "func":
        return _run_func(cfg, state["cand"], req)
    cases = []
    for stdin in req["stdins"]:
        try:
            case = _run_io_case(cfg, state["cand"], req, stdin)
        finally:
            _fresh(cfg, state)
        cases.append(case)
        if case["status"] != "ok":
            break  # the first failing case decides; the rest would only cost time
    return {"cases": cases}


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[1])
    import ctypes, resource  # noqa: E401,F401  imported once here so each fork starts warm

    _libc()
    for name in WARM_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    import gc

    gc.collect()
    gc.freeze()  # children's collections skip the zygote's objects: fewer copy-on-write faults
    inp, out = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0), os.dup2(null, 1)
    state = {"cand": _Cand(cfg)}
    while True:
        while not select.select([inp], [], [], 0.05)[0]:
            _reap()  # while idle, collect the last program's dying processes (off the critical path)
        req = read_frame(inp)
        if req is None:
            return
        if req.get("op") == "ping":
            write_frame(out, {"pong": os.getpid()})
            continue
        t0 = time.monotonic()
        try:
            reply = _handle(cfg, req, state)
        except Exception as e:  # a broken pipe or a failed fork here is the machine's fault
            reply = {"infra": f"{type(e).__name__}: {e}"}
            req["mode"] = "func"  # forces a cleanup below
        reply["time_s"] = round(time.monotonic() - t0, 6)
        write_frame(out, reply)
        if req["mode"] == "func":
            _fresh(cfg, state)


if __name__ == "__main__":
    main(sys.argv)
