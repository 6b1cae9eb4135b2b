"""Sandbox fixtures: a one-worker pool shared by a module, and a leak check for adversarial tests.

The sandbox needs bubblewrap and root; on a machine without them these tests are skipped with
the reason (the pool itself refuses to start there, it never runs weaker)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from posttrain.sandbox.pool import CANARIES, SandboxPool, SandboxUnavailable, processes_by_uid
from posttrain.sandbox.worker import SandboxConfig


def _make_pool(**overrides) -> SandboxPool:
    """A pool (one worker, 2 s per program unless overridden); skips where the machine has no sandbox."""
    try:
        return SandboxPool(SandboxConfig(**{"workers": 1, "timeout_s": 2.0, **overrides}))
    except SandboxUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def make_pool():
    return _make_pool


@pytest.fixture(scope="module")
def pool():
    p = _make_pool()
    p.run([CANARIES[0][1]])  # start the worker (and its canaries) before any test measures
    yield p
    p.close()


def pool_uids(p: SandboxPool) -> range:
    return range(p._uid_base, p._uid_base + 2 * p.cfg.n_workers)


def settled(uids: range, timeout_s: float = 5.0) -> list[int]:
    """Sandbox processes beyond one per uid, once there have been none for three looks.

    Between programs a worker keeps one process per uid: the next candidate, forked ahead and
    waiting for its program (program uid), and the judge (judge uid). After its reply a zygote
    still kills the program's processes and forks the next candidate; killed processes take a
    moment to go."""
    deadline, good = time.monotonic() + timeout_s, 0
    while True:
        extra = [p for pids in processes_by_uid(uids).values() if len(pids) > 1 for p in pids]
        good = good + 1 if not extra else 0
        if good >= 3 or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            out.append(f"{pid} " + " ".join(line for line in status if line.startswith(("State", "PPid"))))
        except OSError:
            out.append(f"{pid} gone")
    return out


def owned_entries(uids: range) -> list[str]:
    """Entries in the host's /tmp and /dev/shm owned by a sandbox uid (there must be none)."""
    out = []
    for root in ("/tmp", "/dev/shm"):
        for name in os.listdir(root):
            try:
                if os.lstat(os.path.join(root, name)).st_uid in uids:
                    out.append(os.path.join(root, name))
            except OSError:
                pass
    return out


class Guard:
    """Host state before an attack; ``check`` asserts nothing leaked afterwards."""

    def __init__(self, p: SandboxPool, sentinel: Path):
        self.pool, self.sentinel = p, sentinel
        self.started = p.stats["started"]
        self.usr_mtime = os.stat("/usr").st_mtime_ns
        self.sentinel_bytes = sentinel.read_bytes()

    def check(self) -> None:
        uids = pool_uids(self.pool)
        left = settled(uids)
        assert left == [], f"sandbox processes left behind: {describe(left)}"
        assert self.sentinel.read_bytes() == self.sentinel_bytes, "host file changed"
        assert os.stat("/usr").st_mtime_ns == self.usr_mtime and os.path.exists("/usr/bin/python3.11")
        assert owned_entries(uids) == [], "files left in the host's /tmp or /dev/shm"
        got = self.pool.run([job for _, job, _ in CANARIES])
        assert [(o.cls.value, o.reason) for o in got] == [want for _, _, want in CANARIES], "canaries fail"
        assert self.pool.stats["started"] == self.started, "the sandbox had to be replaced"


@pytest.fixture
def sentinel(tmp_path) -> Path:
    path = tmp_path / "host-secret.txt"
    path.write_text("host secret 8d1f0c\n")
    return path


@pytest.fixture
def guard(pool, sentinel):
    g = Guard(pool, sentinel)
    yield g
    g.check()
