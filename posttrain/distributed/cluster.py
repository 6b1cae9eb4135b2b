"""Connecting to Ray: an existing cluster (``auto`` or ``host:port``) or a local one sized to the machine."""

from __future__ import annotations

import os

from posttrain.errors import UserError


def require_ray():
    """Import ray, or fail with the one line that says how to get it."""
    try:
        import ray
    except ImportError:
        raise UserError("runtime=ray needs the ray package: pip install 'posttrain[ray]' "
                          "(or bash scripts/setup.sh ray)") from None
    return ray


def connect(address: str = "", num_cpus: int | None = None, namespace: str = "posttrain"):
    """Join the cluster at ``address`` (``auto``, ``host:port``), or start a local Ray when it is
    empty. A process already connected keeps its connection (tests share one Ray per session).
    Returns the ray module."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local clusters: no token file to manage
    kwargs = dict(include_dashboard=False, log_to_driver=True, namespace=namespace, ignore_reinit_error=True)
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), _node_ip_address="127.0.0.1", **kwargs)
    return ray
