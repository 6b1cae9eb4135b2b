"""Which rollout servers are in the rotation, and which one a request goes to.

A request goes to the live server with the fewest requests in flight, preferring servers it has not
tried yet (round robin among equals). A server that stops answering — a request or a push failed
and ``GET /health`` gets no answer — leaves the rotation: it is gone, not refusing. One this client
launched (``servers``) is relaunched in the background, handed the newest weights (``rejoin``) and
put back once it confirmed them, at most ``max_relaunches`` times; the warning names its log and
its last error lines (``servers.last_errors``). With no server left a request waits for a
relaunch in progress (it may take minutes); with none in progress, `ServersDown` (an
`EngineError`) ends the run.
"""

from __future__ import annotations

import threading
from typing import Callable

import httpx

from posttrain.rollout.http.transport import one_line
from posttrain.rollout.protocol import EngineError


class ServersDown(EngineError):
    """Every rollout server stopped answering: the run checkpoints and stops (exit 1)."""


class ServerPool:
    """The servers at ``urls`` (see the module docstring). ``health`` is the client ``/health`` is
    asked with; ``servers`` (with ``restart(index)`` and ``last_errors(index)``) are the ones this
    client launched."""

    def __init__(self, urls: list[str], health: httpx.Client, *, servers=None, max_relaunches: int = 2,
                 printer=print):
        self.urls, self.health, self.servers = urls, health, servers
        self.max_relaunches, self.printer = max_relaunches, printer
        self.restarts = 0  # servers relaunched (`EngineHandle.restarts`)
        self.rejoin: Callable[[str], int] | None = None
        """Hands a relaunched server the newest weights and puts it back (`WeightSync.rejoin`);
        returns the version it then holds."""
        self._dead: set[str] = set()  # out of the rotation: not answering, or relaunching
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a server came back or a relaunch gave up
        self._relaunching = 0
        self._inflight = dict.fromkeys(urls, 0)
        self._next = 0  # round-robin tie break

    @property
    def relaunching(self) -> int:
        """Servers being relaunched now (out of the rotation until they confirm the newest weights)."""
        with self._lock:
            return self._relaunching

    def live_urls(self) -> list[str]:
        with self._lock:
            return [u for u in self.urls if u not in self._dead]

    @property
    def live(self) -> int:
        """Servers in the rotation."""
        with self._lock:
            return len(self.urls) - len(self._dead)

    def acquire(self, tried: list[str]) -> str:
        """The live server with the fewest requests in flight, preferring ones this request has not
        tried, counted in flight until `release`; with none left, it waits for a relaunch in
        progress, and raises `ServersDown` when there is none."""
        with self._lock:
            live = [u for u in self.urls if u not in self._dead]
            while not live and self._relaunching:
                self._changed.wait()
                live = [u for u in self.urls if u not in self._dead]
            if not live:
                raise self.down()
            fresh = [u for u in live if u not in tried] or live
            order = fresh[self._next % len(fresh):] + fresh[:self._next % len(fresh)]
            url = min(order, key=lambda u: self._inflight[u])
            self._next += 1
            self._inflight[url] += 1
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self._inflight[url] -= 1

    def down(self) -> ServersDown:
        note = ("restart them and resume the run" if self.servers is None else
                f"{self.restarts} relaunched (at most {self.max_relaunches}: asynchrony.max_engine_restarts)")
        return ServersDown(f"every rollout server stopped answering ({', '.join(self.urls)}); {note}")

    def back(self, url: str) -> None:
        """A relaunched server joins the rotation again."""
        with self._lock:
            self._dead.discard(url)
            self._changed.notify_all()

    def check_alive(self, url: str) -> bool:
        """False, and the server leaves the rotation (a launched one is relaunched), when it does not
        answer ``GET /health``: it is gone, not refusing. True while it answers."""
        try:
            if self.health.get(f"{url}/health", timeout=5.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        with self._lock:
            if url in self._dead:
                return False
            self._dead.add(url)
            live = len(self.urls) - len(self._dead)
            relaunch = self.servers is not None and self.restarts < self.max_relaunches
            if relaunch:
                self.restarts += 1
                self._relaunching += 1
        why = "" if self.servers is None else f"; {self.servers.last_errors(self.urls.index(url))}"
        self.printer(f"WARNING [server_lost] rollout server {url} stopped answering; {live} of "
                     f"{len(self.urls)} left{why}")
        if relaunch:
            threading.Thread(target=self._relaunch, args=(url,), name="relaunch-server", daemon=True).start()
        return False

    def _relaunch(self, url: str) -> None:
        """Start a launched server again, hand it the newest weights, and put it back in rotation."""
        try:
            self.servers.restart(self.urls.index(url))
            version = self.rejoin(url)
            self.printer(f"[server_back] rollout server {url} relaunched with weights version {version}")
        except Exception as e:  # noqa: BLE001 - a background thread: report, the server stays out
            self.printer(f"WARNING [server_lost] could not relaunch rollout server {url}: {one_line(e)}")
        finally:
            with self._lock:
                self._relaunching -= 1
                self._changed.notify_all()
