"""One sandbox worker on the host side: a bubblewrap sandbox running the zygote, in its own cgroups.

The host talks to the zygote over the sandbox's stdin/stdout with length-prefixed JSON frames.
Anything that goes wrong on this channel (the process died, the reply is late or garbled) raises
:class:`WorkerError`; the pool turns that into a retry and, if retries run out, INFRA_FAIL.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import marshal
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from posttrain.sandbox import inside, seccomp_filter, trees
from posttrain.sandbox.inside import mounts, wire

BOX_PATH = Path(inside.__file__).resolve().parent
PYTEST_JUDGE_PATH = BOX_PATH.parent / "pytest_judge.py"
# What the judge needs to run pytest-style tests: the pytest library and its dependencies, bound
# read-only from this interpreter's environment (the sandbox's interpreter has no site-packages).
JUDGE_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
# Run in the sandbox with `python -c`: the modules of `posttrain.sandbox.inside` as the package
# ``box``, from code objects compiled here where the sandbox's interpreter has this one's bytecode
# version, from their sources (bound at `mounts.BOX_DIR`) anywhere else; then the zygote's loop.
BOOT = ("import marshal, sys\n"
        "if sys.version_info[:2] == {version}:\n"
        "    units = marshal.loads(open('/sandbox/box.code', 'rb').read())\n"
        "else:\n"
        "    units = [(n, compile(open(f'/sandbox/box/{{n}}.py').read(), f'/sandbox/box/{{n}}.py', 'exec', "
        "dont_inherit=True)) for n in {modules}]\n"
        "box = type(sys)('box')\n"
        "box.__path__ = []\n"
        "sys.modules['box'] = box\n"
        "for name, code in units:\n"
        "    m = type(sys)('box.' + name)\n"
        "    m.__package__ = 'box'\n"
        "    sys.modules[m.__name__] = m\n"
        "    setattr(box, name, m)\n"
        "    exec(code, m.__dict__)\n"
        "box.zygote.main(sys.argv)\n")


@functools.lru_cache(maxsize=1)
def box_code() -> bytes:
    """The sandbox's modules compiled once per host process and marshalled, in load order. A
    sandbox that loads them skips compiling 50 KB of source at every start, and its memory keeps
    none of the compiler's leftovers (2 MB), which every fork of a program would otherwise copy
    and tear down."""
    units = [(name, compile((BOX_PATH / f"{name}.py").read_text(), f"{mounts.BOX_DIR}/{name}.py", "exec",
                            dont_inherit=True))
             for name in inside.MODULES]
    return marshal.dumps(units)


@functools.lru_cache(maxsize=1)
def judge_lib_binds() -> tuple[str, ...]:
    """bubblewrap arguments that bind `JUDGE_PACKAGES` and `pytest_judge` under `mounts.JUDGE_LIB`;
    none when pytest is not installed here (a pytest-style task then ends INFRA_FAIL, said so)."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return ()
    binds = ["--perms", "0755", "--dir", mounts.JUDGE_LIB,  # bwrap would make it 0700: the judge could not enter
             "--ro-bind", str(PYTEST_JUDGE_PATH), f"{mounts.JUDGE_LIB}/posttrain_pytest_judge.py"]
    for name in JUDGE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        src = Path(spec.origin).resolve()
        src = src.parent if src.name == "__init__.py" else src
        binds += ["--ro-bind", str(src), f"{mounts.JUDGE_LIB}/{src.name}"]
    return tuple(binds)


CGROUP_ROOT = Path("/sys/fs/cgroup")


class WorkerError(Exception):
    """The sandbox machinery failed (not the program)."""


