"""Sandbox pools for environment tests."""

from __future__ import annotations

import pytest

from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
from posttrain.sandbox.worker import SandboxConfig


def start_pool(**config) -> SandboxPool:
    """A sandbox pool with ``config`` (`SandboxConfig` fields), or the test skipped with the reason
    the sandbox cannot run on this machine."""
    try:
        return SandboxPool(SandboxConfig(**config))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
