"""Shared fixtures: the embedded nano model (built once per test session, no download)."""

from __future__ import annotations

import os

# The tests run tiny models whose kernels are too small to gain from intra-op threads; on a busy
# machine, torch's threads wait at every kernel's barrier for a core (seen: 25x slower). One
# thread here, and in every subprocess the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def nano_model_dir(tmp_path_factory):
    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    return build_tiny(tmp_path_factory.mktemp("nano"), "nano", seed=0)


@pytest.fixture(scope="session")
def arith_data_dir(tmp_path_factory):
    """Arithmetic SFT/RL records (2-digit × 2-digit, reasoning traces)."""
    from posttrain.tasks.arithmetic import write_arithmetic

    out = tmp_path_factory.mktemp("arith")
    write_arithmetic(out, digits=2, ops="x", n_train=400, n_eval=50, fmt="trace", seed=0)
    return out
