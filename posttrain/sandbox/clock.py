"""Time a caller spends on the sandbox pool, told to whoever holds a hang deadline over it.

The episode runner ends an environment's ``step`` that overruns ``step_timeout_s`` as a hung
environment (INFRA_FAIL, masked). Time the step spends on the pool is not the environment
hanging: queued behind other episodes' programs it is nobody's fault, and running its own
program it is bounded by the pool itself — the program's wall-clock limit from when it starts
(MODEL_FAIL timeout), a sandbox's reply deadline and retries (INFRA_FAIL sandbox). Counted
against the step, a busy pool would turn the program's own timeout, and healthy episodes queued
behind it, into masked outcomes a policy could provoke.

So the runner runs each step under a `PoolClock` (`charged_to`); a pool (`SandboxPool`, the
verifier farm) charges the caller's clock (`charge`) from the moment it takes a job — a full queue's
back-pressure included — until the job's future resolves, and the runner moves the step's
deadline on by `PoolClock.seconds`. Jobs of one step that overlap count once. Time outside the
pool (a tool that sleeps or loops in the environment's own process) still counts in full.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from concurrent.futures import Future
from typing import Iterator


class PoolClock:
    """Seconds during which at least one of a caller's jobs was on a sandbox pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs = 0
        self._since = 0.0
        self._total = 0.0

    def seconds(self) -> float:
        """So far, the time on the pool now included."""
        with self._lock:
            return self._total + (time.monotonic() - self._since if self._jobs else 0.0)

    def hold(self, fut: Future) -> None:
        """Count from now until ``fut`` is done."""
        with self._lock:
            if not self._jobs:
                self._since = time.monotonic()
            self._jobs += 1
        fut.add_done_callback(self._release)

    def _release(self, _fut: Future) -> None:
        with self._lock:
            self._jobs -= 1
            if not self._jobs:
                self._total += time.monotonic() - self._since


# A context variable, not a thread-local: asyncio.to_thread (the pools' run_async) carries it along.
_CURRENT: contextvars.ContextVar[PoolClock | None] = contextvars.ContextVar("pool_clock", default=None)


@contextlib.contextmanager
def charged_to(clock: PoolClock) -> Iterator[PoolClock]:
    """Charge the pool jobs submitted in this context to ``clock``."""
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)


def charge(fut: Future) -> None:
    """Called by a pool as it takes a job: the submitter's clock, if any, counts until ``fut`` is done."""
    clock = _CURRENT.get()
    if clock is not None:
        clock.hold(fut)
