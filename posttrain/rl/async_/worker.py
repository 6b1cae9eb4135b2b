"""The rollout engine in its own process, and the trainer-side handle that talks to it.

``worker_main`` runs in a child process (``spawn``: a clean interpreter, no forked OpenMP state).
It owns a `TorchEngine`, answers `Generate` with `Generated`, and `LoadWeights` with
`WeightsLoaded` carrying the checksum of its own tensors read back after the copy, so the trainer
knows the weights reached the engine, not just the pipe. It exits on `Shutdown` or when the
trainer's end of the pipe closes (the trainer died: no orphan engines after ``kill -9``).

`ProcessEngine` is the trainer's handle (the `EngineHandle` interface). Two daemon threads move
messages: a sender, so a large weight payload never blocks the trainer while the engine is busy
generating, and a receiver, so replies never block the engine on a full pipe while the trainer is
busy training. Every wait has a deadline (`EngineTimeout` names what hung). When the child dies,
the handle starts a new one, sends it the last weights and every unanswered request again (they are
then served by a version at least as new, so the staleness bound still holds); after
``max_restarts`` it raises `EngineDied`.
"""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from typing import Callable

import torch

from posttrain.rollout.protocol import (
    Buckets, EngineDied, EngineError, EngineTimeout, Failed, Generate, Generated, LoadWeights, Probe, Ready,
    Shutdown, WeightsLoaded, engine_checksum, joined, load_and_read_back,
)
from posttrain.rollout.types import Rollouts, SamplingParams, WeightSyncError


def _pack_weights(weights: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in weights.items()}, buf)
    return buf.getvalue()


def _unpack_weights(payload: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(payload), weights_only=True)


def load_into(engine, msg: LoadWeights):
    """Apply a `LoadWeights` to an engine; the reply reads the engine's tensors back."""
    try:
        return WeightsLoaded(msg.version, load_and_read_back(engine, _unpack_weights(msg.payload), msg.version,
                                                             msg.checksum, msg.dtype))
    except WeightSyncError as e:
        return Failed("weights", str(e), version=msg.version)


def worker_main(requests, replies, spec: dict) -> None:
    """The engine process: handle requests in arrival order until told to stop or orphaned."""
    from posttrain.models.hf import quiet_transformers
    from posttrain.rollout import TorchEngine

    quiet_transformers()
    torch.set_num_threads(spec["threads"])
    engine = TorchEngine(spec["path"], dtype=getattr(torch, spec["dtype"]), device=spec["device"])
    replies.send(Ready(version=engine.version, pid=os.getpid()))
    idle = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            msg = requests.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        idle += time.perf_counter() - t0
        if isinstance(msg, Shutdown):
            return
        try:
            replies.send(_handle(engine, msg, idle))
        except (BrokenPipeError, OSError):
            return


def _handle(engine, msg, idle: float):
    if isinstance(msg, LoadWeights):
        return load_into(engine, msg)
    t0 = time.perf_counter()
    try:
        ro = engine.generate(msg.prompts, msg.n, msg.sampling)
    except Exception as e:  # noqa: BLE001 - reported to the trainer, which stops the run
        return Failed("generate", f"{type(e).__name__}: {e}", rid=msg.rid)
    return Generated(rid=msg.rid, rollouts=ro, gen_s=time.perf_counter() - t0, idle_s=idle)


def _default_threads() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


class _Dead:
    """Marker the receiver thread queues when the engine's pipe closes."""


