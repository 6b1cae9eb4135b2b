"""RL under torchrun: 2 ranks (gloo, FSDP2; by default each rank generates and trains its own
groups) equal 1 process, step by step, for the GRPO family (same rollouts) and PPO's critic."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from posttrain.cli import main
from tests.rl.conftest import reward_module_root, rl_args

PLUGIN_MODULE = "rl_test_rewards"  # the module tests/rl/conftest.py's reward_plugin fixture makes


def _metrics(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _assert_close_weights(a: Path, b: Path):
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-5, msg=k)


# Adam moves an entry by ~lr·sign(g) however small g is, so rounding noise in near-zero gradients
# (sums in another order across ranks) would become lr-sized weight differences; an eps above that
# noise keeps the comparison about the gradients. (At 1e-6 a rarely seen token's embedding entry,
# with a gradient near 1e-6, moved 0.96e-5 apart with one summation order and 1.4e-5 with another.)
ADAM = {"optim.eps": 1e-5}


def _rl(inputs, **extra) -> tuple[str, list[str]]:
    return "rl", rl_args(inputs.model, inputs.data, **{"optim.lr": 1e-2, **ADAM, **extra})


def _grpo(inputs, extra):
    return _rl(inputs, verifier=f"{PLUGIN_MODULE}:letters", num_steps=3, save_every=3,
               **{"kl.track_every": 1, "logging.samples_per_step": 8, **extra})  # 8: from both ranks' groups


def _zero_variance(inputs, micro_batch_tokens):
    return _rl(inputs, verifier=f"{PLUGIN_MODULE}:half_flat", num_steps=5, save_every=5, seed=2, prompts_per_step=2,
               micro_batch_tokens=micro_batch_tokens)


def _ppo_critic(inputs):
    return _rl(inputs, verifier=f"{PLUGIN_MODULE}:letters", algorithm="ppo", num_steps=2, save_every=2,
               **{"optim.lr": 1e-3, "kl.coef": 0.05, "kl.mode": "reward", "critic.optim.lr": 3e-3,
                  "critic.optim.eps": 1e-6})


def _unequal_groups(inputs, algorithm):
    ppo = {"ppo_epochs": 2, "mini_batches": 2} if algorithm == "ppo" else {}
    return _rl(inputs, verifier=f"{PLUGIN_MODULE}:letters", prompts_per_step=3, micro_batch_tokens=16,
               algorithm=algorithm, **ppo)


def _dynamic_sampling(inputs):
    return _rl(inputs, verifier=f"{PLUGIN_MODULE}:half_flat", prompts_per_step=4, num_steps=3, seed=0,
               **{"dynamic_sampling.enabled": True, "dynamic_sampling.max_rounds": 2})


def _distill(inputs, loss):
    return "distill", [f"model.path={inputs.model}", f"teacher.path={inputs.teacher}",
                       f"data.path={inputs.data / 'prompts_train.jsonl'}", "rollout.max_new_tokens=8",
                       "rollout.group_size=2", "prompts_per_step=4", "optim.lr=3e-3", "optim.eps=1e-6",
                       "micro_batch_tokens=64", "num_steps=2", "eval_every=0", "logging.progress=false",
                       f"loss={loss}"]


# test -> its command line from the module's inputs and the test's parameters
TWO_RANK_RUNS = {
    "test_grpo_two_ranks_equal_one_process": _grpo,
    "test_a_rank_whose_groups_are_all_zero_variance_keeps_in_step": _zero_variance,
    "test_ppo_critic_two_ranks_equal_one_process": _ppo_critic,
    "test_groups_the_ranks_cannot_share_equally": _unequal_groups,
    "test_dynamic_sampling_two_ranks_equal_one_process": _dynamic_sampling,
    "test_distillation_two_ranks_equal_one_process": _distill,
}


def _sharp_teacher(model_dir: Path, out: Path) -> Path:
    """The nano model with its head scaled up: a large KL to learn from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def inputs(nano_model_dir, arith_data_dir, tmp_path_factory):
    """The runs' model, prompts, teacher, and the user's reward module (importable here and by the ranks)."""
    with reward_module_root(tmp_path_factory, "rl-two-ranks") as root:
        yield SimpleNamespace(root=root, model=nano_model_dir, data=arith_data_dir,
                              teacher=_sharp_teacher(nano_model_dir, root / "teacher"))


