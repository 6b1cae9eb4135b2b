"""The process group: who this process is, and the few collectives the trainers need.

A run launched by ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) joins the default
process group: NCCL when the model is on a GPU, gloo on the CPU. Anything else is one plain
process that never touches ``torch.distributed``, so the laptop path has no process group, no
ports and no rendezvous. Every collective below is the identity at world size 1.

Rank 0 is the controller: it owns the run directory, the metrics, the progress bar, the rollout
engine and every other side effect that must happen once.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist


def extreme(key: str) -> str | None:
    """"max" or "min" for a metric that is an extreme over the step (``*_max``, ``*_min``), else None."""
    return "max" if key.endswith("_max") else "min" if key.endswith("_min") else None


@dataclasses.dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        """Whether this process does the once-per-run side effects (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x, op: str = "sum"):
        """``x`` (float, int or tensor) reduced over ranks: sum or max; the same type comes back."""
        if not self.distributed:
            return x
        t = torch.as_tensor(x, dtype=torch.float64).clone()
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        if isinstance(x, torch.Tensor):
            return t.to(x.dtype)
        return type(x)(t.item())

    def all_agree(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank: for choices that must be the same everywhere."""
        return self.all_reduce(int(ok)) == self.world_size

    def mean_metrics(self, metrics: dict, weight: float) -> dict:
        """Per-rank metrics → their ``weight``-weighted mean over ranks (keys ending in ``_max``: the
        max; in ``_min``: the min)."""
        if not self.distributed:
            return metrics
        keys = sorted(k for k in metrics if extreme(k) is None)
        sums = torch.tensor([float(metrics[k]) * weight for k in keys] + [weight], dtype=torch.float64)
        dist.all_reduce(sums)
        total = max(float(sums[-1]), 1e-12)
        means = {k: float(sums[i]) / total for i, k in enumerate(keys)}
        return means | self.extremes({k: v for k, v in metrics.items() if extreme(k)})

    def extremes(self, values: dict) -> dict[str, float]:
        """Each ``*_max`` value's max and each ``*_min`` value's min over ranks (the same keys on
        every rank), in one collective: a min is the max of the negatives."""
        if not self.distributed or not values:
            return {k: float(v) for k, v in values.items()}
        keys = sorted(values)
        sign = torch.tensor([-1.0 if extreme(k) == "min" else 1.0 for k in keys], dtype=torch.float64)
        peaks = sign * torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        return dict(zip(keys, (sign * peaks).tolist()))

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj``, in rank order (small Python objects: counts, per-row scalars)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src: int = 0):
        """Rank ``src``'s ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's (in place)."""
        if self.distributed:
            dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


class WeightGroup:
    """A gloo process group of its own, apart from the trainer's world: rank 0 (the trainer's rank
    0) broadcasts weights to the engine replicas (ranks 1..), the way verl, OpenRLHF and TRL push
    weights to engines that live elsewhere. Rank 0 hosts the rendezvous store on ``listen_fd``, a
    socket it bound to ``host`` (loopback when everything runs on one machine); every rank's gloo
    connections use ``host``'s interface too. Building the group waits (up to ``timeout_s``) until
    every rank has joined, and so does every broadcast. The same small interface as `World` for
    `broadcast_weights`."""

    def __init__(self, host: str, port: int, rank: int, size: int, timeout_s: float, name: str = "weights",
                 listen_fd: int | None = None):
        timeout = datetime.timedelta(seconds=timeout_s)
        extra = {"master_listen_fd": listen_fd} if listen_fd is not None else {}
        self.store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout, **extra)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(name, self.store), rank, size, opts)
        self.rank, self.size, self.device = rank, size, torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def broadcast_object(self, obj):
        """Rank 0's picklable ``obj`` on every rank: its length, then its bytes."""
        import pickle

        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) if self.main else None
        size = torch.tensor([data.numel() if self.main else 0], dtype=torch.int64)
        self.broadcast(size)
        buf = data if self.main else torch.empty(int(size), dtype=torch.uint8)
        self.broadcast(buf)
        return obj if self.main else pickle.loads(buf.numpy().tobytes())


