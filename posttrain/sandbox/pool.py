"""A pool of warm sandboxes: concurrency, retries, canaries, a circuit breaker, an async API.

- One thread per sandbox pulls jobs from a bounded queue; ``submit`` blocks when the queue is
  full (back-pressure), so a fast producer cannot pile up unbounded work.
- A run that hits a machinery failure (:class:`WorkerError`: the sandbox died, gave no answer,
  could not fork) is counted, the sandbox is replaced, and the job is retried up to
  ``max_retries`` times; only then is it INFRA_FAIL. It is never scored as a wrong answer.
- Canaries (a known pass, a wrong answer, a timeout, a memory hog) run on every sandbox when it
  starts and every ``canary_every`` programs; a sandbox that gets one wrong is replaced.
- The circuit breaker looks at the last ``breaker_window`` attempts; when more than
  ``breaker_threshold`` of them were machinery failures it trips, and every pending and later
  job raises :class:`CircuitOpen` with the reason: a broken host must stop the run, not feed it
  noise.
- Time a caller's job spends here, queued or running, is charged to the caller's `PoolClock`
  (`posttrain.sandbox.clock`): a hang deadline over the caller (an environment's step limit)
  leaves it out, since the pool bounds it itself and says whose fault it was.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import queue
import sys
import threading
from collections.abc import Mapping

from posttrain.outcome import Outcome
from posttrain.sandbox.clock import charge
from posttrain.sandbox.trees import Tree, materialize
from posttrain.sandbox.worker import SandboxConfig, Worker, WorkerError, probe


class SandboxUnavailable(RuntimeError):
    """This machine cannot run the sandbox (no bubblewrap, not root, no libseccomp)."""

    stops_run = True  # verifier wrappers re-raise it instead of scoring INFRA_FAIL


class CircuitOpen(RuntimeError):
    """Too many infrastructure failures: the run must stop."""

    stops_run = True


@dataclasses.dataclass(frozen=True)
class Job:
    """One program to judge. Function-call form: ``entry_point`` + ``tests`` (defining
    ``check(candidate)``) + optional trusted ``prelude``. Pytest form: ``tests`` is a pytest
    module importing the program as ``module`` (`pytest_judge`). Stdin/stdout form: ``io`` pairs.
    ``capture``: a stdin/stdout run whose output is not compared but returned, as the detail of a
    PASS that says only "the program ran to the end" (a tool that shows a program's output)."""

    program: str
    entry_point: str = ""
    tests: str = ""
    prelude: str = ""
    io: tuple[tuple[str, str], ...] = ()
    timeout_s: float | None = None
    capture: bool = False
    module: str = ""
    compare: str = "lines"
    """How stdout is compared: ``lines`` (trailing spaces and blank lines ignored) or ``tokens``
    (LiveCodeBench: stripped lines, equal as text or as decimal numbers token by token)."""
    tree: Tree | None = None
    """Stdin/stdout form only: a project tree the program finds at `zygote.TREE_DIR`, writable
    (an overlay on the shared read-only copy; `posttrain.sandbox.trees`)."""
    hidden: Mapping[str, str] | None = None
    """With ``tree``: files (relative path -> text) the sandbox itself writes into the tree
    before the program starts, read-only to the program (`inside.mounts.place_hidden`): a
    verdict's restored tests and configuration, which code under test must not rewrite."""

    def __post_init__(self):
        if self.hidden and self.tree is None:
            raise ValueError("a job's hidden files need its tree")

    def request(self, cfg: SandboxConfig) -> dict:
        req = {"program": self.program, "timeout_s": self.timeout_s or cfg.timeout_s,
               "output_limit": cfg.output_limit}
        if self.io:
            tree = {"tree": materialize(self.tree), "hidden": dict(self.hidden or {})} if self.tree is not None else {}
            return {**req, "mode": "io", "stdins": [i for i, _ in self.io], **tree}
        if self.module:
            return {**req, "mode": "pytest", "tests": self.tests, "module": self.module}
        return {**req, "mode": "func", "entry_point": self.entry_point, "tests": self.tests,
                "prelude": self.prelude}

    def outcome(self, reply: dict) -> Outcome:
        """Turn the sandbox's reply into an Outcome; stdout is compared here, on the host."""
        if not self.io:
            return Outcome(_CLS[reply["cls"]], 1.0 if reply["cls"] == "PASS" else 0.0,
                           reply["reason"], reply["detail"])
        for k, case in enumerate(reply["cases"]):
            if self.capture and case["status"] == "ok":
                return Outcome.passed(detail=case["stdout"])
            if case["status"] != "ok":
                return Outcome.model_fail(case["status"], detail=f"case {k}: {case['stderr'][-200:]}")
            if not OUTPUT_MATCH[self.compare](case["stdout"], self.io[k][1]):
                return Outcome.model_fail("wrong_answer", detail=f"case {k}: output differs")
        return Outcome.passed(detail=f"{len(self.io)} cases")


def normalize_output(text: str) -> str:
    """Compare outputs ignoring trailing spaces on lines and trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def tokens_match(got: str, want: str) -> bool:
    """LiveCodeBench's comparison: the same number of stripped lines, each equal as text or, token
    by token, as decimal numbers (so ``1.50`` matches ``1.5``, and no float rounding blurs 10**17)."""
    import decimal

    a = [line.strip() for line in got.strip().split("\n")]
    b = [line.strip() for line in want.strip().split("\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if [decimal.Decimal(t) for t in x.split()] != [decimal.Decimal(t) for t in y.split()]:
                return False
        except decimal.InvalidOperation:
            return False
    return True


OUTPUT_MATCH = {"lines": lambda got, want: normalize_output(got) == normalize_output(want), "tokens": tokens_match}

from posttrain.outcome import OutcomeClass  # noqa: E402

_CLS = {c.value: c for c in OutcomeClass}

CANARIES: list[tuple[str, Job, tuple[str, str]]] = [
    ("pass", Job("def f(x):\n    return x + 1\n", "f", "def check(c):\n    assert c(1) == 2\n"),
     ("PASS", "")),
    ("wrong", Job("def f(x):\n    return x\n", "f", "def check(c):\n    assert c(1) == 2\n"),
     ("MODEL_FAIL", "wrong_answer")),
    # Sleeps rather than spins: the wall-clock kill is what is checked, and a spinning canary
    # would take a core from the other workers while they start. 10 ms: every start pays it.
    ("timeout", Job("import time\ndef f(x):\n    time.sleep(3600)\n", "f",
                    "def check(c):\n    assert c(1) == 2\n", timeout_s=0.01), ("MODEL_FAIL", "timeout")),
    ("memory", Job("def f(x):\n    return len(bytearray(1 << 40))\n", "f",
                   "def check(c):\n    assert c(1) == 2\n"), ("MODEL_FAIL", "memory")),
]


_blocks_lock = threading.Lock()
_blocks_held: set[int] = set()  # first uids of this process's open pools' blocks


def processes_by_uid(uids: range) -> dict[int, list[int]]:
    """The processes on this machine whose real uid is in ``uids`` (the uid RLIMIT_NPROC counts),
    by uid: one read of /proc."""
    out: dict[int, list[int]] = {}
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            with open(f"/proc/{d.name}/status") as f:
                uid = int(next(x for x in f if x.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        if uid in uids:
            out.setdefault(uid, []).append(int(d.name))
    return out


def _claim_uid_block(n_workers: int) -> int:
    """First uid of a block no other pool uses: two uids per worker (program, judge), 256 per
    block, 16 blocks per process (by pid). Two pools must never share a uid — a shared uid would
    share RLIMIT_NPROC and let one pool's programs signal the other's, and a pool's count of its
    own processes would include the other's. So a block held by an open pool of this process, or
    in use by any process on the machine (a pool of another process whose pid matches ours
    modulo 30000, or a crash's leftovers), is skipped; `_release_uid_block` frees it on close."""
    if n_workers > 128:
        raise ValueError(f"at most 128 sandbox workers per pool (got {n_workers})")
    first = 100000 + (os.getpid() % 30000) * 4096
    with _blocks_lock:
        used = {first + (uid - first) // 256 * 256 for uid in processes_by_uid(range(first, first + 16 * 256))}
        for base in range(first, first + 16 * 256, 256):
            if base not in _blocks_held and base not in used:
                _blocks_held.add(base)
                return base
    raise RuntimeError("16 sandbox pools are already open in this process (or their uids are in "
                       "use by other processes): close one before opening another")


def _release_uid_block(base: int) -> None:
    with _blocks_lock:
        _blocks_held.discard(base)


class SandboxPool:
    """Judge programs in parallel sandboxes. Use as a context manager or call :meth:`close`."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self.info = probe()
        if not self.info["bwrap"] or not self.info["root"] or not self.info["seccomp"]:
            raise SandboxUnavailable("the code sandbox needs bubblewrap, root and libseccomp; missing: "
                                     + ", ".join(self.info["missing"]))
        self.missing = list(self.info["missing"])
        if self.missing:
            print("posttrain sandbox: WARNING: weaker isolation on this machine, missing: "
                  + "; ".join(self.missing), file=sys.stderr)
        self.stats = collections.Counter()
        self._lock = threading.Lock()
        self._recent: collections.deque[bool] = collections.deque(maxlen=self.cfg.breaker_window)
        self.tripped: str | None = None
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=self.cfg.queue_size)
        self._uid_base = _claim_uid_block(self.cfg.n_workers)
        self.workers: list[Worker | None] = [None] * self.cfg.n_workers
        self._threads = [threading.Thread(target=self._loop, args=(slot,), daemon=True,
                                          name=f"sandbox-{slot}") for slot in range(self.cfg.n_workers)]
        for t in self._threads:
            t.start()

    # -------------------------------------------------------------------------- public API
    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue one job; blocks while the queue is full. The future's result is
        ``(Outcome, time_s)``."""
        if self.tripped:
            raise CircuitOpen(self.tripped)
        if self._closed:  # no worker would take it: its future, and a deadline charged for it, would never end
            raise RuntimeError("the sandbox pool is closed")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        charge(fut)  # before the put: a full queue's wait is time on the pool too
        self._queue.put((job, fut))
        return fut

    def run(self, jobs: list[Job]) -> list[Outcome]:
        """Judge a batch; outcomes in the order of ``jobs``. Raises CircuitOpen if it trips."""
        return [outcome for outcome, _ in self.run_timed(jobs)]

    def run_timed(self, jobs: list[Job]) -> list[tuple[Outcome, float]]:
        """Like :meth:`run`, with each program's time inside the sandbox in seconds."""
        futures = []
        for job in jobs:
            futures.append(self.submit(job))
        return [f.result() for f in futures]

    async def run_async(self, jobs: list[Job]) -> list[Outcome]:
        """The same as :meth:`run` without blocking the event loop."""
        import asyncio  # here, not at the top: it costs the CLI a fifth of its start-up

        return await asyncio.to_thread(self.run, jobs)

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)
        if not any(t.is_alive() for t in self._threads):  # each thread dropped its sandbox last
            _release_uid_block(self._uid_base)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------- internals
    def _loop(self, slot: int) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if self.tripped:
                    raise CircuitOpen(self.tripped)
                fut.set_result(self._judge(slot, job))
            except BaseException as e:  # the future carries it to the caller
                fut.set_exception(e)
        self._drop(slot)

    def _judge(self, slot: int, job: Job) -> tuple[Outcome, float]:
        last = ""
        for attempt in range(self.cfg.max_retries + 1):
            try:
                worker = self._ready_worker(slot)
                reply = worker.run(job.request(self.cfg))
                outcome = job.outcome(reply)
            except WorkerError as e:
                last = str(e)
                self._drop(slot)
                self._record(failed=True, what="infra_errors")
                if attempt < self.cfg.max_retries:
                    self._count("retries")
                continue
            self._record(failed=False, what="programs")
            return self._note(outcome), float(reply["time_s"])
        self._count("infra_fail")
        return self._note(Outcome.infra_fail("sandbox", f"after {self.cfg.max_retries + 1} tries: {last}")), 0.0

    def _note(self, outcome: Outcome) -> Outcome:
        """Every outcome names the isolation this machine lacks, so it is never silently weaker."""
        if not self.missing:
            return outcome
        return dataclasses.replace(outcome, detail=f"{outcome.detail} [isolation missing: "
                                   + "; ".join(self.missing) + "]")

    def _ready_worker(self, slot: int) -> Worker:
        w = self.workers[slot]
        if w is not None and w.programs >= self.cfg.recycle_after:
            self._drop(slot)
            self._count("recycled")
            w = None
        if w is None:
            w = Worker(self.cfg, slot, self._uid_base, self.info)
            self.workers[slot] = w
            self._count("started")
            self._canaries(slot, w)
        elif self.cfg.canary_every and w.programs and w.programs % self.cfg.canary_every == 0:
            self._canaries(slot, w)
        return w

    def _canaries(self, slot: int, w: Worker) -> None:
        """Raise WorkerError (so the worker is replaced) if any canary gets the wrong verdict."""
        for name, job, (cls, reason) in CANARIES:
            got = job.outcome(w.run(job.request(self.cfg)))
            w.programs -= 1  # canaries do not count towards recycling or the next canary round
            if (got.cls.value, got.reason) != (cls, reason):
                self._count("canary_failures")
                raise WorkerError(f"canary {name!r} gave {got.cls.value}/{got.reason}, "
                                  f"expected {cls}/{reason}")
        self._count("canary_rounds")

    def _drop(self, slot: int) -> None:
        w, self.workers[slot] = self.workers[slot], None
        if w is not None:
            w.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _record(self, failed: bool, what: str) -> None:
        with self._lock:
            self.stats[what] += 1
            self._recent.append(failed)
            n = len(self._recent)
            bad = sum(self._recent)
            if n >= min(10, self.cfg.breaker_window) and bad / n > self.cfg.breaker_threshold:
                self.tripped = (f"sandbox circuit breaker open: {bad} of the last {n} runs failed "
                                f"in the machinery (threshold {self.cfg.breaker_threshold:.0%}); "
                                "check bubblewrap, cgroups and host load")
