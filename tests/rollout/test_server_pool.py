"""`ServerPool` when a launched server dies: the warning names its log and last errors, requests
wait for the relaunch in progress, and `ServersDown` comes only when no relaunch is left."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from posttrain.rollout.http import ServersDown
from posttrain.rollout.http.pool import ServerPool
from posttrain.rollout.vllm_servers import free_port


class Launched:
    """Stands in for `VLLMServers`: a relaunch takes ``restart_s``."""

    def __init__(self, restart_s: float):
        self.restart_s, self.restarted = restart_s, []

    def restart(self, i: int) -> None:
        time.sleep(self.restart_s)
        self.restarted.append(i)

    def last_errors(self, i: int) -> str:
        return f"log /runs/x/vllm_logs/vllm-{i}.log: RuntimeError: CPU Generator does not use offset"


def test_a_request_waits_for_the_relaunch_in_progress_then_servers_down_when_none_is_left():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: /health fails
    notes: list[str] = []
    pool = ServerPool([url], httpx.Client(), servers=Launched(0.5), max_relaunches=1, printer=notes.append)
    pool.rejoin = lambda u: (pool.back(u), 3)[1]
    assert pool.check_alive(url) is False
    assert "vllm_logs/vllm-0.log: RuntimeError: CPU Generator does not use offset" in notes[0], notes
    t0 = time.monotonic()
    assert pool.acquire([]) == url  # not ServersDown: it waited for the relaunch
    assert time.monotonic() - t0 > 0.3
    pool.release(url)
    assert any("[server_back]" in n and "version 3" in n for n in notes), notes
    assert pool.check_alive(url) is False  # dies again; the one relaunch is spent
    with pytest.raises(ServersDown, match="1 relaunched"):
        pool.acquire([])


def test_a_relaunch_that_fails_wakes_the_waiting_requests_with_servers_down():
    url = f"http://127.0.0.1:{free_port()}"

    class Broken(Launched):
        def restart(self, i):
            time.sleep(0.3)
            raise RuntimeError("vLLM server 0 exited with status 1 while starting")

    notes: list[str] = []
    pool = ServerPool([url], httpx.Client(), servers=Broken(0), max_relaunches=2, printer=notes.append)
    pool.rejoin = lambda u: pytest.fail("a server that did not start cannot rejoin")
    got: list[BaseException] = []

    def request():
        try:
            pool.acquire([])
        except ServersDown as e:
            got.append(e)

    pool.check_alive(url)
    waiter = threading.Thread(target=request)
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(got) == 1
    assert any("could not relaunch" in n for n in notes), notes


def test_a_push_while_the_only_server_is_relaunched_stands_and_the_server_rejoins_with_it(tmp_path):
    """Not `ServersDown`: the relaunched server takes the newest version when it is back."""
    from posttrain.rollout.http.gate import RequestGate
    from posttrain.rollout.http.weight_sync import WeightSync

    url = f"http://127.0.0.1:{free_port()}"
    pushed: list[tuple[str, int]] = []

    class Dialect:
        def push(self, client, to, folder, version, checksum, probe):
            pushed.append((to, version))
            return ""

    notes: list[str] = []
    pool = ServerPool([url], httpx.Client(), servers=Launched(1.0), max_relaunches=1, printer=notes.append)
    sync = WeightSync(pool, RequestGate(), Dialect(), httpx.Client(), version=0, weights_dir=str(tmp_path))
    pool.rejoin = sync.rejoin
    assert pool.check_alive(url) is False and pool.relaunching == 1
    sync.load([{"w": torch.ones(2)}], 1, None, None)  # nobody to push to; a relaunch is under way
    assert sync.version == 1 and pushed == []
    assert pool.acquire([]) == url  # waits for the relaunch, which rejoined with version 1
    assert pushed == [(url, 1)] and any("version 1" in n for n in notes), notes
