"""The verifier farm: sandbox pools as Ray actors, behind the interface of one `SandboxPool`.

`VerifierFarm` has what the code verifier uses of a pool — ``run(jobs)``, ``run_timed``,
``submit(job)`` (a future of ``(Outcome, time_s)``), ``run_async``, ``close``, ``stats`` — so
``verifier: code`` judges on many machines without knowing it. Design choices:

- **One actor, one pool.** Each `SandboxActor` owns a `SandboxPool` with ``cfg.cpus`` sandboxes
  and reserves that many CPUs from Ray; the pool keeps its own canaries, retries and circuit
  breaker. At start an actor builds its pool (which refuses to start without bubblewrap, root
  and libseccomp on that node) and runs the canaries once; an actor that gets one wrong is
  killed and another started.
- **Batches, not calls.** A dispatcher thread sends each actor batches of programs (a share of
  what is pending, at most ``4 * cpus``), two batches in flight per actor so its sandboxes never
  wait for a round trip; actors run their two batches concurrently on their pool.
- **Faults.** A program whose outcome is INFRA_FAIL (its actor's pool already retried it) is sent
  again to another actor, up to ``max_retries`` more times, and only then is it INFRA_FAIL: masked
  by the RL loop, never a wrong answer. An actor that dies (``ray.kill``, its node lost), whose
  pool's circuit breaker opens, that raises, or that does not answer a request in time is
  drained — its in-flight programs go back to the queue, counted as a try, and are preferably
  sent to an actor that has not tried them — and a replacement is started.
- **Every wait has a timeout** (actor start, each request) and its message names the actor, its
  node and the request. When replacements keep failing (``3 * replicas`` in a row without a good
  batch in between) the farm trips like a pool's breaker: every pending and later program raises
  `CircuitOpen`, which stops the run.

Ray is imported when a farm is made, never by importing this module (the laptop path stays free
of Ray).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import math
import os
import queue
import socket
import threading
import time

from posttrain.outcome import Outcome, OutcomeClass
from posttrain.sandbox.clock import charge
from posttrain.sandbox.pool import CANARIES, CircuitOpen, Job, SandboxPool, SandboxUnavailable
from posttrain.sandbox.worker import SandboxConfig

DEPTH = 2  # batches in flight per actor: one running while the next is on its way
# Counters reported from the start (as 0), so a run's metrics show that nothing went wrong.
COUNTERS = ("programs", "requests", "retries", "infra_fail", "actors_started", "actors_replaced", "actor_deaths",
            "breaker_trips", "timeouts", "canary_failures", "start_failures", "actor_errors")


class SandboxActor:
    """A `SandboxPool` inside a Ray actor (Ray makes it remote: ``ray.remote(SandboxActor)``)."""

    def __init__(self, cfg: SandboxConfig, name: str):
        self.name = name
        self.pool = SandboxPool(dataclasses.replace(cfg, workers=cfg.cpus, replicas=0))

    def ready(self) -> dict:
        """Run the canaries once; where this actor lives and which canaries it got wrong."""
        got = self.pool.run([job for _, job, _ in CANARIES])
        wrong = [f"{name} gave {o.cls.value}/{o.reason}" for (name, _, want), o in zip(CANARIES, got)
                 if (o.cls.value, o.reason) != want]
        return {"node": socket.gethostname(), "pid": os.getpid(), "missing": self.pool.missing, "wrong": wrong}

    def run(self, jobs: list[Job]) -> tuple[list[tuple[Outcome, float]], dict]:
        """Judge a batch: ``(outcome, time_s)`` per job, and the pool's counters so far."""
        return self.pool.run_timed(jobs), dict(self.pool.stats)

    def close(self) -> None:
        self.pool.close()


@dataclasses.dataclass(eq=False)
class _Task:
    job: Job
    fut: concurrent.futures.Future
    tries: int = 0
    tried: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass(eq=False)
class _Actor:
    name: str
    handle: object
    node: str = ""
    ready: bool = False
    inflight: int = 0


@dataclasses.dataclass(eq=False)
class _Request:
    rid: int
    actor: _Actor
    tasks: list
    deadline: float