@pytest.fixture(scope="module")
def two_ranks(request, inputs, torchrun_each):
    """Every selected test's 2-rank run, all in one torchrun launch (each launch's imports cost more
    than the runs' steps): ({test name: process 0's output}, the ranks' stderr); the runs go to
    ROOT/<test name>/two."""
    cases = {}
    for item in request.session.items:
        if item.path == request.path and item.originalname in TWO_RANK_RUNS:
            params = item.callspec.params if hasattr(item, "callspec") else {}
            command, args = TWO_RANK_RUNS[item.originalname](inputs, **params)
            cases[item.name] = [command, *args, f"out_dir={inputs.root / item.name / 'two'}"]
    fewer = "test_fewer_prompts_than_ranks_is_one_line"
    if any(item.path == request.path and item.name == fewer for item in request.session.items):
        # a run the ranks refuse: last, since a failed command ends the launch
        cases[fewer] = ["rl", *rl_args(inputs.model, inputs.data, prompts_per_step=1), f"out_dir={inputs.root / fewer}"]
    path = os.pathsep.join(filter(None, [str(inputs.root), os.environ.get("PYTHONPATH")]))
    return torchrun_each(2, cases, env={"PYTHONPATH": path}, last_fails=fewer in cases)


def _run_both(request, inputs, two_ranks, command_args):
    """The test's run in this process, and its 2-rank run: (one's metrics, two's metrics, their folders)."""
    command, args = command_args
    one_dir, two_dir = inputs.root / request.node.name / "one", inputs.root / request.node.name / "two"
    assert main([command, *args, f"out_dir={one_dir}"]) == 0
    out = two_ranks[0][request.node.name]
    assert out.count(f"{command} done") == 1, out  # only process 0 prints
    one, two = _metrics(one_dir), _metrics(two_dir)
    assert [m["step"] for m in one] == [m["step"] for m in two]
    return one, two, one_dir, two_dir


@pytest.fixture
def plugin_on_path(reward_plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the ranks import the user's reward module too
    return reward_plugin


# Each case is a 2-rank run, so knobs that touch different parts of the step share one: a broken
# part still makes its case differ from the one process. Plain GRPO with one bucket is every other
# test's run here (equal rewards at every step need each rank's engine synced). The default suite
# keeps one two-rank run of each path (sync, PPO's critic, distillation, dynamic sampling, uneven
# shares, checkpointing); the slow lane adds the other algorithms and batch shapes.
@pytest.mark.parametrize("extra", [
    {"algorithm": "grpo", "rollout.sync_bucket_mb": 0.05},  # weights streamed to the ranks in ~20 buckets
    # statistics over the whole batch
    pytest.param({"algorithm": "reinforce_pp", "kl.coef": 0.1, "kl.mode": "reward"}, marks=pytest.mark.slow),
    # off-policy 2nd epoch (ratios leave 1), and the step's mini-batches, whichever rank holds their rows
    pytest.param({"algorithm": "grpo", "ppo_epochs": 2, "mini_batches": 2, "micro_batch_tokens": 64},
                 marks=pytest.mark.slow),
    # rank 0 generates the step; each layer recomputed in backward (test_activation_checkpointing_takes_the_same_steps
    # holds one process with it to one without)
    {"algorithm": "grpo", "rollout.colocate": False, "rollout.sync_bucket_mb": 0.05, "model.activation_checkpointing": True},
])
def test_grpo_two_ranks_equal_one_process(request, inputs, two_ranks, extra):
    one, two, one_dir, two_dir = _run_both(request, inputs, two_ranks, _grpo(inputs, extra))
    # colocated by default: each rank sampled its own groups, with the seeds the one process gave them
    assert {m["rollout/generating_ranks"] for m in two} == {1 if extra.get("rollout.colocate") is False else 2}
    for a, b in zip(one, two):
        assert b["reward/mean"] == a["reward/mean"]  # the same rollouts
        extremes = [k for k in a if k.endswith(("_max", "_min"))]  # the step's, at any world size
        assert "policy/ratio_max" in extremes and b.keys() == a.keys()
        for key in ("loss", "grad_norm", "kl/ref", "entropy", *extremes):
            # the sampler/trainer differences are float32 rounding (~5e-7), summed in another order
            tol = 2e-6 if key.startswith("mismatch/") else 1e-7
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=tol), (a["step"], key)
    assert all(m["grad_norm"] > 0 for m in one)
    # process 0 alone writes samples.jsonl, from the whole step: groups 2 and 3 train on rank 1
    samples = [(d / "samples.jsonl").read_text().splitlines() for d in (one_dir, two_dir)]
    assert samples[1] == samples[0] and len(samples[0]) == 3 * 8
    assert {json.loads(line)["group"] for line in samples[1]} == {0, 1, 2, 3}
    if extra.get("ppo_epochs") or extra.get("mini_batches"):
        assert max(m["policy/ratio_max"] for m in one) > 1.0 + 1e-4
    _assert_close_weights(one_dir / "checkpoints" / "step-3", two_dir / "checkpoints" / "step-3")