class _Handle:
    """Bookkeeping shared by the process and in-process handles: versions, acks, ready results."""

    def __init__(self, dtype: str):
        self.dtype = dtype  # what every weights message asks the engine to hold, so a restarted one does too
        self.version = 0
        self._rid = 0
        self._pending: dict[int, Generate] = {}
        self._ready: list[Generated] = []
        self._acks: dict[int, str] = {}
        self._last_weights: LoadWeights | None = None

    def _new_request(self, prompts, n, sampling) -> Generate:
        self._rid += 1
        req = Generate(rid=self._rid, prompts=[list(p) for p in prompts], n=n, sampling=sampling)
        self._pending[req.rid] = req
        return req

    def _weights_message(self, weights, version: int, checksum: str, dtype: str | None = None) -> LoadWeights:
        if version < self.version:
            raise WeightSyncError(f"version {version} is older than the version already sent ({self.version})")
        self.dtype = dtype or self.dtype
        msg = LoadWeights(version=version, checksum=checksum, payload=_pack_weights(weights), dtype=self.dtype)
        self._acks[version] = engine_checksum(weights, checksum, getattr(torch, self.dtype))
        self.version, self._last_weights = version, msg
        return msg

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None:
        """`RolloutEngine.load_version`: the engine takes one whole dict (`load_weights`), in
        ``dtype`` when given; the checksum it reads back is the proof, so the probe adds nothing."""
        self.load_weights(joined(buckets), version, digest(), dtype)

    def _on_reply(self, msg) -> None:
        if isinstance(msg, Generated):
            if self._pending.pop(msg.rid, None) is not None:
                self._ready.append(msg)
        elif isinstance(msg, WeightsLoaded):
            expected = self._acks.pop(msg.version, None)
            if expected is not None and expected != msg.engine_checksum:
                raise WeightSyncError(f"weights of version {msg.version} did not reach the engine intact: "
                                      f"it holds {msg.engine_checksum[:12]}, expected {expected[:12]}")
        elif isinstance(msg, Failed):
            if msg.what == "weights":
                raise WeightSyncError(f"the engine refused weights of version {msg.version}: {msg.message}")
            raise EngineError(f"the engine failed on generate request {msg.rid}: {msg.message}")

    def _take_ready(self, rid: int | None = None) -> list[Generated]:
        if rid is None:
            out, self._ready = self._ready, []
            return out
        mine = [g for g in self._ready if g.rid == rid]
        self._ready = [g for g in self._ready if g.rid != rid]
        return mine

    @property
    def in_flight(self) -> int:
        return len(self._pending)


