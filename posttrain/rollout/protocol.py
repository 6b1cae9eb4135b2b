"""The messages between the trainer and a rollout-engine worker, and the interface a worker implements.

Requests go trainer -> engine in one FIFO stream and are handled in order, so a generate request
queued after the weights of version v is always served by version v or newer (the staleness bound
rests on this). Replies go engine -> trainer; each names the request it answers.

`EngineHandle` is the trainer's view of an engine: ``submit`` returns at once, ``poll`` collects
finished generations, ``load_version`` queues new weights and verifies their arrival when the
engine acknowledges them. `posttrain.rl.async_.worker.ProcessEngine` implements it with a child
process and pipes (a dead child is restarted and its requests sent again); `LocalEngine` in-process
(tests, debugging); `posttrain.distributed.engines.RayEngines` with engine replicas as Ray actors
(a dead replica's requests come back as `Lost`, and the controller sends their prompts again).

Every engine acknowledges new weights with the checksum of its *own* tensors read back after the
copy (`load_and_read_back`), which the handle compares with `engine_checksum` of what it sent.

Every engine, whatever it is — `TorchEngine` in process, `HTTPEngine` over servers, `RayEngines`,
the engine process — takes new weights through one call, `RolloutEngine.load_version`: the
buckets as they leave the trainer's shards, the version, the sender's digest of them and an
optional probe. How the weights travel (copied in, written to a folder, broadcast, pickled) is the
engine's business, so the code that moves weights never asks which engine it holds.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Protocol, runtime_checkable

import torch

from posttrain.rollout.types import Rollouts, SamplingParams, weights_checksum

Buckets = Iterable[dict[str, torch.Tensor]]
"""Weights in parts, dicts of tensors by state-dict name; read once, in order."""

Probe = tuple[list[int], list[float]]
"""Token ids and the trainer's log-probs of ``ids[1:]`` (temperature 1) under the weights sent: how
an engine with no checksum it can be trusted for (vLLM, SGLang) shows it serves them."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What the RL loop needs from a sampler that holds its own copy of the policy weights."""

    version: int
    """The weights version it holds: its samples are tagged with it or a newer one."""

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts: ...

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None:
        """Take the weights of ``version`` as ``buckets`` arrive (each may be dropped before the next
        is read) and verify them: ``digest()``, asked for after the last bucket, is the sender's
        `weights_checksum` of them all; ``probe`` is checked where the engine has no better proof.
        `WeightSyncError` when the engine does not confirm; an engine that loads in the background
        (the engine process, replicas fed through the object store) reports it by ``wait_synced``.
        Stopping early leaves the rest of ``buckets`` unread: the caller drains them.

        ``dtype`` ("float32", "bfloat16", "float16"; None keeps the engine's): hold this version,
        and the ones after it, in that dtype (``rollout.precision_fallback``). The switch rides on a
        load because only then is it real: weights cast up from 16 bits are still 16-bit values."""
        ...


def joined(buckets: Buckets) -> dict[str, torch.Tensor]:
    """The buckets as one state dict: for engines that take a whole version at once (the pipe to
    the engine process, the object store), which hold that one copy while the trainer moves on."""
    return {k: v for bucket in buckets for k, v in bucket.items()}


class EngineError(RuntimeError):
    """The rollout engine failed in a way the run cannot hide (hang, death, refused weights)."""


class EngineTimeout(EngineError):
    """A wait on the engine process ran past ``asynchrony.timeout_s``."""


class EngineDied(EngineError):
    """The engine process died more often than ``asynchrony.max_engine_restarts`` allows."""


# ------------------------------------------------------------------------------ trainer -> engine


@dataclasses.dataclass
class Generate:
    rid: int
    prompts: list[list[int]]
    n: int
    sampling: SamplingParams


@dataclasses.dataclass
class LoadWeights:
    version: int
    checksum: str
    payload: bytes
    """``torch.save`` of the state dict: a private copy, so the trainer may keep updating its own."""
    dtype: str | None = None
    """The dtype the engine holds these weights in (None: the one it started with)."""


@dataclasses.dataclass
class Shutdown:
    pass


# ------------------------------------------------------------------------------ engine -> trainer


@dataclasses.dataclass
class Ready:
    version: int
    pid: int


@dataclasses.dataclass
class Generated:
    rid: int
    rollouts: Rollouts
    gen_s: float
    """Seconds the engine spent generating this request."""
    idle_s: float
    """Engine seconds spent waiting for work, cumulative since it started."""


@dataclasses.dataclass
class WeightsLoaded:
    version: int
    engine_checksum: str
    """Checksum of the engine's own tensors, read back after the copy (in the engine's dtype)."""


@dataclasses.dataclass
class Failed:
    what: str
    """"weights" or "generate"."""
    message: str
    rid: int = -1
    version: int = -1


@dataclasses.dataclass
class Lost:
    rid: int
    """A generate request that will never be answered (its engine died); its prompts must be sent again."""
    reason: str


def engine_checksum(weights: dict[str, torch.Tensor], checksum: str, dtype: torch.dtype) -> str:
    """The checksum an engine holding ``dtype`` tensors reads back after loading ``weights``."""
    if all(v.dtype == dtype for v in weights.values()):
        return checksum
    return weights_checksum({k: v.to(dtype) for k, v in weights.items()})


def load_and_read_back(engine, weights: dict[str, torch.Tensor], version: int, checksum: str,
                       dtype: str | None = None) -> str:
    """Load ``weights`` into a `TorchEngine` (it verifies ``checksum``), held in ``dtype`` when
    given, and return the checksum of the engine's own tensors of those names, read back after the copy."""
    if dtype is not None:
        engine.set_dtype(getattr(torch, dtype))
    engine.load_weights(weights, version, checksum)
    own = engine.model.state_dict()
    return weights_checksum({k: own[k] for k in weights})


class EngineHandle(Protocol):
    """What the async controller needs from a rollout engine living elsewhere."""

    version: int
    """The newest weights version sent (what the next request will be served with, or newer)."""

    def submit(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> int: ...

    restarts: int
    """Engines (processes, replicas) started again after they died."""
    idle_s: float
    """Engine seconds spent waiting for work, cumulative (summed over replicas)."""

    def poll(self, wait: bool) -> list[Generated | Lost]: ...

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts: ...

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None: ...

    def wait_synced(self) -> None: ...

    def close(self) -> None: ...
