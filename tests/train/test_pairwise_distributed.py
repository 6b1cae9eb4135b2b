"""Reward model and DPO under torchrun: 2 ranks (gloo, FSDP2) equal 1 process on the same global
batch (losses, gradient norms, held-out metrics, final weights), whatever batch_pairs."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.cli import main


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory):
    from posttrain.tasks.arithmetic import write_arithmetic

    out = tmp_path_factory.mktemp("dist_pairs")
    write_arithmetic(out, digits=2, ops="+", n_train=40, n_eval=10, seed=2)
    return out


def args(model_dir, data_dir, out, *extra):
    # 8 pairs a step: 4 a rank at 2 ranks, in 2 micro-batches of 2 (accumulation on every rank);
    # 10 held-out pairs in batches of 2: 3 batches on rank 0, 2 (and one discarded) on rank 1.
    return [f"model.path={model_dir}", f"data.path={data_dir / 'pairs_train.jsonl'}",
            f"data.eval_path={data_dir / 'pairs_eval.jsonl'}", "num_steps=3", "batch_pairs=8",
            "micro_batch_pairs=2", "eval_every=0", "save_every=0", "optim.lr=1e-3", "optim.warmup_steps=0",
            "logging.progress=false", "data.use_chat_template=false", f"out_dir={out}", *extra]


def rows(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir, step=3):
    return load_file(str(Path(run_dir) / "checkpoints" / f"step-{step}" / "model.safetensors"))


def assert_same_run(a, b, eval_key, steps=3, rel=1e-5):
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == list(range(steps + 1))
    for x, y in zip(ra[1:], rb[1:]):
        assert y["loss"] == pytest.approx(x["loss"], rel=rel), (x["step"], x["loss"], y["loss"])
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=rel)  # the sum, not the mean, over ranks
    for x, y in (ra[0], rb[0]), (ra[-1], rb[-1]):  # held-out metrics at step 0 and at the end
        assert y[eval_key] == pytest.approx(x[eval_key], rel=rel)
    wa, wb = weights(a, steps), weights(b, steps)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


# The two-rank runs of the tests below, all in one torchrun launch (a launch's imports cost more than
# the runs' steps). The resumed DPO run starts from a one-process run to step 2 in its folder, and
# its reference is a second (frozen, sharded) model; the schedule is constant so that a run to
# step 2 and a run to step 3 agree on the first two steps.
RESUME = ["optim.schedule=constant"]


@pytest.fixture(scope="module")
def two_ranks(nano_model_dir, pairs_dir, tmp_path_factory, torchrun_each):
    """The 2-rank runs' folders: name -> run dir (rm, dpo, dpo-resumed), and the ranks' stderr."""
    root = tmp_path_factory.mktemp("pairwise-two-ranks")
    resume = [f"ref_path={nano_model_dir}", *RESUME]
    assert main(["dpo", *args(nano_model_dir, pairs_dir, root / "dpo-resumed", *resume, "num_steps=2")]) == 0
    cases = {"rm": ["rm", *args(nano_model_dir, pairs_dir, root / "rm")],
             "dpo": ["dpo", *args(nano_model_dir, pairs_dir, root / "dpo")],
             "dpo-resumed": ["dpo", *args(nano_model_dir, pairs_dir, root / "dpo-resumed", *resume)]}
    outputs, _ = torchrun_each(2, cases)
    for name, out in outputs.items():
        assert out.count(f"{cases[name][0]} done") == 1, out  # only process 0 prints
    return {name: root / name for name in cases}


def test_rm_two_ranks_equal_one_process(nano_model_dir, pairs_dir, tmp_path, two_ranks):
    assert main(["rm", *args(nano_model_dir, pairs_dir, tmp_path / "one")]) == 0
    assert_same_run(tmp_path / "one", two_ranks["rm"], "eval/accuracy")
    assert_same_run(tmp_path / "one", two_ranks["rm"], "eval/loss")
    # The consolidated folder is a reward model that transformers loads as it is.
    from transformers import AutoModelForSequenceClassification

    start = AutoModelForSequenceClassification.from_pretrained(nano_model_dir, num_labels=1).state_dict()
    trained = AutoModelForSequenceClassification.from_pretrained(two_ranks["rm"] / "checkpoints" / "step-3")
    assert trained.score.weight.shape[0] == 1
    w = weights(two_ranks["rm"])
    torch.testing.assert_close(trained.score.weight.detach(), w["score.weight"])
    assert any(not torch.equal(start[k], w[k]) for k in w if k in start and k != "score.weight"), \
        "the run must train the backbone for the comparison to mean anything"


def test_dpo_two_ranks_equal_one_process(nano_model_dir, pairs_dir, tmp_path, two_ranks):
    assert main(["dpo", *args(nano_model_dir, pairs_dir, tmp_path / "one")]) == 0
    assert_same_run(tmp_path / "one", two_ranks["dpo"], "eval/loss")
    assert_same_run(tmp_path / "one", two_ranks["dpo"], "eval/rewards/margin")
    assert rows(two_ranks["dpo"])[1]["loss"] == pytest.approx(0.6931472, abs=1e-6)  # policy = reference at the start
    w0, w = load_file(str(Path(nano_model_dir) / "model.safetensors")), weights(two_ranks["dpo"])
    assert any(not torch.equal(w0[k], w[k]) for k in w0), "the run must train for the comparison to mean anything"


def test_dpo_two_ranks_resume_a_one_process_run_with_a_reference_folder(nano_model_dir, pairs_dir, tmp_path,
                                                                         two_ranks):
    assert main(["dpo", *args(nano_model_dir, pairs_dir, tmp_path / "one", f"ref_path={nano_model_dir}", *RESUME)]) == 0
    assert_same_run(tmp_path / "one", two_ranks["dpo-resumed"], "eval/loss")


@pytest.mark.slow  # a two-rank launch; the default suite's runs with placeholders are RL's
def test_batch_pairs_the_ranks_cannot_share_equally(nano_model_dir, pairs_dir, tmp_path, torchrun):
    """5 pairs: rank 0 runs 3 (2 micro-batches), rank 1 runs 2 and a placeholder (a rank with no pair
    at all runs only placeholders, the same path). The step is the one-process step."""
    batch_pairs = 5
    # Adam moves a weight by ~lr whatever its gradient's size, so the rounding of near-zero gradients
    # summed in another order (3 + 2 pairs) would show as lr-sized weight differences; an eps above
    # that noise keeps the weight check about the gradients.
    extra = [f"batch_pairs={batch_pairs}", "num_steps=2", "optim.eps=1e-5"]
    assert main(["dpo", *args(nano_model_dir, pairs_dir, tmp_path / "one", *extra)]) == 0
    torchrun(2, "dpo", *args(nano_model_dir, pairs_dir, tmp_path / "two", *extra))
    assert_same_run(tmp_path / "one", tmp_path / "two", "eval/loss", steps=2)
