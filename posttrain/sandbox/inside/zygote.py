"""The zygote: the process that lives inside one bubblewrap sandbox, talks to the host, and
keeps the forker and the judge.

Loaded by `posttrain.sandbox.worker.BOOT` under the system interpreter
(``/usr/bin/python3.11 -I -S``) from code objects the host compiled (or from this package's
sources where the interpreters' versions differ), with ``CONFIG_JSON`` as its argument.

The zygote (root inside the sandbox, holding only CAP_SETUID, CAP_SETGID, CAP_KILL,
CAP_SYS_ADMIN, and for the overlay's layers CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_CHOWN) owns
the sandbox's ``/tmp`` and ``/dev/shm`` (`mounts`). It talks to the host, watches the clock and
the output, and keeps two helpers: the `forker`, which forks one fresh `candidate` per
program, and the `judge`, which computes the verdict of function-call and pytest-style tasks.
It never runs the program's code, and reads from the candidate only its output (counted and
capped) and, through the forker, its exit status.

After each program the zygote sends SIGKILL to every process in the sandbox's PID namespace but
itself, the forker, the judge and the namespace's init, which reaches children that called
``setsid`` or double-forked. If the program touched ``/tmp`` or ``/dev/shm`` (the zygote stamps
each fresh mount's root with mtime 0, which only the mount's owner can set back), that mount is
replaced by a fresh one, so nothing a program writes reaches the next. This replaces a mount
namespace per program, which cost more than the rest of a short program together.
"""

from __future__ import annotations

import errno
import json
import marshal
import os
import select
import signal
import struct
import sys
import time

from . import candidate, forker, judge, kernel, mounts
from .mounts import JUDGE_LIB
from .wire import decode, encode, read_frame, write_frame

# Imported by the zygote before it forks: tests and solutions import these often, and an import
# in every fresh child would cost more than the whole program.
WARM_MODULES = ("math", "random", "re", "collections", "itertools", "functools", "string",
                "hashlib", "heapq", "bisect", "copy", "fractions", "decimal", "statistics",
                "typing", "traceback", "threading", "operator", "array", "datetime")


_STATE: dict = {"cand": None, "judge": None, "forker": None}


def _retire_judge() -> None:
    """Kill the judge (mid-task, or it left state behind); a fresh one is forked after the reply."""
    j = _STATE["judge"]
    if j is not None:
        _STATE["judge"] = None
        try:
            os.kill(j.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        j.close()


def _send_program(cand: candidate.Cand, msg: dict) -> None:
    """Send the program once the candidate has announced that its sandbox is built."""
    if not select.select([cand.err_r], [], [], 5.0)[0]:
        raise OSError("candidate setup timed out")
    line = os.read(cand.err_r, 64)
    if line != b"ready\n":
        raise OSError(f"candidate setup failed: {line[:60]!r}")
    data = marshal.dumps(msg)  # zygote to candidate only: never parsed on a trusted side
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(cand.ctl_w, data):]
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
    """Reap candidate ``pid`` if it has exited; (wait status, whether it used up its CPU limit)."""
    got, status, used = _STATE["forker"].wait(pid, block=False)
    if got <= 0:
        return None, False
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return status, sig == signal.SIGXCPU or (sig == signal.SIGKILL and used >= cpu_limit - 0.05)


def _judge_died() -> dict:
    """The judge closed its verdict pipe without a verdict: out of CPU, or a broken machine."""
    j = _STATE["judge"]
    _retire_judge()
    try:
        _, status = os.waitpid(j.pid, 0)
    except ChildProcessError:
        status = None
    if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return judge.verdict("MODEL_FAIL", "timeout", "the tests ran out of CPU time")
    return {"infra": f"judge died without a verdict (status {status})"}


