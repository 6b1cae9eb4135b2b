"""`EngineWorker`: the one thread that touches the engine, and the batching of requests.

`TorchEngine` is not thread-safe and its `generate` blocks for the whole decode, so it lives on a
dedicated thread fed by a queue. HTTP handlers (on the event loop) put jobs in the queue and await
an asyncio future the worker resolves. Each round the worker

1. blocks for the first job, then keeps taking jobs while they keep arriving (a gap of at most
   ``batch_wait_s`` between two, so requests sent together by a client land in one round), up to
   ``max_batch_prompts`` prompts or the first weight-update job;
2. groups the generation jobs by sampling parameters and runs one ``engine.generate`` per group,
   with all the group's prompts;
3. runs the weight-update job, if one closed the round, after those generations: a reload never
   overlaps a generate, and requests queued behind it see the new weights.

Grouping follows the engine's seed semantics: one `generate` call samples prompt ``i`` from a stream
seeded with ``prompt_seed(SamplingParams.seed, i)``, so a row's samples depend on the call's seed
and on the prompt's place in the call. Hence

* greedy requests (temperature 0) batch together whatever their seed (no randomness is drawn);
* unseeded sampled requests batch together (the engine draws a fresh seed for the call);
* a seeded sampled request runs **alone**, as ``engine.generate(its_prompts, n, params)``, so a
  seed reproduces exactly what `TorchEngine` gives for the same prompts, seed and weights.

With ``batch_seeded=True`` (``posttrain serve --batch-seeded``) seeded sampled requests batch like
unseeded ones, for throughput: a call that holds several is seeded with a hash of their seeds in
arrival order, so it is reproducible for the same batch, but a request no longer matches a
`TorchEngine` call on its own prompts. A seeded request that ends up alone in its call still does.

Requests also group only with identical ``n``, ``max_tokens``, stop strings, top-k/top-p,
temperature and ``ignore_eos``. When a batched call raises, its requests are retried one by one so a
failure stays with the request that caused it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.rollout.types import Rollouts, SamplingParams

log = logging.getLogger("posttrain.serve")


@dataclass(eq=False)
class _Job:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    prompts: list[list[int]] = field(default_factory=list)
    n: int = 1
    sampling: SamplingParams | None = None
    call: Callable[[Any], Any] | None = None  # control job: fn(engine), run between generation rounds

    def key(self, batch_seeded: bool):
        s = self.sampling
        base = (self.n, s.max_new_tokens, tuple(s.stop), s.ignore_eos)
        if s.greedy:
            return ("greedy",) + base
        if s.seed is not None and not batch_seeded:
            return ("seeded", id(self))
        return ("sampled", s.temperature, s.top_p, s.top_k) + base


def _resolve(future: asyncio.Future, value=None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and the handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


_STOP = object()


class EngineWorker:
    """Owns ``engine`` on one thread; see the module docstring."""

    def __init__(self, engine, *, max_batch_prompts: int = 256, batch_wait_s: float = 0.005,
                 batch_seeded: bool = False):
        if max_batch_prompts < 1:
            raise ValueError(f"max_batch_prompts must be >= 1, got {max_batch_prompts}")
        self.engine = engine
        self.max_batch_prompts = max_batch_prompts
        self.batch_wait_s = batch_wait_s
        self.batch_seeded = batch_seeded
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.generate_calls = 0
        """Number of ``engine.generate`` calls made (requests batched together share one)."""
        self.requests_served = 0

    # ---------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="posttrain-serve-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---------------------------------------------------------------------------- submitting

    async def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts:
        loop = asyncio.get_running_loop()
        job = _Job(loop=loop, future=loop.create_future(), prompts=prompts, n=n, sampling=sampling)
        self._submit(job)
        return await job.future

    async def call(self, fn: Callable[[Any], Any]):
        """Run ``fn(engine)`` on the worker thread between generation rounds; returns its result."""
        loop = asyncio.get_running_loop()
        job = _Job(loop=loop, future=loop.create_future(), call=fn)
        self._submit(job)
        return await job.future

    def _submit(self, job: _Job) -> None:
        if not self.alive:
            raise RuntimeError("the engine worker is not running")
        self._queue.put(job)

    # ---------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs, stop = self._collect(first)
            first = None
            try:
                self._round(jobs)
            except BaseException as e:  # never let the thread die: fail what is left
                log.exception("engine worker round failed")
                for job in jobs:
                    job.loop.call_soon_threadsafe(_resolve, job.future, None, RuntimeError(f"engine worker: {e}"))
            # Drop this round's jobs now: an idle worker must not pin their results or a weight update's
            # tensors until the next request comes.
            jobs = None
            if stop:
                return

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs = [first]
        if first.call is not None:
            return jobs, False
        prompts = len(first.prompts)
        deadline = time.monotonic() + 20 * self.batch_wait_s
        while prompts < self.max_batch_prompts:
            wait = min(self.batch_wait_s, deadline - time.monotonic())
            try:
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return jobs, True
            jobs.append(job)
            if job.call is not None:
                break
            prompts += len(job.prompts)
        return jobs, False

    def _round(self, jobs: list[_Job]) -> None:
        control = jobs[-1] if jobs[-1].call is not None else None
        groups: dict[Any, list[_Job]] = {}
        for job in jobs:
            if job.call is None:
                groups.setdefault(job.key(self.batch_seeded), []).append(job)
        for group in groups.values():
            self._generate(group)
        if control is not None:
            fn, control.call = control.call, None
            try:
                value, error = fn(self.engine), None
            except Exception as e:
                value, error = None, e
            del fn
            control.loop.call_soon_threadsafe(_resolve, control.future, value, error)

    def _generate(self, group: list[_Job]) -> None:
        live = [j for j in group if not j.future.done()]  # skip requests whose client left
        if not live:
            return
        first = live[0]
        sampling = first.sampling
        if len(live) > 1:  # greedy: no seed needed; sampled (batch_seeded): one seed from all of theirs
            seeds = [j.sampling.seed for j in live]
            seed = None
            if not sampling.greedy and any(x is not None for x in seeds):
                seed = int.from_bytes(hashlib.sha256(repr(seeds).encode()).digest()[:8], "big") >> 1
            sampling = dataclasses.replace(sampling, seed=seed)
        prompts = [p for j in live for p in j.prompts]
        try:
            self.generate_calls += 1
            r = self.engine.generate(prompts, first.n, sampling)
        except Exception as e:
            if len(live) > 1:  # find the request at fault: each alone
                for job in live:
                    self._generate([job])
                return
            log.exception("generate failed")
            first.loop.call_soon_threadsafe(_resolve, first.future, None, e)
            return
        offset = 0
        for job in live:
            k = len(job.prompts)
            rows = list(range(offset * job.n, (offset + k) * job.n))
            part = r.select(rows, [r.prompt_idx[i] - offset for i in rows])
            offset += k
            self.requests_served += 1
            job.loop.call_soon_threadsafe(_resolve, job.future, part, None)
