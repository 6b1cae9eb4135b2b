"""Training clients under torchrun: rank 0 serves the API, every rank trains its shard in lock step.

Under ``torchrun --nproc-per-node N ... tinker-serve`` each rank loads the base models and shards
them with FSDP2 (`posttrain.core.fsdp.shard_model`: each decoder layer a unit, then the root), so a
rank holds 1/N of a base's weights between requests. Rank 0 runs the HTTP server; its worker thread
is the only caller of `Base`'s training methods. A method every rank must run (`in_step`: add or
remove an adapter, forward/backward, optimizer step, load a checkpoint) is announced first: rank 0
broadcasts (base, method, arguments — the request's datums included) on `Orders` and the other
ranks, waiting in `follow`, run the same method, so FSDP's gathers meet. Choices:

* **Data parallel over datums.** Each rank runs its contiguous block of a request's datums
  (`own_rows`); a rank with none runs a placeholder pass whose loss is multiplied by 0 (FSDP's
  collectives need every rank). The per-datum log-probs are gathered to rank 0, which computes the
  losses and metrics over the whole request with the code one process uses, so they are one
  process's numbers whatever N is.
* **The base is sharded, the adapters are not.** A client's LoRA tensors and AdamW state are small;
  every rank holds them whole (made equal to rank 0's when created), and their gradients are summed
  over ranks before each optimizer step (`sum_grads`, one all-reduce), as DDP does. So any number of
  clients share one sharded base (peft adds each adapter to the sharded model), and rank 0 saves,
  snapshots and samples from its own copy without a gather.
* **Sampling** stays on rank 0's engine (a `TorchEngine` with a full copy of the base, or vLLM
  servers), as in one process; rank 0 also keeps the base whole and unsharded (`Base.whole`) for
  merging snapshots and for the probe a vLLM push is checked against, so neither waits on a collective.
* **Errors.** The arguments reach every rank before any check, so a request that fails, fails the
  same way on every rank and all stay in step; a follower logs it and waits for the next order.
  A rank that dies ends the run (torchrun stops the others).
* **Waiting.** `Orders` is a gloo group of its own whose timeout is how long the other ranks may
  wait for the next request (a server may sit idle for days); the training's collectives keep the
  process group's timeout, and so does start-up.
* **Stopping.** When rank 0's server stops it broadcasts `STOP` and the others return from
  `follow`; a signal sent to every rank (Ctrl-C in a terminal, torchrun passing on SIGTERM) stops
  each rank on its own, as any command.
"""

from __future__ import annotations

import datetime
import functools
import logging

import torch

from posttrain.core.dist import World, shard_range

log = logging.getLogger("posttrain.tinker")

STOP = None
"""The order that ends `follow`."""


class Orders:
    """The channel rank 0 announces lock-step calls on (every rank in it): its own gloo group, with
    ``idle_s`` as its timeout. Every rank builds it at the same point (a collective)."""

    def __init__(self, world: World, idle_s: float):
        import torch.distributed as dist

        self.world = world
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=idle_s)) \
            if world.distributed else None

    def send(self, order) -> None:
        """Rank 0: ``order`` to every other rank."""
        self._broadcast(order)

    def receive(self):
        """A rank other than 0: the next order (waits up to ``idle_s``)."""
        return self._broadcast(None)

    def _broadcast(self, obj):
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def in_step(method):
    """A `Base` method every rank runs together: on rank 0 of a distributed world it first tells
    the other ranks (base name, method name, arguments)."""

    @functools.wraps(method)
    def run(self, *args):
        if self.world.distributed and self.world.main:
            self.orders.send((self.name, method.__name__, args))
        return method(self, *args)

    run.in_step = True
    return run


def follow(bases: dict, orders: Orders) -> None:
    """A rank other than 0: run each method rank 0 announces, on the same base, until `STOP`."""
    while True:
        order = orders.receive()
        if order is STOP:
            return
        name, method, args = order
        fn = getattr(bases[name], method)
        if not getattr(fn, "in_step", False):
            raise RuntimeError(f"rank 0 announced {method!r}, which is not a lock-step method")
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - rank 0 failed the same way and answers its client
            log.info("rank %d: %s failed as on rank 0: %s", orders.world.rank, method, e)


def release(orders: Orders) -> None:
    """Rank 0, its server stopped: the other ranks leave `follow`. A signal that stopped the server
    (Ctrl-C in a terminal, torchrun passing on SIGTERM) usually reached them too and they left
    already: then there is no one to tell."""
    if not (orders.world.distributed and orders.world.main):
        return
    try:
        orders.send(STOP)
    except RuntimeError as e:  # gloo: "Connection closed by peer"
        log.info("the other ranks had stopped already: %s", e)


def own_rows(data: list, world: World) -> tuple[list, bool]:
    """This rank's block of ``data`` and whether it is real: a rank with no row gets the first datum
    as a placeholder (``False``), to be run with its loss multiplied by 0."""
    rows = shard_range(len(data), world)
    return ([data[i] for i in rows], True) if len(rows) else (data[:1], False)


def gather_logprobs(logprobs: list[torch.Tensor], live: bool, world: World) -> list[torch.Tensor]:
    """Every rank's per-datum log-probs in rank order (the request's order), on every rank."""
    if not world.distributed:
        return logprobs
    parts = world.all_gather_object(logprobs if live else [])
    return [lp for part in parts for lp in part]


def sum_grads(params: list[torch.nn.Parameter], world: World) -> None:
    """Each parameter's gradient summed over ranks (in float64, one flat all-reduce): each rank's
    gradient is that of its own datums' summed loss, so the sum is the whole request's. A parameter
    with no gradient has none on any rank (every rank ran the same passes) and keeps none, so the
    optimizer skips it as in one process."""
    params = [p for p in params if p.grad is not None]
    if not world.distributed or not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    total = world.all_reduce(flat)
    for p, part in zip(params, total.split([p.numel() for p in params])):
        p.grad = part.view_as(p).clone()


def same_as_rank0(params: list[torch.nn.Parameter], world: World) -> None:
    """Rank 0's values in every rank's copy (a new adapter's random initialisation)."""
    with torch.no_grad():
        for p in params:
            world.broadcast(p.data)
