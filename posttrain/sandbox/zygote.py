"""The process that lives inside one bubblewrap sandbox and forks a fresh child per program.

Standard library only: it runs under the system interpreter (``/usr/bin/python3.11 -I -S``)
with ``CONFIG_JSON`` as its argument, loaded from a code object the host compiled (or from
this source where the interpreters' versions differ; see `worker.BOOT`), and is also imported
by the host for the wire format (:func:`write_frame`, :func:`read_frame`, :func:`encode`,
:func:`decode`); importing it has no side effects.

The zygote (root inside the sandbox, holding only CAP_SETUID, CAP_SETGID, CAP_KILL,
CAP_SYS_ADMIN, and for the overlay's layers CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_CHOWN) owns the sandbox's ``/tmp`` and ``/dev/shm``: size-capped
tmpfs it mounts itself, and the overlay a job's project tree is seen through (`_mount_tree`).
It talks to the host, watches the clock and the output, and keeps two helpers:

- the **forker** forks one fresh **candidate** process per program, which runs the untrusted
  program. The forker has already set the rlimits, the oom score and the seccomp filter, and
  kept only CAP_SETUID and CAP_SETGID, so a candidate inherits all of that; it only drops to
  an unprivileged uid (all capabilities go with it) and waits for its program. It is forked
  *before* the request is read, so the tests and expected outputs never exist in its address
  space. A separate forker keeps the zygote's own work off the fork path: after a fork, every
  page the parent writes costs a copy-on-write fault, and the forker's loop writes few.
- the **judge** (function-call tasks) runs each task's prelude and ``check(candidate)`` as a
  second uid, under the same filter, with ``candidate`` a proxy that ships each call's arguments
  to the candidate and decodes the answer as strictly typed data. The verdict is computed here,
  never in the candidate, so custom ``__eq__``, patched builtins, stack walking or an early exit
  in the candidate cannot produce a pass. The judge serves one task after another (it receives
  each candidate's pipes over a socket), which saves a fork per program; it runs each task in a
  fresh namespace with a freshly seeded ``random``, and it is replaced by a fresh one whenever a
  task leaves state behind (a thread, an open file, a changed builtin, ``sys.modules`` entry,
  ``sys.path``, recursion limit, signal handler, timer, umask, working directory or
  environment), times out, or is abandoned for any other reason. Attributes a task's code sets
  on an imported module (``math.pi = 3``) are not looked for: tests and preludes are the task's
  own trusted code, not the program's.

After each program the zygote sends SIGKILL to every process in the sandbox's PID namespace but
itself, the forker, the judge and the namespace's init, which reaches children that called
``setsid`` or double-forked. If the program touched ``/tmp`` or ``/dev/shm`` (the zygote stamps
each fresh mount's root with mtime 0, which only the mount's owner can set back), that mount is
replaced by a fresh one, so nothing a program writes reaches the next. This replaces a mount
namespace per program, which cost more than the rest of a short program together.

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

import errno
import json
import marshal
import os
import select
import signal
import struct
import sys
import time

MAX_FRAME = 64 << 20
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
EXIT_MEMORY = 3  # the candidate's wrapper exits with this after a MemoryError
PR_SET_PDEATHSIG, PR_GET_SECCOMP, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 21, 22, 2
TMPFS = ("/tmp", "/dev/shm")
JUDGE_LIB = "/sandbox/lib"  # read-only: the pytest library and `pytest_judge`, for the judge
SITE_DIR = "/sandbox/site"  # read-only: a virtual environment's site-packages, when the pool names one
JUDGE_DIR = "/judge"  # a tmpfs only the judge's uid can enter: where test modules are written
TREES_DIR = "/sandbox/trees"  # read-only: the host's project trees (`posttrain.sandbox.trees`)
TREE_DIR = "/tmp/work"  # where a job's tree is mounted (an overlay) or copied
LAYERS_DIR = "/tmp/.layers"  # the overlay's upper and work folders: only the zygote's uid enters
# Imported by the zygote before it forks: tests and solutions import these often, and an import
# in every fresh child would cost more than the whole program.
WARM_MODULES = ("math", "random", "re", "collections", "itertools", "functools", "string",
                "hashlib", "heapq", "bisect", "copy", "fractions", "decimal", "statistics",
                "typing", "traceback", "threading", "operator", "array", "datetime")


# ----------------------------------------------------------------------------- wire format
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps with options builds one per call


def write_frame(fd: int, obj) -> None:
    """Send one length-prefixed JSON message."""
    _write_all(fd, _ENCODER.encode(obj).encode())


def _write_all(fd: int, body: bytes) -> None:
    data = struct.pack(">I", len(body)) + body
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
_FILTER = []


def _libc():
    if not _LIBC:  # loaded once in the zygote, before any fork
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
        # fork through a PyDLL: the call keeps the GIL, so the child does not start by
        # re-acquiring it (fewer pages written in a fresh child).
        _LIBC.append(ctypes.PyDLL(None, use_errno=True).fork)
    return _LIBC[0]


def _fork() -> int:
    """fork(2) through the C library, without CPython's at-fork work.

    ``os.fork`` runs the interpreter's at-fork hooks (threading's, random's) and re-initialises
    its locks in the child; with a CPU bound pool, that work and the copy-on-write faults it
    causes cost more than a short program. It is safe to skip here: the forker runs a single
    thread and holds no lock while it forks, and every child leaves through ``os._exit``. The
    one hook whose effect matters, a fresh seed for ``random``, the candidate runs by hand when
    its program mentions ``random``."""
    _libc()
    pid = _LIBC[1]()
    if pid < 0:
        import ctypes

        raise OSError(ctypes.get_errno(), "fork")
    return pid


def _prepare_filter(bpf_hex: str) -> None:
    """Hold the filter as a ``struct sock_fprog`` in the zygote, so a child only calls prctl."""
    import ctypes

    bpf = bytes.fromhex(bpf_hex)
    if not bpf or len(bpf) % 8:
        raise ValueError("malformed seccomp filter")

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bpf, len(bpf))
    _FILTER[:] = [buf, SockFprog(len(bpf) // 8, ctypes.addressof(buf))]


def _install_filter() -> None:
    """Install the seccomp filter on this process (for good: it is inherited and never lifted)."""
    import ctypes

    libc = _libc()
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_FILTER[1]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    if libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != SECCOMP_MODE_FILTER:
        raise OSError("the seccomp filter is not in force")


def _set_limits(cfg: dict, cpu_s: int | None, nproc: int) -> None:
    import resource as r

    mem = cfg["memory_mb"] << 20
    limits = [(r.RLIMIT_AS, mem), (r.RLIMIT_NPROC, nproc), (r.RLIMIT_FSIZE, cfg["file_mb"] << 20),
              (r.RLIMIT_NOFILE, 64), (r.RLIMIT_CORE, 0)]
    if cpu_s is not None:
        limits.append((r.RLIMIT_CPU, cpu_s))
    for lim, val in limits:
        hard = val + 1 if lim == r.RLIMIT_CPU else val  # soft CPU limit sends SIGXCPU first
        r.setrlimit(lim, (val, hard))


def _drop_to(uid: int) -> None:
    """Drop to ``uid`` for real, effective and saved ids (each call raises if it fails)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from uid 0 to non-zero: permitted and effective capabilities are cleared


