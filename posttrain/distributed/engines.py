"""Rollout-engine replicas as Ray actors, and `RayEngines`, the trainer's handle on them.

Placement: ``replicas`` actors, each reserving ``cpus`` CPUs (also its torch thread count) and
``gpus`` GPUs (its engine then runs on cuda), each holding a `TorchEngine` loaded from the model
path, which every node must be able to read.

Sync (`RayEngines.generate`, what the sync RL loop calls): the call's prompts are cut into
contiguous blocks of whole groups, balanced by prompt count, one block per replica, run
concurrently and joined in prompt order. Each block carries its prompts' sampling seeds from the
whole call (`SamplingParams.for_prompts`) and the engine's sampling streams are per prompt, so the
result equals one in-process call, token for token.

Scoring (`RayEngines.score`): a function of the engine (a prompt's log-probs, which need the model
rather than samples) runs on one replica at the current weights.

Async (the `EngineHandle` of `posttrain.rollout.protocol`): ``submit`` sends a request to the
replica with the fewest samples in flight and returns at once; ``poll`` collects the answers.

Weights, two ways. ``load_buckets`` (sync mode's default) streams them over the weight group, a
gloo group of this process (rank 0) and the replicas built on first use (`WeightGroup`, the way
verl, OpenRLHF and TRL push weights to engines elsewhere): a broadcast per bucket and dtype as the
buckets leave the trainer's shards, each replica copying a bucket in before the next, so no full
copy exists anywhere; it needs every replica idle, which sync mode's replicas are at a sync.
``load_weights`` (async mode) puts the state dict in the object store once per version and passes
that one reference to every replica, which loads it when its queued requests are done: the
trainer never waits for a replica. Either way each replica's engine verifies the sender's checksum
and answers with the checksum of its own tensors read back after the copy, which the handle
compares with what it sent; a mismatch or a refusal raises `WeightSyncError` naming the replica.

Ordering, and with it async's staleness bound: a Ray actor runs one caller's calls in the order
they were submitted, so a request sent after the weights of version v is served by version v or
newer, as in the engine process. Each request also carries that version, and a replica refuses to
serve it with older weights (a broken ordering fails loudly instead of training on stale samples).

Faults: a replica that dies (killed, out of memory, its node lost) is replaced by a new actor that
first loads the current weights (the same object-store reference: no second put; streamed weights
are kept nowhere, so there the replacement is sent no work until the next version reaches it over
a group built again with it, and a call that finds every replica so waiting fails with
`EngineError`; a replica lost in the middle of a stream fails that sync with `WeightSyncError`); ``restarts``
counts the replacements, at most ``max_restarts``, then `EngineDied`. In sync mode the dead
replica's block is sent again, with the same seeds, so it samples the same tokens. In async mode
its unanswered requests come back from ``poll`` as `Lost`: the controller returns their prompts to
the ledger's pending list and sends them again (nothing lost, nothing trained twice). Every wait has
a deadline, and `EngineTimeout` names the replica (and its actor id) and the request it waited for.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from posttrain.core.dist import WeightGroup, broadcast_weights
from posttrain.distributed.cluster import require_ray
from posttrain.rollout.engine import TorchEngine
from posttrain.rollout.protocol import (
    Buckets, EngineDied, EngineError, EngineTimeout, Generated, Lost, Probe, engine_checksum, joined,
    load_and_read_back,
)
from posttrain.rollout.types import Rollouts, SamplingParams, WeightsDigest, WeightSyncError, weights_checksum


@dataclasses.dataclass(kw_only=True)
class ReplicaSpec:
    """What each engine replica loads and reserves."""

    path: str
    dtype: str = "float32"
    cpus: float = 1.0
    gpus: float = 0.0


class EngineReplica:
    """The body of one engine actor: a `TorchEngine`, and the seconds it waited for work."""

    def __init__(self, spec: ReplicaSpec):
        from posttrain.models.hf import quiet_transformers

        quiet_transformers()  # Ray forwards an actor's output to the driver: no loading bar there
        torch.set_num_threads(max(1, int(spec.cpus)))
        device = "cuda" if spec.gpus > 0 else "cpu"
        self.engine = TorchEngine(spec.path, dtype=getattr(torch, spec.dtype), device=device)
        self.idle_s = 0.0
        self._free_since = time.perf_counter()

    def ready(self) -> int:
        return self.engine.version

    def generate(self, prompts, n: int, sampling: SamplingParams, min_version: int):
        """(rollouts, seconds generating, idle seconds so far), served at ``min_version`` or newer."""
        if self.engine.version < min_version:
            raise EngineError(f"asked to serve at version {min_version} or newer but holds {self.engine.version}")
        t0 = self._busy()
        try:
            ro = self.engine.generate(prompts, n, sampling)
        finally:
            self._free_since = time.perf_counter()
        return ro, self._free_since - t0, self.idle_s

    def load_weights(self, weights, version: int, checksum: str, dtype: str | None = None) -> str:
        self._busy()
        try:
            return load_and_read_back(self.engine, weights, version, checksum, dtype)
        finally:
            self._free_since = time.perf_counter()

    def score(self, fn, args: tuple, min_version: int):
        """``fn(engine, *args)`` without gradients, at ``min_version`` or newer: what needs the
        model itself rather than samples (a prompt's log-probs)."""
        if self.engine.version < min_version:
            raise EngineError(f"asked to score at version {min_version} or newer but holds {self.engine.version}")
        self._busy()
        try:
            with torch.no_grad():
                return fn(self.engine, *args)
        finally:
            self._free_since = time.perf_counter()

    def join_weight_group(self, host: str, port: int, rank: int, size: int, timeout_s: float, name: str) -> None:
        self.group = None  # the old group's sockets go first
        self.group = WeightGroup(host, port, rank, size, timeout_s, name)

    def receive_weights(self, version: int, dtype: str | None = None) -> str:
        """Weights broadcast bucket by bucket over the weight group until an empty bucket, then the
        sender's checksum: each bucket is copied in as it arrives (`TorchEngine.load_buckets`), held in
        ``dtype`` when given. The stream is read to its end whatever happens, so the sender is never
        left waiting. Returns the checksum of the engine's own tensors read back after the copy."""
        self._busy()
        names: list[str] = []

        def buckets():
            while bucket := broadcast_weights(None, self.group):
                names.extend(bucket)
                yield bucket

        def checksum() -> str:
            sent.append(self.group.broadcast_object(None))
            return sent[0]

        stream, sent = buckets(), []
        try:
            if dtype is not None:
                self.engine.set_dtype(getattr(torch, dtype))
            self.engine.load_buckets(stream, version, checksum)
        except BaseException:
            for _ in stream:
                pass
            if not sent:
                checksum()
            raise
        finally:
            self._free_since = time.perf_counter()
        own = self.engine.model.state_dict()
        return weights_checksum({k: own[k] for k in names})

    def _busy(self) -> float:
        now = time.perf_counter()
        self.idle_s += now - self._free_since
        return now


def split_groups(count: int, parts: int) -> list[list[int]]:
    """Prompt indices 0..count-1 in contiguous blocks whose sizes differ by at most one (no empty ones)."""
    base, extra = divmod(count, parts)
    blocks, start = [], 0
    for j in range(parts):
        size = base + (j < extra)
        if size:
            blocks.append(list(range(start, start + size)))
        start += size
    return blocks


@dataclasses.dataclass
class _Request:
    slot: int
    actor: object
    ref: object
    prompts: list[list[int]]
    n: int
    sampling: SamplingParams


@dataclasses.dataclass
class _Ack:
    slot: int
    actor: object
    version: int
    expected: str


class RayEngines:
    """The trainer's handle on ``replicas`` engine actors: sync ``generate`` and the async
    `EngineHandle` (see the module docstring)."""

    def __init__(self, spec: ReplicaSpec, replicas: int, *, request_timeout_s: float = 600.0,
                 sync_timeout_s: float = 600.0, max_restarts: int = 2, host: str = "127.0.0.1",
                 stream_weights: bool = False, printer=print, start_timeout_s: float | None = None):
        self.ray = require_ray()
        self.spec, self.printer, self.host = spec, printer, host
        self.stream_weights = stream_weights  # `load_version` streams (`load_buckets`), else one put
        self.request_timeout_s, self.sync_timeout_s, self.max_restarts = request_timeout_s, sync_timeout_s, max_restarts
        # a replica's start (imports, model load) is bounded apart from a sync: on a busy node it can take
        # longer than a sync is allowed to, and a slow start must not read as a failed sync
        self.start_timeout_s = sync_timeout_s if start_timeout_s is None else start_timeout_s
        self.version, self.restarts = 0, 0
        self.checksums: dict[int, str] = {}  # slot -> checksum its replica read back last
        self._actor_class = self.ray.remote(num_cpus=spec.cpus, num_gpus=spec.gpus, max_restarts=0)(EngineReplica)
        self._rid = 0
        self._requests: dict[int, _Request] = {}
        self._acks: dict[object, _Ack] = {}  # object ref -> the acknowledgement it will carry
        self._ready: list[Generated | Lost] = []
        self._weights = None  # (ref, version, checksum, expected, dtype) of the newest version sent
        self._idle: dict[int, float] = {}
        self._idle_dead = 0.0
        self._group: WeightGroup | None = None  # the weight group, and the actors it was built with
        self._group_actors: list = []
        self._behind: set[int] = set()  # slots whose new replica waits for the next streamed version
        self.actors = [self._actor_class.remote(spec) for _ in range(replicas)]
        self._sent = [0] * replicas  # requests sent to each slot
        self._wait_started()

    def name(self, slot: int, actor=None) -> str:
        actor = actor or self.actors[slot]
        return f"engine replica {slot} (actor {actor._actor_id.hex()[:12]})"

    def _wait_started(self, slots=None) -> None:
        slots = range(len(self.actors)) if slots is None else slots
        if not slots:
            return
        refs = {self.actors[slot].ready.remote(): slot for slot in slots}
        ready, late = self.ray.wait(list(refs), num_returns=len(refs), timeout=self.start_timeout_s)
        if late:
            raise EngineTimeout(f"{self.name(refs[late[0]])} did not start within {self.start_timeout_s:g} s "
                                f"(rollout.sync_timeout_s); does the cluster have {len(refs)} x "
                                f"{self.spec.cpus:g} CPUs / {self.spec.gpus:g} GPUs free?")
        for ref, slot in refs.items():
            self._get(ref, f"{self.name(slot)} failed to start")

    def _get(self, ref, what: str):
        """``ray.get`` of a finished call; an exception inside the actor becomes `EngineError`."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            if isinstance(cause, WeightSyncError):
                raise WeightSyncError(f"{what}: {cause}") from None
            raise EngineError(f"{what}: {type(cause).__name__}: {cause}") from None

    # --------------------------------------------------------------------------------- requests

    def _send(self, slot: int, prompts, n: int, sampling: SamplingParams) -> int:
        self._rid += 1
        self._sent[slot] += 1
        actor = self.actors[slot]
        prompts = [list(p) for p in prompts]
        ref = actor.generate.remote(prompts, n, sampling, self.version)
        self._requests[self._rid] = _Request(slot, actor, ref, prompts, n, sampling)
        return self._rid

    def _least_loaded(self) -> int:
        """The replica with the fewest samples in flight; on a tie, the one sent the fewest requests.
        A replica waiting for the next streamed version is passed over; when every one waits, the
        call fails with `EngineError`: that version comes only after the call (waiting would never
        end), and the run saves a checkpoint whose resume sends the weights again."""
        load = [0] * len(self.actors)
        for req in self._requests.values():
            load[req.slot] += len(req.prompts) * req.n
        ready = [slot for slot in range(len(load)) if slot not in self._behind]
        if not ready:
            raise EngineError(f"every engine replica was replaced after the last streamed weights (version "
                              f"{self.version}) and holds none of them; streamed weights are kept nowhere to "
                              f"restore from (rollout.ray_weights=object_store keeps them)")
        return min(ready, key=lambda slot: (load[slot], self._sent[slot]))

    def submit(self, prompts, n: int, sampling: SamplingParams) -> int:
        return self._send(self._least_loaded(), prompts, n, sampling)

    def generate(self, prompts, n: int, sampling: SamplingParams) -> Rollouts:
        """The sync call: whole groups split across the replicas, joined in prompt order."""
        self.wait_synced()
        blocks = split_groups(len(prompts), len(self.actors))
        todo = {self._send(self._least_loaded() if j in self._behind else j, [prompts[i] for i in b], n,
                           sampling.for_prompts(b, len(prompts))): j
                for j, b in enumerate(blocks)}
        done: dict[int, Rollouts] = {}
        while todo:
            self._wait(lambda: any(r.rid in todo for r in self._ready), "answer", self.request_timeout_s)
            for reply in self._take(set(todo)):
                j = todo.pop(reply.rid)
                if isinstance(reply, Lost):  # same block, same seeds, on the replacement
                    b = blocks[j]
                    todo[self._send(self._least_loaded(), [prompts[i] for i in b], n,
                                    sampling.for_prompts(b, len(prompts)))] = j
                else:
                    done[j] = dataclasses.replace(reply.rollouts, prompt_idx=[blocks[j][0] + i for i in
                                                                              reply.rollouts.prompt_idx])
        return Rollouts.concat([done[j] for j in range(len(blocks))])

    def score(self, fn, *args):
        """``fn(engine, *args)`` on one replica (`EngineReplica.score`) at the current weights, once
        every replica acknowledged them; a replica that dies is replaced and the call sent again.
        ``fn`` must be importable by name (a module's function): it travels to the actor by name."""
        while True:
            self.wait_synced()
            slot = self._least_loaded()
            actor = self.actors[slot]
            ref = actor.score.remote(fn, args, self.version)
            ready, _ = self.ray.wait([ref], timeout=self.request_timeout_s)
            if not ready:
                raise EngineTimeout(f"{self.name(slot, actor)} did not answer a {fn.__name__} call within "
                                    f"{self.request_timeout_s:g} s (rollout.request_timeout_s)")
            try:
                return self._get(ref, f"{self.name(slot, actor)} failed a {fn.__name__} call")
            except self.ray.exceptions.RayActorError:
                self._replace(slot, actor)

    def poll(self, wait: bool) -> list[Generated | Lost]:
        """Finished (or lost) requests; with ``wait`` block until at least one."""
        self._collect(0.0)
        if wait and not self._ready:
            if not self._requests:
                raise EngineError("poll(wait=True) with no request in flight would wait forever")
            self._wait(lambda: bool(self._ready), "answer", self.request_timeout_s)
        return self._take(None)

    def _take(self, rids: set[int] | None) -> list[Generated | Lost]:
        mine = [r for r in self._ready if rids is None or r.rid in rids]
        self._ready = [r for r in self._ready if rids is not None and r.rid not in rids]
        return mine

    # --------------------------------------------------------------------------------- weights

    def load_weights(self, weights: dict[str, torch.Tensor], version: int, checksum: str) -> None:
        """One object-store put for every replica; acknowledgements are checked by `wait_synced`
        (and by every `poll`)."""
        if version < self.version:
            raise WeightSyncError(f"version {version} is older than the version already sent ({self.version})")
        cpu = {k: v.detach().cpu() for k, v in weights.items()}
        ref = self.ray.put(cpu)  # serialised now: a private copy, the trainer may keep updating its own
        self._weights = (ref, version, checksum, engine_checksum(cpu, checksum, getattr(torch, self.spec.dtype)),
                         self.spec.dtype)
        self.version = version
        for slot in range(len(self.actors)):
            self._send_weights(slot)

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None:
        """`RolloutEngine.load_version`: streamed over the weight group (`load_buckets`) with
        ``stream_weights``, else one object-store put (`load_weights`). The replicas' checksums read
        back are the proof; the probe adds nothing. ``dtype`` becomes the replicas' (a replacement
        starts in it too) from this version on."""
        if dtype is not None:
            self.spec = dataclasses.replace(self.spec, dtype=dtype)
        if self.stream_weights:
            self.load_buckets(buckets, version, digest)
        else:
            self.load_weights(joined(buckets), version, digest())

    def load_buckets(self, buckets, version: int, checksum) -> None:
        """Weights streamed to every replica over the weight group (`WeightGroup`: gloo, the trainer
        as rank 0) as they leave the trainer's shards: one broadcast per bucket and dtype, each
        replica copying a bucket in before the next (`EngineReplica.receive_weights`), then the
        sender's ``checksum()``. No second full copy exists anywhere; each replica answers with the
        checksum it reads back, checked against the buckets' own (cast to the engines' dtype)."""
        if version < self.version:
            raise WeightSyncError(f"version {version} is older than the version already sent ({self.version})")
        self.wait_synced()  # a replica takes part only once it has nothing queued before the stream
        group = self._weight_group()
        refs = {a.receive_weights.remote(version, self.spec.dtype): slot for slot, a in enumerate(self.actors)}
        dtype, held = getattr(torch, self.spec.dtype), WeightsDigest()
        try:
            for bucket in buckets:
                held.update({k: v.to(dtype) for k, v in bucket.items()})
                broadcast_weights(bucket, group)
                del bucket
            broadcast_weights({}, group)
            group.broadcast_object(checksum())
        except RuntimeError as e:  # a replica left mid-stream (gloo's timeout or a reset connection)
            self._group = None  # the next version builds the group again
            self._after_broken_stream(refs)
            raise WeightSyncError(f"streaming weights of version {version} to the replicas failed "
                                  f"({' '.join(str(e).split())[:300]}); replicas replaced: {self.restarts}") from None
        self.version, self._weights = version, None  # nothing in the object store to restore from
        self._acks.update({ref: _Ack(slot, self.actors[slot], version, held.hexdigest()) for ref, slot in refs.items()})
        try:
            self.wait_synced()
        finally:  # after a refusal the other replicas' answers are not awaited: the error names one
            for ref in refs:
                self._acks.pop(ref, None)
        self._behind.clear()

    def _after_broken_stream(self, refs: dict) -> None:
        """Replace the replicas that died; the others answer with the stream's error, expected here."""
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=min(self.sync_timeout_s, 30.0))
        for ref in ready:
            slot = refs[ref]
            try:
                self._on_reply_of(slot, self.actors[slot], lambda: self._get(ref, self.name(slot)))
            except (EngineError, WeightSyncError):
                pass

    def _weight_group(self) -> WeightGroup:
        """The weight group of this process and the current replicas; built again when one was replaced."""
        if self._group is not None and self._group_actors == [a._actor_id for a in self.actors]:
            return self._group
        import socket
        import uuid

        self._group = None
        # a replacement joins only once started: the group's own timeout is for a sync, not a start
        self._wait_started([slot for slot, a in enumerate(self.actors) if a._actor_id not in self._group_actors])
        listen = socket.socket()
        listen.bind((self.host, 0))
        listen.listen()
        port, name, size = listen.getsockname()[1], f"weights-{uuid.uuid4().hex[:8]}", len(self.actors) + 1
        joins = [a.join_weight_group.remote(self.host, port, slot + 1, size, self.sync_timeout_s, name)
                 for slot, a in enumerate(self.actors)]
        group = WeightGroup(self.host, port, 0, size, self.sync_timeout_s, name, listen_fd=listen.detach())
        for slot, ref in enumerate(joins):
            self._get(ref, f"{self.name(slot)} could not join the weight group")
        self._group, self._group_actors = group, [a._actor_id for a in self.actors]
        return group

    def _send_weights(self, slot: int) -> None:
        ref, version, checksum, expected, dtype = self._weights
        actor = self.actors[slot]
        self._acks[actor.load_weights.remote(ref, version, checksum, dtype)] = _Ack(slot, actor, version, expected)

    def wait_synced(self) -> None:
        self._wait(lambda: not self._acks, "acknowledge", self.sync_timeout_s)

    def _on_ack(self, ref, ack: _Ack) -> None:
        got = self._get(ref, f"{self.name(ack.slot, ack.actor)} refused weights of version {ack.version}")
        if got != ack.expected:
            raise WeightSyncError(f"{self.name(ack.slot, ack.actor)}: weights of version {ack.version} did not "
                                  f"load intact: it holds {got[:12]}, expected {ack.expected[:12]}")
        self.checksums[ack.slot] = got

    # --------------------------------------------------------------------------------- the pump

    def _collect(self, timeout: float) -> None:
        """Handle every call that has finished, waiting up to ``timeout`` for the first."""
        refs = [r.ref for r in self._requests.values()] + list(self._acks)
        if not refs:
            return
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        finished = set(ready)
        for rid, req in list(self._requests.items()):
            if req.ref in finished and rid in self._requests:
                self._on_answer(rid, req)
        for ref in [r for r in ready if r in self._acks]:
            ack = self._acks.get(ref)
            if ack is not None:
                self._on_reply_of(ack.slot, ack.actor, lambda: self._on_ack(ref, ack))
                self._acks.pop(ref, None)

    def _on_answer(self, rid: int, req: _Request) -> None:
        def answer():
            ro, gen_s, idle = self._get(req.ref, f"{self.name(req.slot, req.actor)} failed generate request {rid}")
            self._idle[req.slot] = idle
            self._ready.append(Generated(rid=rid, rollouts=ro, gen_s=gen_s, idle_s=self.idle_s))
            del self._requests[rid]
        self._on_reply_of(req.slot, req.actor, answer)

    def _on_reply_of(self, slot: int, actor, handle) -> None:
        try:
            handle()
        except self.ray.exceptions.RayActorError:
            self._replace(slot, actor)

    def _replace(self, slot: int, actor) -> None:
        """The actor in ``slot`` died: a new one loads the current weights; its requests are `Lost`."""
        lost = sorted(rid for rid, r in self._requests.items() if r.actor is actor)
        for rid in lost:
            del self._requests[rid]
            self._ready.append(Lost(rid, "engine_replica_died"))
        self._acks = {ref: a for ref, a in self._acks.items() if a.actor is not actor}
        if self.actors[slot] is not actor:
            return  # already replaced
        if self.restarts >= self.max_restarts:
            raise EngineDied(f"{self.name(slot)} died and {self.restarts} replicas were already replaced "
                             f"(asynchrony.max_engine_restarts={self.max_restarts}); giving up")
        self.restarts += 1
        self.printer(f"WARNING [engine_restart] {self.name(slot)} died; replacing it at weights version "
                     f"{self.version}, {len(lost)} requests lost and sent again")
        self._idle_dead += self._idle.pop(slot, 0.0)
        self.actors[slot] = self._actor_class.remote(self.spec)
        if self._weights is not None:
            self._send_weights(slot)  # first in its queue: nothing is served with the model's initial weights
        elif self.version > 0:  # streamed weights are not kept: it is sent no work until the next version
            self._behind.add(slot)

    def _wait(self, done, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineTimeout(self._late(what, timeout_s))
            self._collect(min(left, 1.0))

    def _late(self, what: str, timeout_s: float) -> str:
        key = "rollout.request_timeout_s" if what == "answer" else "rollout.sync_timeout_s"
        if what == "answer" and self._requests:
            rid = min(self._requests)
            req = self._requests[rid]
            return (f"{self.name(req.slot, req.actor)} did not answer generate request {rid} "
                    f"({len(req.prompts)} prompts x {req.n}) within {timeout_s:g} s ({key})")
        ack = next(iter(self._acks.values()))
        return (f"{self.name(ack.slot, ack.actor)} did not acknowledge weights version {ack.version} "
                f"within {timeout_s:g} s ({key})")

    # --------------------------------------------------------------------------------- the rest

    @property
    def idle_s(self) -> float:
        """Replica seconds spent waiting for work, summed over replicas (dead ones included)."""
        return self._idle_dead + sum(self._idle.values())

    def close(self) -> None:
        # gloo's threads end with the weight group (destroying a process group does not stop them):
        # here, not as the interpreter exits, where a thread that outlives it can abort the process
        self._group = None
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