def broadcast_weights(weights: dict[str, torch.Tensor] | None, group) -> dict[str, torch.Tensor]:
    """Rank 0's ``weights`` on every rank of ``group`` (a `World` or a `WeightGroup`): names, shapes
    and dtypes first, then one flat broadcast per dtype (a bucket's tensors in one collective, not
    one each). Rank 0 takes each tensor out of ``weights`` as it is copied into the flat buffer, so
    the two together never hold more than the bucket and one tensor. An empty dict comes out as {}."""
    import math

    meta = group.broadcast_object([(k, tuple(v.shape), v.dtype) for k, v in weights.items()] if group.main else None)
    out = {}
    for dtype in dict.fromkeys(d for _, _, d in meta):
        names = [(k, shape) for k, shape, d in meta if d == dtype]
        sizes = [math.prod(shape) for _, shape in names]
        flat = torch.empty(sum(sizes), dtype=dtype, device=group.device)
        if group.main:
            for (name, _), part in zip(names, flat.split(sizes)):
                part.copy_(weights.pop(name).reshape(-1))
        group.broadcast(flat)
        for (name, shape), part in zip(names, flat.cpu().split(sizes)):
            out[name] = part.view(shape)
    return out


_WORLD: World | None = None


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_world(device: str = "cpu", timeout_s: float = 1800.0) -> World:
    """This process's `World`, joining torchrun's process group on first call (idempotent).

    ``device`` is the model's configured device: on a GPU each rank takes ``cuda:LOCAL_RANK``.
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    if not launched_by_torchrun():
        _WORLD = World(device=torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                           (device if device != "auto" else "cpu")))
        return _WORLD
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
        # torn down before the interpreter's own teardown: a process group whose threads outlive it
        # can abort the process as it exits (std::terminate), after all its work is done
        atexit.register(_leave)
    _WORLD = World(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)
    return _WORLD


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank whose work is done: run the exit handlers (the process group's
    teardown among them) while the interpreter is whole, flush, and leave with ``code`` without
    the interpreter's own teardown.

    Why: destroying the process group does not stop gloo's threads (its transport loop and worker
    loops live on while FSDP's mesh and the model still refer to the group), and they then die with
    the interpreter. Now and then that ends in ``std::terminate`` and the rank aborts (SIGABRT)
    after its work is done, which torchrun reports as a failed run. ``os._exit`` ends every thread
    at once, with nothing left to unwind. Before that it does what the interpreter's exit does
    first: wait for the threads that are not daemons (a user's reward module may start one)."""
    import threading

    threading._shutdown()  # the interpreter's own first step at exit: executors wound down, threads joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said on it
            pass
    os._exit(code)


def current_world() -> World:
    """The world set up by `init_world`, or a single process if nothing was initialised."""
    return _WORLD or World()


def shard_range(n: int, world: World) -> range:
    """The rows ``[start, stop)`` of ``n`` that this rank owns, in order: contiguous blocks, the
    first ``n % world_size`` ranks one row more than the others (none at all when ``n`` is smaller
    than the world). Sharded forwards run in lock step, so callers give a rank with fewer rows
    placeholder passes whose loss counts for nothing.
    """
    per, extra = divmod(n, world.world_size)
    start = world.rank * per + min(world.rank, extra)
    return range(start, start + per + (world.rank < extra))


def mini_batch_rows(n: int, mini_batches: int, gen: torch.Generator, world: World) -> list[torch.Tensor]:
    """This rank's rows (of its ``n``) in each of one pass's ``mini_batches``: one shuffle of the whole
    step's rows (every rank's, in rank order: each rank holds a contiguous block of the step), split
    as one process splits it, each rank keeping its own. So the mini-batches are one process's at any
    world size; a rank may have no row of a mini-batch (it then runs placeholders)."""
    sizes = world.all_gather_object(n)
    offset = sum(sizes[: world.rank])
    order = torch.randperm(sum(sizes), generator=gen)
    return [mini[(mini >= offset) & (mini < offset + n)] - offset for mini in order.tensor_split(mini_batches)]


def gather_rows(world: World, *tensors_BT: torch.Tensor) -> list[torch.Tensor]:
    """Each (rows, width) tensor of every rank, concatenated in rank order and right-padded with 0
    to one width: for a statistic over the whole step (small per-row tensors only)."""
    parts = world.all_gather_object(tensors_BT)
    width = max(t.shape[1] for part in parts for t in part)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
    return [torch.cat([pad(part[i]) for part in parts]) for i in range(len(tensors_BT))]