# one micro-batch (the kept forward), or several
@pytest.mark.parametrize("micro_batch_tokens", [pytest.param(8192, marks=pytest.mark.slow), 64])
def test_a_rank_whose_groups_are_all_zero_variance_keeps_in_step(request, inputs, two_ranks, micro_batch_tokens):
    """One group a rank: where one rank's group is flat and the other's is not, the flat rank has no
    row to differentiate and runs placeholders in step with the other (and where both are flat,
    neither runs a backward); every step equals the one-process run."""
    one, two, one_dir, two_dir = _run_both(request, inputs, two_ranks, _zero_variance(inputs, micro_batch_tokens))
    # steps where one rank trains nothing (0.5) and where no rank does (1.0)
    assert {m["groups/zero_variance_frac"] for m in one} >= {0.5, 1.0}
    for a, b in zip(one, two):
        assert b["reward/mean"] == a["reward/mean"]
        for key in ("loss", "grad_norm", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    _assert_close_weights(one_dir / "checkpoints" / "step-5", two_dir / "checkpoints" / "step-5")


def test_ppo_critic_two_ranks_equal_one_process(request, inputs, two_ranks):
    one, two, one_dir, two_dir = _run_both(request, inputs, two_ranks, _ppo_critic(inputs))
    assert all(m["rollout/generating_ranks"] == 2 for m in two) and all(m["reward/mean"] == n["reward/mean"]
                                                                       for m, n in zip(one, two))
    for a, b in zip(one, two):
        # PPO's first loss is -mean(A) over whitened advantages: O(1) terms cancelling to ~0, so its
        # float32 rounding depends on the ranks' summation order (seen: 3.5e-7 vs -1.5e-8); the
        # gradients and weights below are the tight check.
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=2e-6), (a["step"], "loss")
        for key in ("grad_norm", "critic/loss", "critic/grad_norm", "critic/explained_variance"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    ckpt = "checkpoints/step-2"
    _assert_close_weights(one_dir / ckpt / "critic", two_dir / ckpt / "critic")
    _assert_close_weights(one_dir / ckpt, two_dir / ckpt)


@pytest.mark.parametrize("algorithm", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])
def test_groups_the_ranks_cannot_share_equally(request, inputs, two_ranks, algorithm):
    """3 groups: rank 0 trains on 2, rank 1 on 1; a row a micro-batch, so rank 1 runs placeholders
    for the micro-batches it has no row for (policy, and PPO's critic). The one-process steps; PPO's
    2 epochs x 2 mini-batches too (each drawn over the whole step's rows, as in one process)."""
    one, two, _, _ = _run_both(request, inputs, two_ranks, _unequal_groups(inputs, algorithm))
    for a, b in zip(one, two):
        assert b["reward/mean"] == a["reward/mean"]
        keys = ("loss", "grad_norm", "entropy", "policy/ratio_max") + (("critic/loss",) if algorithm == "ppo" else ())
        for key in keys:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=2e-6), (a["step"], key)


def test_dynamic_sampling_two_ranks_equal_one_process(request, inputs, two_ranks):
    """Each round every rank samples its own groups and all see the round's; rounds go on until the
    step has its informative groups; a step that keeps a number of groups the ranks cannot share
    equally splits them unequally."""
    one, two, _, _ = _run_both(request, inputs, two_ranks, _dynamic_sampling(inputs))
    assert all(m["rollout/generating_ranks"] == 2 for m in two)
    kept = [m["dynamic_sampling/kept_groups"] for m in one]
    assert all(k >= 2 for k in kept) and any(k % 2 for k in kept), kept  # an unequal share, no starved step
    for a, b in zip(one, two):
        assert b["dynamic_sampling/kept_groups"] == a["dynamic_sampling/kept_groups"]
        for key in ("reward/mean", "loss", "grad_norm", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)


def test_fewer_prompts_than_ranks_is_one_line(inputs, two_ranks):
    # its command is the launch's last, which the ranks end with an error code (two_ranks checks it)
    stderr = two_ranks[1]
    assert "prompts_per_step=1: fewer than the 2 processes" in stderr
    assert stderr.count("posttrain rl: error:") == 1, stderr  # process 0 says it, not every rank
    assert not (inputs.root / "test_fewer_prompts_than_ranks_is_one_line").exists()