def _place_fds(fds: list[int]) -> None:
    """Move fds to 3, 4, ... in order and close everything else from there on."""
    tmp = [os.dup(fd) for fd in fds]
    for i, fd in enumerate(tmp):
        os.dup2(fd, 3 + i)
    os.closerange(3 + len(fds), 1 << 16)


def candidate_main(cfg: dict, ctl_r: int, out_w: int, err_w: int, call_r: int, reply_w: int) -> None:
    """Child side, forked by the forker (so its rlimits, oom score and seccomp filter are already
    in force): drop to the program's uid, wait for the program, run it. Never returns.

    Every page a fresh child writes costs a copy-on-write fault, so this path is kept short: no
    JSON (the program arrives marshalled from the zygote), no parent-death signal (when the
    sandbox goes, its PID namespace's init goes, and the kernel kills everything in it), and the
    descriptors stay where they arrived."""
    try:
        os.dup2(4, 0), os.dup2(out_w, 1), os.dup2(err_w, 2)  # the forker's fd 4 is /dev/null
        for fd in (3, 4, out_w, err_w):  # 3 is the forker's socket
            os.close(fd)
        os.closerange(max(ctl_r, call_r, reply_w) + 1, 1 << 16)
        _drop_to(cfg["candidate_uid"])
        os.chdir("/tmp")
        os.write(2, b"ready\n")
    except BaseException as e:  # the sandbox could not be built: the zygote reports INFRA_FAIL
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(70)
    import resource

    head = _read_exact(ctl_r, 4)
    body = _read_exact(ctl_r, struct.unpack(">I", head)[0]) if head else None
    os.close(ctl_r)
    if body is None:
        os._exit(0)
    msg = marshal.loads(body)
    cpu = min(int(msg["timeout_s"]) + 1, cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if "random" in msg["program"] and "random" in sys.modules:
        # os.fork's hook would give every child a fresh seed; this one skipped it (see _fork),
        # so a program that may use the shared generator gets its own seed here.
        sys.modules["random"].seed()
    if msg["mode"] == "io":
        os.close(call_r), os.close(reply_w)
        _child_io(msg)
    if msg["mode"] == "pytest":
        _child_objects(msg, call_r, reply_w)
    _child_func(msg, call_r, reply_w)


def _child_io(msg: dict) -> None:
    fd = os.memfd_create("stdin")
    os.write(fd, msg["stdin"].encode())
    os.lseek(fd, 0, 0)
    os.dup2(fd, 0), os.close(fd)
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


_READY = struct.pack(">I", 11) + b'{"ready":1}'  # what write_frame(fd, {"ready": 1}) sends


def _child_func(msg: dict, call_fd: int, reply_fd: int) -> None:
    ns = {"__name__": "__candidate__"}
    try:
        exec(compile(msg["program"], "<program>", "exec"), ns)
        fn = ns[msg["entry_point"]]
        if not callable(fn):
            raise TypeError(f"{msg['entry_point']} is not callable")
        os.write(reply_fd, _READY)
    except BaseException as e:
        write_frame(reply_fd, {"exc": type(e).__name__, "msg": str(e)[:300]})
        os._exit(EXIT_MEMORY if isinstance(e, MemoryError) else 1)
    while True:  # no import from here on: the program may have replaced __import__
        head = _read_exact(call_fd, 4)
        body = _read_exact(call_fd, struct.unpack(">I", head)[0]) if head else None
        if body is None:
            os._exit(0)
        call = marshal.loads(body)  # from the judge: trusted. The reply goes back as JSON.
        try:
            args, kwargs = decode(call["args"]), decode(call["kwargs"])
            reply = {"ok": encode(fn(*args, **kwargs))}
        except BaseException as e:
            reply = {"exc": type(e).__name__, "msg": str(e)[:300]}
        write_frame(reply_fd, reply)


# Values the candidate sends back as data in pytest mode: everything else becomes a handle.
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_SPECIAL = {"__len__": len, "__bool__": bool, "__str__": str, "__repr__": repr, "__iter__": iter,
            "__next__": next, "__getitem__": lambda o, k: o[k], "__contains__": lambda o, k: k in o,
            "__setitem__": lambda o, k, v: o.__setitem__(k, v), "__delitem__": lambda o, k: o.__delitem__(k)}
_CAPTURE_LIMIT = 1 << 20
_HANDLE_IDS: dict = {}  # id(object) -> its handle; in a candidate only (each is a fresh fork)
_BUILTINS = sys.modules["builtins"]  # the module object: a program may rebind its names, not this


def _make_handle(x, table: list) -> list:
    """A reference to ``x`` that stays in the candidate: ``["h", id, kind, name, base]``. ``kind`` says
    how the judge may use it (an exception class, a class, a callable, an object); ``base`` is the
    nearest builtin exception class of an exception class (only a name: the judge maps it)."""
    hid = _HANDLE_IDS.get(id(x))  # the same object, the same handle: identity holds in the judge
    if hid is None or table[hid] is not x:
        table.append(x)
        hid = _HANDLE_IDS[id(x)] = len(table) - 1
    base = ""
    if isinstance(x, type) and issubclass(x, BaseException):
        kind = "exc"
        base = next((c.__name__ for c in x.__mro__ if getattr(_BUILTINS, c.__name__, None) is c), "Exception")
    else:
        kind = "class" if isinstance(x, type) else "call" if callable(x) else "obj"
    name = getattr(x, "__qualname__", None) if kind != "obj" else type(x).__qualname__
    return ["h", hid, kind, name if type(name) is str else "?", base]


def _encode_h(x, table: list, depth: int = 0):
    """`encode`, except that a value of any other type goes out as a handle, not an error."""
    if depth > 100:
        raise ValueError("value nested deeper than 100")
    t = type(x)
    if t in _PLAIN:
        return encode(x)
    if t in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
        return [tag, [_encode_h(v, table, depth + 1) for v in t.__iter__(x)]]
    if t is dict:
        return ["d", [[_encode_h(k, table, depth + 1), _encode_h(v, table, depth + 1)] for k, v in dict.items(x)]]
    return _make_handle(x, table)


def _decode_h(v, table: list, depth: int = 0):
    """`decode`, plus handles the judge sends back (resolved in ``table``) and paths (``tmp_path``)."""
    if type(v) is list and v and v[0] == "h" and type(v[1]) is int and 0 <= v[1] < len(table):
        return table[v[1]]
    if type(v) is list and v and v[0] == "p" and type(v[1]) is str:
        import pathlib  # only for a task that sends paths: a program that broke `import` fails it

        return pathlib.Path(v[1])
    if type(v) is list and v and v[0] in ("l", "t", "S", "F") and type(v[1]) is list and depth < 100:
        items = [_decode_h(x, table, depth + 1) for x in v[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[v[0]](items)
    if type(v) is list and v and v[0] == "d" and type(v[1]) is list and depth < 100:
        return {_decode_h(k, table, depth + 1): _decode_h(w, table, depth + 1) for k, w in v[1]}
    return decode(v, depth)


def _serve(call: dict, table: list) -> dict:
    """One request from the judge on the program's objects; the reply, made of data and handles."""
    op, obj = call["op"], table[call["obj"]]
    if op == "names":
        return {"ok": encode([k for k in obj if type(k) is str and not k.startswith("_")])}
    if op == "get":
        if call["obj"] == 0:  # the program's namespace: a missing name is the module's AttributeError
            if call["name"] not in obj:
                raise AttributeError(f"the program defines no {call['name']!r}")
            return {"ok": _encode_h(obj[call["name"]], table)}
        return {"ok": _encode_h(getattr(obj, call["name"]), table)}
    if op == "set":
        value = _decode_h(call["value"], table)
        if call["obj"] == 0:
            obj[call["name"]] = value
        else:
            setattr(obj, call["name"], value)
        return {"ok": encode(None)}
    args = _decode_h(call["args"], table)
    if op == "call":
        kwargs = _decode_h(call["kwargs"], table)
        reply = {"ok": _encode_h(obj(*args, **kwargs), table)}
        if any(type(a) in (list, dict, set, bytearray) for a in (*args, *kwargs.values())):
            reply["after"] = [_encode_h(args, table), _encode_h(kwargs, table)]  # in-place changes
        return reply
    return {"ok": _encode_h(_SPECIAL[call["name"]](obj, *args), table)}


def _child_objects(msg: dict, call_fd: int, reply_fd: int) -> None:
    """Pytest mode: load the program as module ``msg["module"]`` and answer the judge's requests on
    its objects until the judge hangs up. Anything that is not plain data stays here, named by a
    handle; what each call prints is captured and sent back as text (tests read it with capsys)."""
    import io

    ns = {"__name__": msg["module"]}
    try:
        exec(compile(msg["program"], f"{msg['module']}.py", "exec"), ns)
        os.write(reply_fd, _READY)
    except BaseException as e:
        write_frame(reply_fd, {"exc": type(e).__name__, "msg": str(e)[:300]})
        os._exit(EXIT_MEMORY if isinstance(e, MemoryError) else 1)
    table: list = [ns]
    string_io = io.StringIO
    while True:
        head = _read_exact(call_fd, 4)
        body = _read_exact(call_fd, struct.unpack(">I", head)[0]) if head else None
        if body is None:
            os._exit(0)
        call = marshal.loads(body)  # from the judge: trusted
        out, err = string_io(), string_io()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            reply = _serve(call, table)
        except BaseException as e:
            reply = _raised_reply(e, table)
        finally:
            sys.stdout, sys.stderr = saved
        for key, buf in (("out", out), ("err", err)):
            text = buf.getvalue() if type(buf) is string_io else ""
            if text:
                reply[key] = text[:_CAPTURE_LIMIT]
        try:
            write_frame(reply_fd, reply)
        except (TypeError, ValueError):
            write_frame(reply_fd, {"exc": "TypeError", "msg": "reply could not be sent"})


def _raised_reply(e: BaseException, table: list) -> dict:
    name = type(e).__name__
    try:
        text = str(e)[:300]
    except BaseException:
        text = ""
    reply = {"exc": name if type(name) is str else "Exception", "msg": text if type(text) is str else ""}
    if getattr(_BUILTINS, name, None) is not type(e):
        reply["cls"] = _make_handle(type(e), table)
    return reply


# ----------------------------------------------------------------------------- the forker
CAP_SETGID, CAP_SETUID = 6, 7


def _keep_only_caps(*caps: int) -> None:
    """Reduce this process's effective and permitted capabilities to ``caps`` (capset(2))."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    mask = sum(1 << c for c in caps)
    data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
    if _libc().capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:  # _LINUX_CAPABILITY_VERSION_3
        raise OSError(ctypes.get_errno(), "capset")


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
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open("/dev/null", os.O_RDWR)
        _place_fds([sock_fd, null])  # socket=3, /dev/null=4
        _set_limits(cfg, cpu_s=None, nproc=cfg["nproc"])
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
        _keep_only_caps(CAP_SETUID, CAP_SETGID)
        _install_filter()
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
                pid = _fork()
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


def _verdict(cls: str, reason: str = "", detail: str = "") -> dict:
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
        code = compile(source, name, "exec")
        _CODE_CHARS[0] += len(source)
        while _CODE and _CODE_CHARS[0] > 16 << 20:
            _CODE_CHARS[0] -= len(next(iter(_CODE))[0])
            del _CODE[next(iter(_CODE))]
    _CODE[key] = code  # reinserted: now the most recently used
    return code


def judge(msg: dict, call_fd: int, reply_fd: int) -> dict:
    """Run the prelude and ``check(candidate)`` against the proxy; return the verdict. Pytest-style
    tasks go to `pytest_judge` (bound into the sandbox next to the pytest library)."""
    if msg.get("mode") == "pytest":
        try:
            import posttrain_pytest_judge
        except ImportError as e:
            return _verdict("INFRA_FAIL", "sandbox", f"pytest is not available in the sandbox: {e}")
        return posttrain_pytest_judge.run(msg, call_fd, reply_fd, sys.modules[__name__])
    ns = {"__name__": "__judge__"}
    try:
        exec(_compiled(msg.get("prelude") or "", "<prelude>"), ns)
        exec(_compiled(msg["tests"], "<tests>"), ns)
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
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _place_fds([sock_fd, result_w])  # socket=3, result=4
        _set_limits(cfg, cpu_s=None, nproc=cfg["nproc"])  # CPU: a budget per task, below
        _drop_to(cfg["judge_uid"])
        _install_filter()
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
        verdict = judge(msg, call_fd, reply_fd)
        os.close(call_fd), os.close(reply_fd)
        clean = _same_state(before)
        verdict["retire"] = not clean
        write_frame(4, verdict)
        if not clean:
            os._exit(0)


# ----------------------------------------------------------------------------- the zygote
class _Cand:
    """Zygote-side ends of one pre-forked candidate (forked by the forker)."""

    def __init__(self, cfg: dict):
        ctl_r, self.ctl_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        call_r, self.call_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.fds = [self.ctl_w, self.out_r, self.err_r, self.call_w, self.reply_r]
        try:
            self.pid = _STATE["forker"].fork([ctl_r, out_w, err_w, call_r, reply_w])
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (ctl_r, out_w, err_w, call_r, reply_w):
                os.close(fd)

    def give_pipes(self) -> list[int]:
        """Hand the call and reply pipes over (to the judge); the zygote keeps no copy."""
        fds = [self.call_w, self.reply_r]
        for fd in fds:
            self.fds.remove(fd)
        return fds

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class _Forker:
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


class _Judge:
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


def _send_program(cand: _Cand, msg: dict) -> None:
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
        return _verdict("MODEL_FAIL", "timeout", "the tests ran out of CPU time")
    return {"infra": f"judge died without a verdict (status {status})"}


def _run_func(cfg: dict, cand: _Cand, req: dict) -> dict:
    _send_program(cand, {"mode": req["mode"], "program": req["program"], "module": req.get("module"),
                         "entry_point": req.get("entry_point"), "timeout_s": req["timeout_s"]})
    judge = _STATE["judge"]
    if judge is None:  # it died between tasks (it closes every descriptor but its own two)
        judge = _STATE["judge"] = _Judge(cfg)
    judge.send({k: req.get(k) for k in ("mode", "prelude", "tests", "entry_point", "module", "timeout_s",
                                        "output_limit")},
               cand.give_pipes())
    outs = {cand.out_r: bytearray(), cand.err_r: bytearray()}
    why = _pump(outs, req["output_limit"], time.monotonic() + req["timeout_s"], judge.res_r)
    if why != "stop":
        _retire_judge()  # it is mid-task: its state, and any verdict it would send, are stale
        if why == "timeout":
            return _verdict("MODEL_FAIL", "timeout", f"no verdict within {req['timeout_s']} s")
        return _verdict("MODEL_FAIL", "output_limit", f"printed over {req['output_limit']} bytes")
    try:
        verdict = read_frame(judge.res_r)
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
            return _verdict("MODEL_FAIL", "timeout", "the program ran out of CPU time")
    stderr = bytes(outs[cand.err_r][-300:]).decode(errors="replace")
    if stderr and verdict["cls"] != "PASS":
        verdict["detail"] = (verdict["detail"] + " | stderr: " + stderr)[:800]
    return verdict


def _tree_name(name) -> str:
    if not (isinstance(name, str) and len(name) == 64 and all(c in "0123456789abcdef" for c in name)):
        raise ValueError("a tree is named by 64 hex digits")
    if not os.path.isdir(f"{TREES_DIR}/{name}"):
        raise FileNotFoundError(f"tree {name[:12]} is not in the store")
    return name


def _mount_tree(name: str) -> str:
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
        if _libc().mount(b"overlay", TREE_DIR.encode(), b"overlay", MS_NOSUID | MS_NODEV, (opts + extra).encode()) == 0:
            _MOUNTED.add(TREE_DIR)
            return "overlay"
    errno_ = ctypes.get_errno()
    if errno_ not in (errno.EPERM, errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP):
        raise OSError(errno_, f"mount overlay {TREE_DIR}")
    _copy_tree(lower, TREE_DIR)
    return "copy"


def _copy_tree(src: str, dst: str) -> None:
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


def _run_io_case(cfg: dict, cand: _Cand, req: dict, stdin: str) -> dict:
    """One stdin: run the program, return its status and stdout (compared by the host). A
    request naming a ``tree`` gets it at `TREE_DIR` first."""
    tree = _mount_tree(req["tree"]) if req.get("tree") else None
    case = _run_case(cfg, cand, req, stdin)
    if tree:
        case["tree"] = tree
    return case


def _run_case(cfg: dict, cand: _Cand, req: dict, stdin: str) -> dict:
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


_MOUNTED: set = set()


def _fresh_tmpfs(cfg: dict, force: bool = False) -> None:
    """Mount a fresh size-capped tmpfs on each of ``TMPFS`` that a program has touched (or on
    all of them with ``force``), and stamp its root with mtime 0. Creating, renaming or deleting
    anything in it sets the root's mtime to now, and only the root's owner (here, root) can set
    it back, so a mount whose root still says 0 holds nothing a program put there."""
    import ctypes

    libc = _libc()
    opts = f"size={cfg['tmpfs_mb']}m,nr_inodes=4096,mode=1777".encode()
    for where in TMPFS:
        if not force and os.stat(where).st_mtime_ns == 0:
            continue
        path = where.encode()
        if where in _MOUNTED and libc.umount2(path, MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), f"umount {where}")
        _MOUNTED.discard(where)
        if libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs {where}")
        _MOUNTED.add(where)
        os.utime(where, ns=(0, 0))


def _judge_tmpfs(cfg: dict) -> None:
    """Mount the judge's own tmpfs on `JUDGE_DIR`, mode 0700 and owned by the judge's uid: a test
    module written there cannot be read, replaced or joined by a ``conftest.py`` from the program,
    and the program cannot fill it to make a task fail to load."""
    import ctypes

    if not os.path.isdir(JUDGE_DIR):
        return
    uid = cfg["judge_uid"]
    opts = f"size=64m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    if _libc().mount(b"tmpfs", JUDGE_DIR.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs {JUDGE_DIR}")


def _next(cfg: dict) -> None:
    """Clean up after a program and make the next one ready: kill what is left of it, give
    touched mounts a fresh tmpfs, make sure a judge runs, and pre-fork the next candidate."""
    if _STATE["cand"] is not None:
        _STATE["cand"].close()
        _STATE["cand"] = None
    _kill_others()
    if TREE_DIR in _MOUNTED:
        if _libc().umount2(TREE_DIR.encode(), MNT_DETACH) != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), f"umount {TREE_DIR}")
        _MOUNTED.discard(TREE_DIR)
    _fresh_tmpfs(cfg)
    if _STATE["judge"] is None:
        _STATE["judge"] = _Judge(cfg)
    for wait in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, None):
        try:
            _STATE["cand"] = _Cand(cfg)
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


# Compiled and run once by the zygote before it forks: CPython builds parts of its compiler's
# state on first use, and a child that did that itself would pay for it in page faults (more
# than for the rest of a short program).
_WARM_SOURCE = '''
from typing import List
def f(xs: List[int], k: int = 2) -> List[int]:
    """Docstring."""
    out = [x * k for x in xs if x % 2 == 0]
    d = {x: f"{x!r:>3}" for x in out}
    try:
        with open("/nonexistent") as fh:
            pass
    except (OSError, ValueError) as e:
        del e
    while k > 0:
        k -= 1
    return sorted(out, key=lambda v: -v) + list(d) + [*(y for y in xs)]
class C:
    def m(self, a, *args, b=None, **kw):
        return a if a is not None and not b else ~-a
assert f([1, 2, 3, 4]) == [8, 4, 4, 8, 1, 2, 3, 4]
'''


def _warm_up() -> None:
    """Do once, in the zygote, the first-use work its children would otherwise each repeat."""
    exec(compile(_WARM_SOURCE, "<warm>", "exec"), {"__name__": "__warm__"})
    libc = _libc()
    libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0), libc.fork, libc.mount, libc.umount2  # resolved once
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

    _libc()
    _prepare_filter(cfg["seccomp"])
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
    _fresh_tmpfs(cfg, force=True)
    _judge_tmpfs(cfg)
    _STATE["forker"] = _Forker(cfg)
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


if __name__ == "__main__":
    main(sys.argv)