@dataclasses.dataclass(kw_only=True)
class SandboxConfig:
    workers: int = 0
    """Concurrent sandboxes; 0 means one per CPU core."""
    timeout_s: float = 5.0
    """Wall-clock limit per program (per stdin for stdin/stdout tasks)."""
    memory_mb: int = 1024
    """Address-space limit of each program process (RLIMIT_AS)."""
    worker_memory_mb: int = 3072
    """Memory cgroup limit for a whole sandbox (all its processes and its tmpfs pages)."""
    nproc: int = 32
    """Processes the program may have at once (RLIMIT_NPROC on its own uid, and the pids cgroup)."""
    file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 32
    """Size of the program's private /tmp and /dev/shm."""
    output_limit: int = 1 << 20
    """Bytes of stdout+stderr kept; more is MODEL_FAIL/output_limit."""
    cpu_s: int = 30
    """Upper bound on RLIMIT_CPU (the per-program limit is timeout_s + 1, capped by this)."""
    recycle_after: int = 1000
    """Replace a sandbox after this many programs."""
    canary_every: int = 500
    """Run the canaries on a sandbox after this many programs (and at its start)."""
    pin_cpus: bool = True
    """Pin each sandbox, with every process in it, to one CPU (round-robin over the CPUs this
    process may use) when there are at least as many sandboxes as those CPUs. A program then
    runs where its zygote, forker and judge run: no cross-CPU wake-ups and TLB shootdowns, 1.1-1.3x
    the throughput on a 2-core VM (`bench/sandbox_vs_humaneval.py`). With fewer sandboxes
    than CPUs it does nothing: there a sandbox is faster when its processes may spread out."""
    max_retries: int = 2
    """Retries of a program whose run hit INFRA_FAIL."""
    queue_size: int = 256
    """Pending programs before `submit` blocks (back-pressure)."""
    breaker_window: int = 50
    """Number of recent runs the circuit breaker looks at."""
    breaker_threshold: float = 0.5
    """Trip when more than this fraction of the recent runs hit an infrastructure failure."""
    python: str = "/usr/bin/python3.11"
    """Interpreter inside the sandbox; must be readable by an unprivileged uid."""
    replicas: int = 0
    """Sandbox pools run as Ray actors when the recipe says ``runtime: ray`` (the verifier farm,
    `posttrain.distributed.farm`); 0 = one pool in this process. Ignored with ``runtime: local``."""
    cpus: int = 2
    """Farm only: CPUs each actor reserves from Ray; it runs this many sandboxes."""
    site_packages: str = ""
    """A folder (a virtual environment's site-packages) bound read-only at `mounts.SITE_DIR` for
    programs that put it on their import path themselves; empty = none."""

    def __post_init__(self):
        if self.workers < 0:
            raise ValueError("workers must be >= 0")
        if self.timeout_s <= 0 or self.memory_mb < 64 or self.nproc < 1:
            raise ValueError("timeout_s must be > 0, memory_mb >= 64, nproc >= 1")
        if not 0 < self.breaker_threshold <= 1:
            raise ValueError("breaker_threshold must be in (0, 1]")
        if self.replicas < 0 or self.cpus < 1:
            raise ValueError("replicas must be >= 0 and cpus >= 1")
        if self.site_packages and not os.path.isdir(self.site_packages):
            raise ValueError(f"site_packages: {self.site_packages} is not a folder")

    @property
    def n_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    def cpu_of(self, slot: int) -> int | None:
        """The CPU sandbox ``slot`` is pinned to, or None (see `pin_cpus`)."""
        cpus = sorted(os.sched_getaffinity(0))
        if not self.pin_cpus or self.n_workers < len(cpus):
            return None
        return cpus[slot % len(cpus)]


