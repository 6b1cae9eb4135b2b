"""The candidate: the process that runs one untrusted program, and the zygote's end of it (`Cand`).

Forked by the forker *before* the request is read, so the tests and expected outputs never
exist in its address space. It inherits the forker's rlimits, oom score and seccomp filter,
drops to the program's uid (all capabilities go with it) and waits for its program.

What the candidate can name: its own pipes (stdout, stderr, the call pipe from the judge and
the reply pipe to it), ``/tmp`` and ``/dev/shm`` (fresh after any program that touched them),
the read-only binds (``/usr``, this code, a site-packages when the pool names one) and, for a
stdin/stdout job with a tree, `mounts.TREE_DIR`. It cannot read or signal the judge (another
uid), cannot enter `mounts.JUDGE_DIR`, and whatever it sends the judge is data `wire.decode`
rebuilds as exact builtin types, or (pytest mode) a handle whose objects stay here.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys

from . import kernel
from .wire import _read_exact, decode, encode, write_frame

EXIT_MEMORY = 3  # the candidate's wrapper exits with this after a MemoryError


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
        kernel.drop_to(cfg["candidate_uid"])
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
        # os.fork's hook would give every child a fresh seed; this one skipped it (see kernel.fork),
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
        exec(compile(msg["program"], "<program>", "exec", dont_inherit=True), {"__name__": "__main__"})
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
        exec(compile(msg["program"], "<program>", "exec", dont_inherit=True), ns)
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
    try:  # plain data (a Counter, a namedtuple, a large list packed) crosses as data
        return encode(x, depth)
    except TypeError:  # something in it is not data: it goes out item by item, with handles
        pass
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
        exec(compile(msg["program"], f"{msg['module']}.py", "exec", dont_inherit=True), ns)
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


class Cand:
    """Zygote-side ends of one pre-forked candidate (forked by the forker)."""

    def __init__(self, forker):
        ctl_r, self.ctl_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        call_r, self.call_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.fds = [self.ctl_w, self.out_r, self.err_r, self.call_w, self.reply_r]
        try:
            self.pid = forker.fork([ctl_r, out_w, err_w, call_r, reply_w])
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
