"""`posttrain sandbox check|audit|humaneval`, able to judge on the verifier farm (``--farm N``).

The commands themselves are `posttrain.sandbox.cli`'s; this module adds the farm's options and
lives above the sandbox because the farm does. ``--farm N`` judges on N sandbox actors of a Ray
cluster (``--ray-address``: ``auto``, ``host:port``, or empty for a local Ray sized to this
machine), each with ``--cpus`` sandboxes; the output is the same as in-process, line for line.
"""

from __future__ import annotations

import argparse

from posttrain.errors import UserError
from posttrain.sandbox import cli as sandbox_cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for p in sandbox_cli.add_arguments(parser):
        p.add_argument("--farm", type=int, default=0, metavar="N",
                       help="judge on N sandbox actors of a Ray cluster (default 0: in this process)")
        p.add_argument("--cpus", type=int, default=2, help="--farm: CPUs (sandboxes) per actor (default 2)")
        p.add_argument("--ray-address", default="", metavar="ADDR",
                       help="--farm: auto, host:port, or empty to start a local Ray sized to this machine")


def run(args) -> int:
    if args.action == "humaneval" or not args.farm:
        return sandbox_cli.run(args)
    if args.farm < 0 or args.cpus < 1:
        raise UserError(f"--farm must be >= 0 and --cpus >= 1, got --farm {args.farm} --cpus {args.cpus}")
    if args.workers:
        raise UserError("--workers sets the in-process pool; with --farm use --cpus (sandboxes per actor)")
    return sandbox_cli.run(args, make_pool=_open_farm)


def _open_farm(args):
    from posttrain.distributed.farm import VerifierFarm
    from posttrain.sandbox.pool import SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig

    try:
        return VerifierFarm(SandboxConfig(replicas=args.farm, cpus=args.cpus), args.ray_address)
    except SandboxUnavailable as e:
        raise UserError(f"{args.file}: cannot judge on the farm: {e}") from None