def _run_func(cfg: dict, cand: candidate.Cand, req: dict) -> dict:
    _send_program(cand, {"mode": req["mode"], "program": req["program"], "module": req.get("module"),
                         "entry_point": req.get("entry_point"), "timeout_s": req["timeout_s"]})
    j = _STATE["judge"]
    if j is None:  # it died between tasks (it closes every descriptor but its own two)
        j = _STATE["judge"] = judge.Judge(cfg)
    j.send({k: req.get(k) for k in ("mode", "prelude", "tests", "entry_point", "module", "timeout_s",
                                        "output_limit")},
               cand.give_pipes())
    outs = {cand.out_r: bytearray(), cand.err_r: bytearray()}
    why = _pump(outs, req["output_limit"], time.monotonic() + req["timeout_s"], j.res_r)
    if why != "stop":
        _retire_judge()  # it is mid-task: its state, and any verdict it would send, are stale
        if why == "timeout":
            return judge.verdict("MODEL_FAIL", "timeout", f"no verdict within {req['timeout_s']} s")
        return judge.verdict("MODEL_FAIL", "output_limit", f"printed over {req['output_limit']} bytes")
    try:
        verdict = read_frame(j.res_r)
    except ValueError:
        verdict = None
    if verdict is None:
        return _judge_died()
    if verdict.pop("retire", True):
        _retire_judge()
    if verdict["cls"] == "MODEL_FAIL" and verdict["reason"] == "no_verdict":
        time.sleep(0.002)  # let a dying candidate finish so its rusage is final
        _, cpu_out = _cpu_timeout(cand.pid, min(cfg["cpu_s"], int(req["timeout_s"]) + 1))
        if cpu_out:
            return judge.verdict("MODEL_FAIL", "timeout", "the program ran out of CPU time")
    stderr = bytes(outs[cand.err_r][-300:]).decode(errors="replace")
    if stderr and verdict["cls"] != "PASS":
        verdict["detail"] = (verdict["detail"] + " | stderr: " + stderr)[:800]
    return verdict


def _run_io_case(cfg: dict, cand: candidate.Cand, req: dict, stdin: str) -> dict:
    """One stdin: run the program, return its status and stdout (compared by the host). A
    request naming a ``tree`` gets it at `TREE_DIR` first, with its ``hidden`` files placed
    read-only (`mounts.place_hidden`) before the program can run."""
    tree = mounts.mount_tree(req["tree"]) if req.get("tree") else None
    if tree:
        mounts.place_hidden(req.get("hidden") or {})
    case = _run_case(cfg, cand, req, stdin)
    if tree:
        case["tree"] = tree
    return case


def _run_case(cfg: dict, cand: candidate.Cand, req: dict, stdin: str) -> dict:
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
    kind = {0: "ok", candidate.EXIT_MEMORY: "memory"}.get(code, "runtime_error")
    return {"status": kind, "stdout": stdout if kind == "ok" else "", "stderr": stderr, "code": code}