@pytest.mark.parametrize("loss", ["full", pytest.param("sampled", marks=pytest.mark.slow)])
def test_distillation_two_ranks_equal_one_process(request, inputs, two_ranks, loss):
    """The student's groups are split over the ranks, the teacher is sharded like the student."""
    one, two, one_dir, two_dir = _run_both(request, inputs, two_ranks, _distill(inputs, loss))
    assert [m["step"] for m in one] == [1, 2]
    for a, b in zip(one, two):
        for key in ("loss", "grad_norm", "distill/reverse_kl", "distill/kl_pos/0", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    _assert_close_weights(one_dir / "checkpoints" / "step-2", two_dir / "checkpoints" / "step-2")


def _launch(args):
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "posttrain",
           "rl", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _kill_after_checkpoint(args, run_dir: Path, step: int, timeout_s: float = 240.0):
    """Start a 2-rank run and kill -9 its whole process group once ``step-<step>`` is complete."""
    import os
    import signal
    import time

    proc = _launch(args)
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "checkpoints" / f"step-{step}" / "trainer_state.pt").exists():
        assert proc.poll() is None, "the run ended before its checkpoint"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_grpo_killed_resumes_at_two_ranks_and_at_one(rl_overrides, plugin_on_path, tmp_path, torchrun):
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = [a for a in rl_overrides(verifier=f"{plugin_on_path}:letters", num_steps=6, save_every=2, keep_last=5,
                                    **{"optim.lr": 1e-2, **ADAM}) if not a.startswith("out_dir=")]
    torchrun(2, "rl", *args, f"out_dir={tmp_path / 'straight'}")
    _kill_after_checkpoint([*args, f"out_dir={tmp_path / 'killed'}"], tmp_path / "killed", step=2)
    shutil.copytree(tmp_path / "killed", tmp_path / "killed_one")
    torchrun(2, "rl", *args, f"out_dir={tmp_path / 'killed'}")
    assert main(["rl", *args, f"out_dir={tmp_path / 'killed_one'}"]) == 0
    straight = {m["step"]: m for m in _metrics(tmp_path / "straight")}
    for resumed in ("killed", "killed_one"):
        assert [m["step"] for m in _metrics(tmp_path / resumed)] == list(range(1, 7))  # no step logged twice
        rows = {m["step"]: m for m in _metrics(tmp_path / resumed)}
        for step in range(3, 7):
            assert rows[step]["reward/mean"] == straight[step]["reward/mean"], (resumed, step)
            assert rows[step]["loss"] == pytest.approx(straight[step]["loss"], rel=1e-5, abs=1e-7), (resumed, step)
    final = tmp_path / "killed_one" / "checkpoints" / "step-6"
    tok = AutoTokenizer.from_pretrained(final)
    texts = []
    for run in (final, tmp_path / "straight" / "checkpoints" / "step-6"):
        model = AutoModelForCausalLM.from_pretrained(run)
        out = model.generate(**tok("Solve: 12 × 34", return_tensors="pt"), max_new_tokens=8, do_sample=False)
        texts.append(tok.decode(out[0]))
    assert texts[0] == texts[1]


@pytest.mark.parametrize("algorithm", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])
def test_activation_checkpointing_takes_the_same_steps(rl_overrides, plugin_on_path, tmp_path, torchrun, algorithm):
    """model.activation_checkpointing=true recomputes each layer in backward, through the shared
    prompt pass (G >= 2): the same loss, gradient norm and weights as without it, in one process
    and, for PPO, at 2 ranks (GRPO's 2-rank run with it is test_grpo_two_ranks_equal_one_process's
    last case, against one process with it)."""
    args = [a for a in rl_overrides(verifier=f"{plugin_on_path}:letters", num_steps=2, save_every=2, algorithm=algorithm,
                                    **{"optim.lr": 1e-2, **ADAM}) if not a.startswith("out_dir=")]
    ckpt = "model.activation_checkpointing=true"
    assert main(["rl", *args, f"out_dir={tmp_path / 'plain'}"]) == 0
    assert main(["rl", *args, ckpt, f"out_dir={tmp_path / 'one'}"]) == 0
    runs = ("one", "two") if algorithm == "ppo" else ("one",)
    if "two" in runs:
        torchrun(2, "rl", *args, ckpt, f"out_dir={tmp_path / 'two'}")
    plain = _metrics(tmp_path / "plain")
    assert all(m["grad_norm"] > 0 for m in plain)
    for run in runs:
        got = _metrics(tmp_path / run)
        assert [m["step"] for m in got] == [m["step"] for m in plain] == [1, 2]
        for a, b in zip(plain, got):
            for key in ("loss", "grad_norm", "entropy"):
                # PPO's first loss is whitened advantages cancelling to ~0: rounding by summation
                # order across ranks (see the PPO test above); the weights are the tight check
                tol = 2e-6 if key == "loss" and algorithm == "ppo" else 1e-7
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=tol), (run, a["step"], key)
        _assert_close_weights(tmp_path / "plain" / "checkpoints" / "step-2", tmp_path / run / "checkpoints" / "step-2")
