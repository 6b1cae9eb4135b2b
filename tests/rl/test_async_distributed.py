"""Async RL under torchrun: rank 0 runs the controller (ledger, bound, receiver) against an engine
apart — the engine process, or rollout servers — and hands every rank the step's groups; each rank
trains its own. 2 ranks (gloo) equal 1 process; a killed run resumes with every prompt trained once."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.cli import main
from tests.rl.test_async import _comparable
from tests.rl.conftest import reward_module_root, rl_args
from tests.rl.test_rl_distributed import ADAM, PLUGIN_MODULE, _kill_after_checkpoint


def _rows(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def plugin_on_path(reward_plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the ranks import the user's reward module too
    return reward_plugin


def _args(rl_overrides, plugin, **extra) -> list[str]:
    return [a for a in rl_overrides(verifier=f"{plugin}:letters", mode="async", **{"optim.lr": 1e-2, **ADAM, **extra})
            if not a.startswith("out_dir=")]


def _async_args(inputs, **extra) -> list[str]:
    return rl_args(inputs.model, inputs.data, verifier=f"{PLUGIN_MODULE}:letters", mode="async",
                   **{"optim.lr": 1e-2, **ADAM, **extra})


K0, SERVERS = "test_async_k0_at_two_ranks_equals_one_process", "test_async_k0_at_two_ranks_against_two_servers_equals_one_process"
K0_ARGS, SERVERS_ARGS = {"max_staleness": 0, "num_steps": 3}, {"max_staleness": 0, "num_steps": 3, "kl.track": False}


@pytest.fixture(scope="module")
def inputs(nano_model_dir, arith_data_dir, tmp_path_factory):
    """The runs' model, prompts and the user's reward module (importable here and by the ranks)."""
    with reward_module_root(tmp_path_factory, "async-two-ranks") as root:
        yield SimpleNamespace(root=root, model=nano_model_dir, data=arith_data_dir)


@pytest.fixture(scope="module")
def two_ranks(request, inputs, torchrun_each):
    """The selected tests' 2-rank runs in one torchrun launch (a launch's imports cost more than the
    runs' steps): ({test name: run dir}, the versions its two servers ended at). The servers' run
    gets a pair of ``posttrain serve`` apps of its own, stopped after the launch."""
    from tests.rl.test_rl_http import _http
    from tests.rollout.test_http_engine import real_server

    selected = {item.originalname for item in request.session.items if item.path == request.path}
    cases, pair = {}, []
    if K0 in selected:
        cases[K0] = ["rl", *_async_args(inputs, **K0_ARGS), f"out_dir={inputs.root / K0}"]
    try:
        if SERVERS in selected:
            pair = [real_server(inputs.model) for _ in range(2)]
            http = [f"{k}={v}" for k, v in _http(pair).items()]
            cases[SERVERS] = ["rl", *_async_args(inputs, **SERVERS_ARGS), *http, f"out_dir={inputs.root / SERVERS}"]
        path = os.pathsep.join(filter(None, [str(inputs.root), os.environ.get("PYTHONPATH")]))
        torchrun_each(2, cases, env={"PYTHONPATH": path})
        versions = [s.app.state.serve.version for s in pair]
    finally:
        for s in pair:
            s.stop()
    return {name: inputs.root / name for name in cases}, versions


def test_async_k0_at_two_ranks_equals_one_process(inputs, two_ranks, tmp_path):
    """The engine process on rank 0, K=0: the same samples, and the same update split over two
    ranks (loss, grad norm within 1e-5), step for step, self-test included."""
    assert main(["rl", *_async_args(inputs, **K0_ARGS), f"out_dir={tmp_path / 'one'}"]) == 0
    one, two = _rows(tmp_path / "one"), _rows(two_ranks[0][K0])
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3]
    assert two[0]["selftest/passed"] == 1
    assert all(r["grad_norm"] > 0 for r in one[1:])
    for a, b in zip(one, two):
        assert b.get("reward/mean") == a.get("reward/mean")  # the same samples
        assert _comparable(b) == pytest.approx(_comparable(a), rel=1e-5, abs=2e-6), a["step"]


@pytest.mark.slow
def test_async_k1_at_two_ranks_killed_and_resumed_trains_every_prompt_once(rl_overrides, plugin_on_path, tmp_path,
                                                                          torchrun):
    """K=1 under torchrun, SIGKILL after the step-2 checkpoint, resumed under torchrun: one metrics
    row per step, every sample within the bound, and the ledger shows each drawn prompt trained once."""
    from posttrain.core.checkpoint import load_trainer_state
    from posttrain.rl.ledger import PromptLedger

    steps, out = 5, tmp_path / "run"
    args = [*_args(rl_overrides, plugin_on_path, max_staleness=1, num_steps=steps, save_every=1, keep_last=10),
            f"out_dir={out}"]
    _kill_after_checkpoint(args, out, step=2)
    torchrun(2, "rl", *args)
    rows = [r for r in _rows(out) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    ledger = PromptLedger()
    ledger.load_state_dict(load_trainer_state(out / "checkpoints" / f"step-{steps}")["async"]["ledger"])
    trained = [u for us in ledger.trained_by_step().values() for u in us]
    assert len(trained) == len(set(trained)) == steps * 4


def test_async_k0_at_two_ranks_against_two_servers_equals_one_process(inputs, two_ranks, tmp_path):
    """Rank 0 a client of two ``posttrain serve`` apps (loopback HTTP), the other rank only trains:
    the same run as one process against two servers of its own."""
    from tests.rl.test_rl_http import _http
    from tests.rollout.test_http_engine import real_server

    pair = [real_server(inputs.model) for _ in range(2)]
    try:
        http = [f"{k}={v}" for k, v in _http(pair).items()]
        assert main(["rl", *_async_args(inputs, **SERVERS_ARGS), *http, f"out_dir={tmp_path / 'one'}"]) == 0
        assert [s.app.state.serve.version for s in pair] == [3, 3]
    finally:
        for s in pair:
            s.stop()
    assert two_ranks[1] == [3, 3]  # the 2-rank run's servers
    rows = {1: _rows(tmp_path / "one"), 2: _rows(two_ranks[0][SERVERS])}
    assert [r["step"] for r in rows[1]] == [r["step"] for r in rows[2]] == [0, 1, 2, 3]
    assert all(r["grad_norm"] > 0 for r in rows[1][1:])
    for a, b in zip(rows[1], rows[2]):
        assert _comparable(b) == pytest.approx(_comparable(a), rel=1e-5, abs=2e-6), a["step"]


@pytest.mark.slow
def test_async_k0_at_two_ranks_with_one_or_two_ray_replicas_equals_one_process(rl_overrides, plugin_on_path, tmp_path,
                                                                               torchrun):
    """Rank 0 drives engine replicas on a Ray it starts (runtime=ray), one or two: the same run as one
    process driving one replica (each request carries its prompts' sampling seeds, so which replica
    samples it does not matter). One reference run for both."""
    pytest.importorskip("ray")
    args = _args(rl_overrides, plugin_on_path, max_staleness=0, num_steps=2, runtime="ray", **{"ray.num_cpus": 4})
    assert main(["rl", *args, "rollout.replicas=1", f"out_dir={tmp_path / 'one'}"]) == 0
    one = _rows(tmp_path / "one")
    assert [r["step"] for r in one] == [0, 1, 2]
    for replicas in (1, 2):
        torchrun(2, "rl", *args, f"rollout.replicas={replicas}", f"out_dir={tmp_path / str(replicas)}", timeout=600)
        two = _rows(tmp_path / str(replicas))
        assert [r["step"] for r in two] == [0, 1, 2], replicas
        for a, b in zip(one, two):
            assert _comparable(b) == pytest.approx(_comparable(a), rel=1e-5, abs=2e-6), (replicas, a["step"])


@pytest.mark.slow
def test_sync_at_two_ranks_streaming_weights_to_ray_replicas_equals_one_process(rl_overrides, plugin_on_path,
                                                                                tmp_path, torchrun):
    """Sync mode, rank 0 driving two Ray replicas: the buckets leave both ranks' FSDP shards and rank
    0 broadcasts each over the weight group to the replicas (rollout.ray_weights=auto streams in
    sync mode); the same run as one process."""
    pytest.importorskip("ray")
    args = [a.replace("mode=async", "mode=sync") for a in _args(rl_overrides, plugin_on_path, num_steps=2,
                                                                 runtime="ray", **{"rollout.replicas": 2,
                                                                                   "ray.num_cpus": 4,
                                                                                   "rollout.sync_bucket_mb": 0.05})]
    assert "mode=sync" in args
    assert main(["rl", *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, "rl", *args, f"out_dir={tmp_path / 'two'}", timeout=600)
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in one)
    for a, b in zip(one, two):
        assert _comparable(b) == pytest.approx(_comparable(a), rel=1e-5, abs=2e-6), a["step"]


@pytest.mark.slow  # the default suite's async two-rank runs are the single-turn ones above
def test_async_k0_with_the_calculator_at_two_ranks_equals_one_process(nano_model_dir, tmp_path, torchrun, monkeypatch):
    """Multi-turn episodes in async mode under torchrun: rank 0 drives the episodes' turns and
    hands the ranks their rows (episodes stay on rank 0, reduced to env/* metrics); the same run
    as one process, step for step."""
    from posttrain.envs.calculator import write_calculator_data
    from tests.envs.test_rl_env import PLUGIN, overrides

    (tmp_path / "rl_test_envs.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    data = write_calculator_data(tmp_path / "calc", n_train=16, n_eval=4, tools_style="none")
    args = [a for a in overrides(nano_model_dir, tmp_path, tmp_path, **{
        "data.path": data["prompts_train"], "num_steps": 2, "env.name": "rl_test_envs:DenseCalculator",
        "env.max_turns": 2, "env.tools_style": "none", "rollout.max_new_tokens": 8, "mode": "async",
        "max_staleness": 0, **ADAM}) if not a.startswith("out_dir=")]
    assert main(["rl", *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, "rl", *args, f"out_dir={tmp_path / 'two'}")
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2]
    assert all(r["env/turns_mean"] >= 1 and r["grad_norm"] > 0 for r in one[1:])
    for a, b in zip(one, two):
        assert _comparable(b) == pytest.approx(_comparable(a), rel=1e-5, abs=2e-6), a["step"]
