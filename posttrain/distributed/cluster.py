"""Connecting to Ray: an existing cluster (``auto`` or ``host:port``) or a local one sized to the machine."""

from __future__ import annotations

import dataclasses
import os
import sys

from posttrain.config import ConfigValueError
from posttrain.errors import UserError

RUNTIMES = ("local", "ray")


@dataclasses.dataclass(kw_only=True)
class RayConfig:
    """Where Ray work goes when ``runtime: ray``."""

    address: str = ""
    """``auto`` (the cluster this machine joined with ``ray start``), ``host:port``, or empty to
    start a local Ray sized to the machine."""
    num_cpus: int = 0
    """CPUs of a local Ray started here (empty address); 0 = this machine's core count."""

    def __post_init__(self):
        if self.num_cpus < 0:
            raise ConfigValueError("num_cpus", "must be >= 0")


def require_ray():
    """Import ray, or fail with the one line that says how to get it."""
    try:
        import ray
    except ImportError:
        raise UserError("runtime=ray needs the ray package: bash scripts/setup.sh ray "
                          "(from a checkout: pip install -e '.[ray]')") from None
    return ray


def connect(address: str = "", num_cpus: int | None = None, namespace: str = "posttrain"):
    """Join the cluster at ``address`` (``auto``, ``host:port``), or start a local Ray when it is
    empty. A process already connected keeps its connection (tests share one Ray per session).
    Returns the ray module."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local clusters: no token file to manage
    if not sys.stdout.isatty():  # the driver prints actors' lines behind a colour-coded prefix
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    kwargs = dict(include_dashboard=False, log_to_driver=True, namespace=namespace, ignore_reinit_error=True)
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), _node_ip_address="127.0.0.1", **kwargs)
    return ray


def shortfall(ray, replicas: int, cpus: float, gpus: float) -> str | None:
    """What ``replicas`` actors of ``cpus`` CPUs and ``gpus`` GPUs each lack on the connected Ray
    (``"3 replicas x 1 CPUs do not fit the local Ray's 2 CPUs"``), or None when they fit. A local
    Ray cannot grow: replicas it cannot place would wait forever."""
    have = ray.cluster_resources()
    for key, each in (("CPU", cpus), ("GPU", gpus)):
        if replicas * each > have.get(key, 0):
            return f"{replicas} replicas x {each:g} {key}s do not fit the local Ray's {have.get(key, 0):g} {key}s"
    return None