class ProcessEngine(_Handle):
    """`EngineHandle` over a child process (see module docstring)."""

    def __init__(self, path: str, *, dtype: str = "float32", device: str = "cpu", threads: int = 0,
                 timeout_s: float = 600.0, max_restarts: int = 2, printer=print):
        super().__init__(dtype)
        self.spec = {"path": path, "dtype": dtype, "device": device, "threads": threads or _default_threads()}
        self.timeout_s, self.max_restarts, self.printer = timeout_s, max_restarts, printer
        self.restarts = 0
        self.idle_s = 0.0
        self._epoch = 0
        self._inbox: queue.Queue = queue.Queue()
        self._start()

    # ------------------------------------------------------------------------------ process life

    def _start(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        req_recv, req_send = ctx.Pipe(duplex=False)
        rep_recv, rep_send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=worker_main, args=(req_recv, rep_send, self.spec), daemon=True,
                                name="posttrain-rollout-engine")
        self.proc.start()
        req_recv.close()
        rep_send.close()  # so the receiver sees EOF the moment the child dies
        self._epoch += 1
        self._outbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._send_loop, args=(req_send, self._outbox, self._epoch), daemon=True).start()
        threading.Thread(target=self._recv_loop, args=(rep_recv, self._epoch), daemon=True).start()
        self._ready_seen = False
        self._wait(lambda: self._ready_seen, "start (load the model and answer Ready)")

    def _send_loop(self, conn, outbox: queue.Queue, epoch: int) -> None:
        while (msg := outbox.get()) is not None:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                self._inbox.put((epoch, _Dead()))
                return
        conn.close()

    def _recv_loop(self, conn, epoch: int) -> None:
        while True:
            try:
                self._inbox.put((epoch, conn.recv()))
            except (EOFError, OSError):
                self._inbox.put((epoch, _Dead()))
                return

    def _restart(self) -> None:
        if self.restarts >= self.max_restarts:
            raise EngineDied(f"the rollout engine process (pid {self.proc.pid}) died "
                             f"{self.restarts + 1} times (exit code {self.proc.exitcode}); giving up")
        self.restarts += 1
        self.printer(f"WARNING [engine_restart] rollout engine pid {self.proc.pid} died (exit code "
                     f"{self.proc.exitcode}); restarting it from weights version {self.version} and "
                     f"re-sending {len(self._pending)} unanswered requests")
        self._outbox.put(None)
        self._start()
        self._acks = {}
        if self._last_weights is not None:
            self._acks[self._last_weights.version] = self._expected_for(self._last_weights)
            self._outbox.put(self._last_weights)
        for rid in sorted(self._pending):
            self._outbox.put(self._pending[rid])

    def _expected_for(self, msg: LoadWeights) -> str:
        return engine_checksum(_unpack_weights(msg.payload), msg.checksum, getattr(torch, msg.dtype or self.dtype))

    # ------------------------------------------------------------------------------ message pump

    def _pump(self, timeout: float) -> bool:
        """Handle one reply if one comes within ``timeout``; False if none did."""
        try:
            epoch, msg = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        if epoch != self._epoch:
            return True  # from a process already replaced
        if isinstance(msg, _Dead):
            self.proc.join(timeout=5)
            self._restart()
        elif isinstance(msg, Ready):
            self._ready_seen = True
        else:
            if isinstance(msg, Generated):
                self.idle_s = msg.idle_s
            self._on_reply(msg)
        return True

    def _wait(self, done, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineTimeout(f"the rollout engine (pid {self.proc.pid}) did not {what} within "
                                    f"{self.timeout_s:g} s (asynchrony.timeout_s)")
            self._pump(min(left, 1.0))

    # ------------------------------------------------------------------------------ EngineHandle

    def submit(self, prompts, n: int, sampling: SamplingParams) -> int:
        req = self._new_request(prompts, n, sampling)
        self._outbox.put(req)
        return req.rid

    def poll(self, wait: bool) -> list[Generated]:
        """Finished generate requests; with ``wait`` block until at least one (or time out)."""
        while self._pump(0.0):
            pass
        if wait and not self._ready:
            if not self._pending:
                raise EngineError("poll(wait=True) with no request in flight would wait forever")
            self._wait(lambda: bool(self._ready), f"answer any of generate requests {sorted(self._pending)}")
        return self._take_ready()

    def generate(self, prompts, n: int, sampling: SamplingParams) -> Rollouts:
        rid = self.submit(prompts, n, sampling)
        self._wait(lambda: any(g.rid == rid for g in self._ready), f"answer generate request {rid}")
        return self._take_ready(rid)[0].rollouts

    def load_weights(self, weights, version: int, checksum: str, dtype: str | None = None) -> None:
        self._outbox.put(self._weights_message(weights, version, checksum, dtype))

    def wait_synced(self) -> None:
        self._wait(lambda: not self._acks, f"acknowledge weights versions {sorted(self._acks)}")

    def close(self) -> None:
        self._outbox.put(Shutdown())
        self._outbox.put(None)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)


class LocalEngine(_Handle):
    """`EngineHandle` over an in-process `TorchEngine`: requests run at ``submit`` (no overlap)."""

    def __init__(self, engine, dtype: str = "float32"):
        super().__init__(dtype)
        self.engine = engine
        self.idle_s = 0.0
        self.restarts = 0

    def submit(self, prompts, n: int, sampling: SamplingParams) -> int:
        req = self._new_request(prompts, n, sampling)
        self._on_reply(_handle(self.engine, req, 0.0))
        return req.rid

    def poll(self, wait: bool) -> list[Generated]:
        return self._take_ready()

    def generate(self, prompts, n: int, sampling: SamplingParams) -> Rollouts:
        return self._take_ready(self.submit(prompts, n, sampling))[0].rollouts

    def load_weights(self, weights, version: int, checksum: str, dtype: str | None = None) -> None:
        self._on_reply(load_into(self.engine, self._weights_message(weights, version, checksum, dtype)))

    def wait_synced(self) -> None:
        pass

    def close(self) -> None:
        pass