class VerifierFarm:
    """Judge programs on ``cfg.replicas`` sandbox actors. Use as a context manager or call `close`.

    ``actor_class`` is the actor's Python class (a `SandboxActor` or a subclass: tests inject
    faults with one). ``request_timeout_s`` overrides the per-request limit, which by default is
    the longest a batch can legitimately take (every program timing out on every retry)."""

    def __init__(self, cfg: SandboxConfig, address: str = "", num_cpus: int = 0, *,
                 actor_class: type = SandboxActor, start_timeout_s: float = 120.0,
                 request_timeout_s: float | None = None):
        from posttrain.distributed.cluster import connect

        if cfg.replicas < 1:
            raise ValueError("a verifier farm needs replicas >= 1")
        self.cfg, self.start_timeout_s, self.request_timeout_s = cfg, start_timeout_s, request_timeout_s
        self.ray = connect(address, num_cpus or None)
        self._remote = self.ray.remote(actor_class)
        self._names = itertools.count()
        self._rids = itertools.count()
        self._counts: collections.Counter = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self._pool_stats: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._incoming: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
        self._pending: collections.deque[_Task] = collections.deque()
        self._requests: dict = {}  # ObjectRef -> _Request
        self._starting: dict = {}  # ObjectRef of ready() -> (_Actor, deadline)
        self.actors: list[_Actor] = []
        self._bad_in_row = 0
        self.tripped: str | None = None
        self._stop = threading.Event()
        self._start_all()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="verifier-farm")
        self._thread.start()

    # -------------------------------------------------------------------------- public API
    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue one job; the future's result is ``(Outcome, time_s)``."""
        return self._enqueue([job])[0]

    def run(self, jobs: list[Job]) -> list[Outcome]:
        """Judge a batch; outcomes in the order of ``jobs``. Raises CircuitOpen if the farm trips."""
        return [outcome for outcome, _ in self.run_timed(jobs)]

    def run_timed(self, jobs: list[Job]) -> list[tuple[Outcome, float]]:
        """Like `run`, with each program's time inside its sandbox in seconds."""
        return [f.result() for f in self._enqueue(list(jobs))]

    async def run_async(self, jobs: list[Job]) -> list[Outcome]:
        import asyncio

        return await asyncio.to_thread(self.run, jobs)

    @property
    def stats(self) -> collections.Counter:
        """The farm's counters, plus ``pool/<key>`` summed over every actor's pool (dead ones too)."""
        with self._lock:
            out = collections.Counter(self._counts)
            for pool_stats in self._pool_stats.values():
                for k, v in pool_stats.items():
                    out[f"pool/{k}"] += v
        return out

    def close(self) -> None:
        """Stop dispatching, close every actor's pool (30 s at most), then end the actors."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._fail_all(RuntimeError("the verifier farm was closed"))
        if self.actors and self.ray.is_initialized():  # at exit Ray may have shut down first
            refs = [a.handle.close.remote() for a in self.actors]
            self.ray.wait(refs, num_returns=len(refs), timeout=30)
            self._shutdown_actors()
        self.actors = []

    def __enter__(self) -> "VerifierFarm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------- actors
    def _start_actor(self) -> None:
        name = f"sandbox-{next(self._names)}"
        handle = self._remote.options(num_cpus=self.cfg.cpus, max_concurrency=DEPTH + 1,
                                      max_restarts=0).remote(self.cfg, name)
        actor = _Actor(name, handle)
        self.actors.append(actor)
        self._starting[handle.ready.remote()] = (actor, time.monotonic() + self.start_timeout_s)
        self._count("actors_started")

    def _start_all(self) -> None:
        """Start ``replicas`` actors and wait for them: a farm that cannot start says why, once."""
        for _ in range(self.cfg.replicas):
            self._start_actor()
        refs = list(self._starting)
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        for ref in refs:
            actor, _ = self._starting.pop(ref)
            why = self._start_error(ref, actor) if ref in done else (
                f"did not start within {self.start_timeout_s:.0f} s (no node with {self.cfg.cpus} free CPUs, "
                "or its sandboxes hang)")
            if why:
                self._shutdown_actors()
                raise SandboxUnavailable(f"verifier farm: sandbox actor {actor.name}{self._where(actor)}: {why}")

    def _start_error(self, ref, actor: _Actor) -> str:
        """Why the actor behind this ready() reply cannot take work; empty when it can."""
        try:
            info = self.ray.get(ref)
        except Exception as e:  # the pool refused to start on that node, or the actor died
            return _cause(e)
        actor.node = info["node"]
        if info["wrong"]:
            self._count("canary_failures")
            return "canaries failed: " + "; ".join(info["wrong"])
        actor.ready = True
        return ""

    def _shutdown_actors(self) -> None:
        for a in self.actors:
            self.ray.kill(a.handle, no_restart=True)
        self.actors = []

    def _drain(self, actor: _Actor, why: str, counter: str) -> None:
        """Kill a sick actor, send its in-flight programs elsewhere, start a replacement."""
        self._count(counter)
        self._bad_in_row += 1
        for ref, req in list(self._requests.items()):
            if req.actor is actor:
                del self._requests[ref]
                self._retry(req.tasks, actor, why)
        for ref, (starting, _) in list(self._starting.items()):
            if starting is actor:
                del self._starting[ref]
        if actor in self.actors:
            self.actors.remove(actor)
        self.ray.kill(actor.handle, no_restart=True)
        if self._bad_in_row >= 3 * self.cfg.replicas:
            self._trip(f"verifier farm: {self._bad_in_row} sandbox actors failed in a row, the last "
                       f"{actor.name}{self._where(actor)}: {why}")
            return
        self._count("actors_replaced")
        self._start_actor()

    @staticmethod
    def _where(actor: _Actor) -> str:
        return f" on {actor.node}" if actor.node else ""

    # -------------------------------------------------------------------------- dispatch
    def _enqueue(self, jobs: list[Job]) -> list[concurrent.futures.Future]:
        if self.tripped:
            raise CircuitOpen(self.tripped)
        tasks = [_Task(job, concurrent.futures.Future()) for job in jobs]
        for t in tasks:
            charge(t.fut)  # its time here is not the caller's (`posttrain.sandbox.clock`)
        if tasks:
            self._incoming.put(tasks)
        return [t.fut for t in tasks]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._take_incoming()
                self._dispatch()
                self._collect()
                self._check_overdue()
            except Exception as e:  # a bug here, or Ray gone: no caller may be left waiting
                self._trip(f"verifier farm: dispatcher failed: {type(e).__name__}: {e}")
                return

    def _take_incoming(self) -> None:
        idle = not self._pending and not self._requests and not self._starting
        try:
            item = self._incoming.get(timeout=0.1) if idle else self._incoming.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._pending.extend(item)
            try:
                item = self._incoming.get_nowait()
            except queue.Empty:
                item = None
        if self.tripped:
            self._fail_all(CircuitOpen(self.tripped))

    def _dispatch(self) -> None:
        ready = [a for a in self.actors if a.ready]
        if not ready or not self._pending:
            return
        size = max(1, min(4 * self.cfg.cpus, math.ceil(len(self._pending) / (len(ready) * DEPTH))))
        for actor in sorted(ready, key=lambda a: a.inflight):
            while actor.inflight < DEPTH and self._pending:
                tasks = self._take_for(actor, size, {a.name for a in ready})
                if not tasks:
                    break
                self._send(actor, tasks)

    def _take_for(self, actor: _Actor, size: int, live: set) -> list[_Task]:
        """Up to ``size`` pending tasks for ``actor``: ones it has not tried first, then ones
        every live actor has tried (they have nowhere better to go)."""
        picked, kept = [], collections.deque()
        while self._pending and len(picked) < size:
            t = self._pending.popleft()
            (picked if actor.name not in t.tried or live <= t.tried else kept).append(t)
        self._pending.extendleft(reversed(kept))
        return picked

    def _send(self, actor: _Actor, tasks: list[_Task]) -> None:
        rid = next(self._rids)
        limit = self.request_timeout_s or self._request_limit(tasks)
        ref = actor.handle.run.remote([t.job for t in tasks])
        self._requests[ref] = _Request(rid, actor, tasks, time.monotonic() + limit)
        actor.inflight += 1
        self._count("requests")

    def _request_limit(self, tasks: list[_Task]) -> float:
        """The longest a batch may take when every program times out on every pool retry, with
        the actor's other batch sharing its sandboxes."""
        longest = max((t.job.timeout_s or self.cfg.timeout_s) * (len(t.job.io) or 1) for t in tasks)
        per_program = (longest + 10.0) * (self.cfg.max_retries + 1)
        return math.ceil(DEPTH * len(tasks) / self.cfg.cpus) * per_program + 60.0

    def _collect(self) -> None:
        refs = list(self._requests) + list(self._starting)
        if not refs:
            return
        done, _ = self.ray.wait(refs, num_returns=1, timeout=0.05)
        if done:
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            if ref in self._starting:
                self._started(ref)
            elif ref in self._requests:
                self._answered(ref)

    def _started(self, ref) -> None:
        actor, _ = self._starting.pop(ref)
        why = self._start_error(ref, actor)
        if why:
            self._drain(actor, f"did not start: {why}", "start_failures")

    def _answered(self, ref) -> None:
        req = self._requests.pop(ref)
        req.actor.inflight -= 1
        try:
            results, pool_stats = self.ray.get(ref)
            if len(results) != len(req.tasks):
                raise RuntimeError(f"{len(results)} outcomes for {len(req.tasks)} programs")
        except Exception as e:
            self._actor_failed(req, e)
            return
        self._bad_in_row = 0
        with self._lock:
            self._pool_stats[req.actor.name] = pool_stats
        retry = []
        for task, (outcome, time_s) in zip(req.tasks, results):
            if outcome.cls is OutcomeClass.INFRA_FAIL:
                retry.append(task)
            else:
                self._resolve(task, outcome, time_s)
        if retry:
            self._retry(retry, req.actor, f"INFRA_FAIL on sandbox actor {req.actor.name}"
                        f"{self._where(req.actor)}: {_last_detail(results)}")

    def _actor_failed(self, req: _Request, e: Exception) -> None:
        actor, cause = req.actor, _cause(e)
        what = (f"sandbox actor {actor.name}{self._where(actor)} failed request {req.rid} "
                f"({len(req.tasks)} programs): {cause}")
        if isinstance(getattr(e, "cause", None), CircuitOpen) or isinstance(e, CircuitOpen):
            counter = "breaker_trips"
        elif isinstance(e, self.ray.exceptions.RayActorError):
            counter = "actor_deaths"
        else:
            counter = "actor_errors"
        self._retry(req.tasks, actor, what)
        self._drain(actor, what, counter)

    def _check_overdue(self) -> None:
        now = time.monotonic()
        for ref, req in list(self._requests.items()):
            if now > req.deadline and ref in self._requests:
                self._drain(req.actor, f"sandbox actor {req.actor.name}{self._where(req.actor)} gave no answer "
                            f"to request {req.rid} ({len(req.tasks)} programs) in time", "timeouts")
        for actor, deadline in list(self._starting.values()):
            if now > deadline:
                self._drain(actor, f"did not start within {self.start_timeout_s:.0f} s", "start_failures")

    # -------------------------------------------------------------------------- outcomes
    def _retry(self, tasks: list[_Task], actor: _Actor, why: str) -> None:
        again = []
        for t in tasks:
            t.tries += 1
            t.tried.add(actor.name)
            if t.tries > self.cfg.max_retries:
                self._count("infra_fail")
                self._resolve(t, Outcome.infra_fail("sandbox", f"after {t.tries} tries on the farm: {why}"), 0.0)
            else:
                self._count("retries")
                again.append(t)
        self._pending.extendleft(reversed(again))

    def _resolve(self, task: _Task, outcome: Outcome, time_s: float) -> None:
        self._count("programs")
        if not task.fut.done():
            task.fut.set_result((outcome, time_s))

    def _trip(self, why: str) -> None:
        self.tripped = why
        self._fail_all(CircuitOpen(why))

    def _fail_all(self, error: Exception) -> None:
        tasks = list(self._pending) + [t for req in self._requests.values() for t in req.tasks]
        self._pending.clear()
        self._requests.clear()
        while True:
            try:
                tasks.extend(self._incoming.get_nowait())
            except queue.Empty:
                break
        for t in tasks:
            if not t.fut.done():
                t.fut.set_exception(error)

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1


def _cause(e: Exception) -> str:
    """The one line that says what went wrong in an actor (Ray's error text is a whole traceback)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def _last_detail(results: list) -> str:
    return next((o.detail for o, _ in reversed(results) if o.cls is OutcomeClass.INFRA_FAIL), "")