def _own_cgroup(controller: str) -> Path | None:
    """The cgroup v1 directory this process sits in for ``controller``, if writable."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                d = CGROUP_ROOT / controller / path.lstrip("/")
                return d if os.access(d, os.W_OK) else None
    except OSError:
        return None
    return None


def probe() -> dict:
    """What this machine offers. ``missing`` lists mechanisms we cannot use (said loudly)."""
    found = {"bwrap": shutil.which("bwrap"), "python": None, "pids_cgroup": _own_cgroup("pids"),
             "memory_cgroup": _own_cgroup("memory"), "root": os.geteuid() == 0, "seccomp": None}
    missing = []
    if not found["bwrap"]:
        missing.append("bubblewrap (apt-get install bubblewrap)")
    if not found["root"]:
        missing.append("root (needed to switch the program to an unprivileged uid)")
    try:
        found["seccomp"] = seccomp_filter.build().hex()
    except seccomp_filter.SeccompUnavailable as e:
        missing.append(str(e))
    for key in ("pids_cgroup", "memory_cgroup"):
        if found[key] is None:
            missing.append(f"{key.replace('_', ' ')} (v1, writable)")
    found["missing"] = missing
    return found


class Worker:
    """A bubblewrap sandbox with a warm zygote. Not thread-safe: one pool thread owns it."""

    def __init__(self, cfg: SandboxConfig, slot: int, uid_base: int, info: dict):
        self.cfg, self.slot, self.info = cfg, slot, info
        self.uid = uid_base + 2 * slot
        self.programs = 0
        self.proc: subprocess.Popen | None = None
        self.cgroups: list[Path] = []
        self.start()

    def _zygote_cfg(self) -> dict:
        c = self.cfg
        return {"candidate_uid": self.uid, "judge_uid": self.uid + 1, "memory_mb": c.memory_mb,
                "cpu_s": c.cpu_s, "nproc": c.nproc, "file_mb": c.file_mb, "tmpfs_mb": c.tmpfs_mb,
                "seccomp": self.info["seccomp"], "cpu": c.cpu_of(self.slot)}

    def _make_cgroups(self) -> list[str]:
        self.cgroups = []
        name = f"posttrain-sandbox-{os.getpid()}-{self.slot}-{time.monotonic_ns()}"
        for key, limit_file, value in (("pids_cgroup", "pids.max", self.cfg.nproc + 8),
                                       ("memory_cgroup", "memory.limit_in_bytes",
                                        self.cfg.worker_memory_mb << 20)):
            if self.info[key] is None:
                continue
            d = self.info[key] / name
            d.mkdir()
            (d / limit_file).write_text(str(value))
            self.cgroups.append(d)
        return [str(d / "cgroup.procs") for d in self.cgroups]

    def _command(self, code_fd: int) -> list[str]:
        binds = []
        for d in ("/usr", "/etc/alternatives"):
            if os.path.exists(d):
                binds += ["--ro-bind", d, d]
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{link}"):
                binds += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        caps = ["--cap-drop", "ALL"]
        # The overlay a job's tree is seen through (`inside.mounts.mount_tree`) does each change on its
        # layers with its mounter's capabilities: CAP_DAC_OVERRIDE to enter the work folder the
        # kernel makes with mode 0, CAP_FOWNER and CAP_CHOWN so that a program may chmod or chown
        # what it owns there. The forker, the judge and the candidates never hold them.
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
                    "CAP_CHOWN"):
            caps += ["--cap-add", cap]
        return [self.info["bwrap"], "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--clearenv", *binds, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                "--perms", "0711", "--dir", "/sandbox", "--ro-bind", str(BOX_PATH), mounts.BOX_DIR,
                "--ro-bind-data", str(code_fd), "/sandbox/box.code", *judge_lib_binds(),
                *(("--ro-bind", self.cfg.site_packages, mounts.SITE_DIR) if self.cfg.site_packages else ()),
                "--ro-bind", trees.store_root(), mounts.TREES_DIR,
                "--dir", mounts.JUDGE_DIR, "--chdir", "/", *caps,
                self.cfg.python, "-I", "-S", "-B", "-c", BOOT.format(version=tuple(sys.version_info[:2]), modules=inside.MODULES),
                json.dumps(self._zygote_cfg())]

    def start(self) -> None:
        procs = self._make_cgroups()
        # A shell joins the cgroups before exec'ing bwrap, so every descendant is counted.
        script = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; shift; exec "$@"'
        code_fd = os.memfd_create("box.code")  # one per start: bwrap reads it from offset 0
        try:
            data = box_code()
            while data:
                data = data[os.write(code_fd, data):]
            os.lseek(code_fd, 0, os.SEEK_SET)
            argv = ["/bin/sh", "-c", script, "sh", *procs, "--", *self._command(code_fd)]
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, close_fds=True, env={},
                                         start_new_session=True, pass_fds=(code_fd,))
            os.close(code_fd)
            code_fd = -1
            reply = self._call({"op": "ping"}, 10.0)
        except (OSError, WorkerError) as e:
            if code_fd >= 0:
                os.close(code_fd)
            self.close()
            raise WorkerError(f"sandbox did not start: {e}") from e
        if "pong" not in reply:
            self.close()
            raise WorkerError(f"sandbox did not start: {reply}")
        self.programs = 0

    def _call(self, req: dict, wait_s: float) -> dict:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            wire.write_frame(self.proc.stdin.fileno(), req)
        except OSError as e:
            raise WorkerError(f"sending to the sandbox failed: {e}") from e
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], wait_s)[0]:
            raise WorkerError(f"sandbox gave no answer within {wait_s:.1f} s")
        try:
            reply = wire.read_frame(fd)
        except (OSError, ValueError) as e:
            raise WorkerError(f"reading from the sandbox failed: {e}") from e
        if reply is None:
            raise WorkerError(f"sandbox exited (status {self.proc.poll()})")
        return reply

    def run(self, req: dict) -> dict:
        """Run one request; the zygote's reply. Raises WorkerError when the machinery fails."""
        n_cases = len(req.get("stdins") or [None])
        reply = self._call(req, req["timeout_s"] * n_cases + 10.0)
        self.programs += 1
        if "infra" in reply:
            raise WorkerError(reply["infra"])
        return reply

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                if f:
                    f.close()
            self.proc = None
        for d in self.cgroups:
            _remove_cgroup(d)
        self.cgroups = []


def _remove_cgroup(d: Path) -> None:
    """Kill whatever is left in the cgroup, then remove it (once its last process has gone,
    which takes about a millisecond after the kill: the waits start short)."""
    for wait in (0.0005, 0.001, 0.002, 0.005, *[0.01] * 100):
        try:
            pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            d.rmdir()
            return
        except OSError:
            time.sleep(wait)