def _kill_others() -> None:
    """SIGKILL every process in this PID namespace except its init, us and the judge.

    Passes over /proc repeat until one finds nobody new: a process forked while a pass ran is
    caught by the next, and a process with SIGKILL pending cannot fork. Dying processes are
    reaped later (a tmpfs or socket teardown can take a while, and waiting here would only cost
    throughput): the SIGKILL is already pending, so they cannot run another instruction."""
    keep = {1, os.getpid(), _STATE["forker"].pid}
    if _STATE["judge"] is not None:
        keep.add(_STATE["judge"].pid)
    killed: set[int] = set()
    while True:
        fresh = False
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in keep and int(name) not in killed:
                try:
                    os.kill(int(name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.add(int(name))
                fresh = True
        if not fresh:
            break
    _reap()


def _reap() -> None:
    while True:
        try:
            pid = os.waitpid(-1, os.WNOHANG)[0]
        except ChildProcessError:
            return
        if pid == 0:
            return
        if _STATE["judge"] is not None and pid == _STATE["judge"].pid:  # died between tasks
            _STATE["judge"].close()
            _STATE["judge"] = None
        if pid == _STATE["forker"].pid:  # nothing can be run without it: the host replaces us
            raise SystemExit("the forker died")


def _next(cfg: dict) -> None:
    """Clean up after a program and make the next one ready: kill what is left of it, give
    touched mounts a fresh tmpfs, make sure a judge runs, and pre-fork the next candidate."""
    if _STATE["cand"] is not None:
        _STATE["cand"].close()
        _STATE["cand"] = None
    _kill_others()
    mounts.unmount_tree()
    mounts.fresh_tmpfs(cfg)
    mounts.judge_tmpfs(cfg, force=False)  # after a pytest-style task: a fresh /judge for the next
    if _STATE["judge"] is None:
        _STATE["judge"] = judge.Judge(cfg)
    for wait in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, None):
        try:
            _STATE["cand"] = candidate.Cand(_STATE["forker"])
            return
        except OSError as e:  # the pids cgroup still counts the last program's dying processes
            if e.errno != errno.EAGAIN or wait is None:
                raise
            time.sleep(wait)
            _reap()


def _handle(cfg: dict, req: dict) -> dict:
    """Judge one request. A function-call run leaves its processes for the caller to clean up
    after the reply is sent, which takes the cleanup off the critical path."""
    if req["mode"] in ("func", "pytest"):
        return _run_func(cfg, _STATE["cand"], req)
    cases = []
    for stdin in req["stdins"]:
        try:
            case = _run_io_case(cfg, _STATE["cand"], req, stdin)
        finally:
            _next(cfg)
        cases.append(case)
        if case["status"] != "ok":
            break  # the first failing case decides; the rest would only cost time
    return {"cases": cases}


def _warm_up() -> None:
    """Do once, in the zygote, the first-use work its children would otherwise each repeat."""
    # CPython builds parts of its compiler's state on first use; a child that did that itself
    # would pay for it in page faults (more than for the rest of a short program).
    with open(f"{mounts.BOX_DIR}/warm.py") as f:
        ns = {"__name__": "__warm__"}
        exec(compile(f.read(), "<warm>", "exec", dont_inherit=True), ns)
    ns["exercise"]()
    lib = kernel.libc()
    lib.prctl(kernel.PR_GET_SECCOMP, 0, 0, 0, 0), lib.fork, lib.mount, lib.umount2  # resolved once
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    encode([1, 2.5, "x", (None, True), {1: b""}]), decode(encode({"k": [1, {2}]}))
    marshal.loads(marshal.dumps({"mode": "func", "program": "x", "timeout_s": 1.0}))


def _warm_judge_lib() -> None:
    if not os.path.isdir(JUDGE_LIB):
        return
    sys.path.append(JUDGE_LIB)
    try:
        import posttrain_pytest_judge

        posttrain_pytest_judge.warm()
    except ImportError:  # the judge says so on the first pytest-style task (INFRA_FAIL)
        pass


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[1])
    if cfg.get("cpu") is not None:  # first, so that every process forked from here inherits it
        try:
            os.sched_setaffinity(0, {cfg["cpu"]})
        except OSError:  # the CPU went away since the host looked: run unpinned
            pass
    import ctypes, resource, socket  # noqa: E401,F401  imported once here so each fork starts warm

    kernel.libc()
    kernel.prepare_filter(cfg["seccomp"])
    for name in WARM_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    _warm_up()
    import gc

    gc.collect()
    gc.freeze()  # children's collections skip the zygote's objects: fewer copy-on-write faults
    inp, out = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0), os.dup2(null, 1)
    mounts.fresh_tmpfs(cfg, force=True)
    mounts.judge_tmpfs(cfg)
    _STATE["forker"] = forker.Forker(cfg)
    _warm_judge_lib()  # after the forker: programs fork from it, so pytest stays out of their memory
    _next(cfg)
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
            reply = _handle(cfg, req)
        except Exception as e:  # a broken pipe or a failed fork here is the machine's fault
            reply = {"infra": f"{type(e).__name__}: {e}"}
            _retire_judge()
            req["mode"] = "func"  # forces a cleanup below
        reply["time_s"] = round(time.monotonic() - t0, 6)
        write_frame(out, reply)
        if req["mode"] != "io":
            _next(cfg)

