"""Async RL's side of `HTTPEngine` (`EngineHandle.submit` / ``poll``): each submitted call runs in a
thread as a `generate` would, and `poll` collects the answers; the seconds with no call in flight
are counted as time the servers had nothing from this client to do."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait as wait_for
from typing import Callable

from posttrain.rollout.http.completions import AllTriesFailed
from posttrain.rollout.protocol import EngineError, Generated, Lost
from posttrain.rollout.types import Rollouts


class Submissions:
    """Calls running in the background, by request id. ``wait_limit_s``: how long `poll` waits for
    an answer before it gives up (every try of a request timed out by then)."""

    def __init__(self, max_inflight: int, wait_limit_s: float):
        self.max_inflight, self.wait_limit_s = max_inflight, wait_limit_s
        self.pending: dict[int, tuple[Future, float]] = {}  # rid -> (the call, when it was sent)
        self._rid = 0
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._idle_since: float | None = time.perf_counter()
        self._idle_total, self._calls = 0.0, 0

    def submit(self, call: Callable[[], Rollouts]) -> int:
        """Run ``call`` in the background; its answer comes from `poll` (a `Generated`, or `Lost`
        when it raised `AllTriesFailed`)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self.max_inflight, thread_name_prefix="http-submit")
        self._rid += 1
        with self._lock:
            self._busy(+1)
        t0 = time.perf_counter()

        def counted() -> Rollouts:
            try:
                return call()
            finally:
                with self._lock:
                    self._busy(-1)

        self.pending[self._rid] = (self._threads.submit(counted), t0)
        return self._rid

    def poll(self, wait: bool) -> list[Generated | Lost]:
        """Answers of submitted calls, in submission order; with ``wait``, at least one (or
        `EngineError` once a call outlasts every try's timeout)."""
        if wait and self.pending and not any(f.done() for f, _ in self.pending.values()):
            limit = self.wait_limit_s
            done, _ = wait_for([f for f, _ in self.pending.values()], timeout=limit, return_when=FIRST_COMPLETED)
            if not done:
                raise EngineError(f"no rollout server answered requests {sorted(self.pending)} within {limit:g} s "
                                  f"(rollout.request_timeout_s x tries)")
        elif wait and not self.pending:
            raise EngineError("poll(wait=True) with no request in flight would wait forever")
        out = []
        for rid in [r for r, (f, _) in self.pending.items() if f.done()]:
            future, t0 = self.pending.pop(rid)
            try:
                out.append(Generated(rid, future.result(), time.perf_counter() - t0, self.idle_s))
            except AllTriesFailed as e:
                out.append(Lost(rid, str(e)))
        return out

    @property
    def idle_s(self) -> float:
        """Seconds with no submitted call in flight (what the servers had nothing from us to do)."""
        with self._lock:
            since = self._idle_since
            return self._idle_total + (time.perf_counter() - since if since is not None else 0.0)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _busy(self, delta: int) -> None:
        """Count submitted calls in flight (under ``_lock``), timing the spans with none."""
        self._calls += delta
        if self._calls == 0:
            self._idle_since = time.perf_counter()
        elif delta > 0 and self._calls == 1 and self._idle_since is not None:
            self._idle_total += time.perf_counter() - self._idle_since
            self._idle_since = None
