"""The environment and sandboxed-verifier recipes of examples/ under `torchrun --nproc-per-node 2`,
as in one process (tests/test_examples_torchrun.py has the design and the other recipes; the two files
let the slow lane's two workers share the runs)."""

from __future__ import annotations

import pytest

from tests.test_examples_torchrun import example_names, inputs, run_at_two_ranks_and_one  # noqa: F401 (a fixture)


@pytest.mark.slow
@pytest.mark.parametrize("name", example_names(envs=True))
def test_environment_example_runs_at_two_ranks_as_in_one_process(name, inputs, tmp_path, torchrun,  # noqa: F811
                                                                 monkeypatch):
    run_at_two_ranks_and_one(name, inputs, tmp_path, torchrun, monkeypatch)
