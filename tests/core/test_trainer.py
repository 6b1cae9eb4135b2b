"""The training core in one process: the optimizer step's metrics and activation checkpointing."""

import torch

from posttrain.core.fsdp import decoder_layers, shard_model
from posttrain.core.dist import World
from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler
from posttrain.core.trainer import TrainCore
from posttrain.models.hf import ModelConfig, load_model


def _grads(model_dir, checkpointing: bool):
    model = shard_model(load_model(ModelConfig(path=str(model_dir))), World(), activation_checkpointing=checkpointing)
    ids = torch.arange(2, 34).view(2, 16)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss), {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_wraps_each_layer_and_keeps_the_gradients(nano_model_dir):
    plain_loss, plain = _grads(nano_model_dir, False)
    ckpt_loss, ckpt = _grads(nano_model_dir, True)
    assert ckpt_loss == plain_loss and plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    model = shard_model(load_model(ModelConfig(path=str(nano_model_dir))), World(), activation_checkpointing=True)
    assert all(type(layer).__name__ == "CheckpointWrapper" for layer in decoder_layers(model))


def test_step_sums_micro_batch_shares_and_steps_once(nano_model_dir):
    """Two micro-batches, each a share of one global mean: the metrics add up, the optimizer steps once."""
    model = load_model(ModelConfig(path=str(nano_model_dir)))
    cfg = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant")
    opt = build_optimizer(model.parameters(), cfg)
    core = TrainCore(model, opt, build_scheduler(opt, cfg, 10), grad_clip=1.0)
    ids = torch.arange(2, 34).view(2, 16)

    def loss_fn(rows):
        loss = model(input_ids=ids[rows], labels=ids[rows]).loss / 2
        return loss, {"share": 0.5}

    m = core.step([[0], [1]], loss_fn)
    with torch.no_grad():
        before = sum(float(model(input_ids=ids[[r]], labels=ids[[r]]).loss) for r in (0, 1)) / 2
    assert m["share"] == 1.0 and core.updates == 1 and m["grad_norm"] > 0
    assert m["lr"] == 1e-3 and m["loss"] > before  # the reported loss is the pre-update one


def test_step_keeps_extremes_and_a_placeholder_counts_for_nothing(nano_model_dir):
    """Shares add up, ``*_max`` / ``*_min`` are the extremes over the micro-batches (not a weighted
    sum of them), and a placeholder micro-batch (a rank with less data) changes neither."""
    from posttrain.core.trainer import share_of_step

    model = load_model(ModelConfig(path=str(nano_model_dir)))
    cfg = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant")
    opt = build_optimizer(model.parameters(), cfg)
    core = TrainCore(model, opt, build_scheduler(opt, cfg, 10), grad_clip=1.0)
    ids = torch.arange(2, 34).view(2, 16)
    values = {0: {"m": 1.0, "r_max": 3.0, "r_min": 0.5}, 1: {"m": 3.0, "r_max": 2.0, "r_min": 0.25}}

    def loss_fn(row):
        live = row is not None  # None: a placeholder pass on row 0
        loss = model(input_ids=ids[[row or 0]], labels=ids[[row or 0]]).loss / 2
        metrics = values[row or 0]
        return loss if live else loss * 0.0, {k: share_of_step(k, v, 0.5, live) for k, v in metrics.items()}

    m = core.step([0, None, 1], loss_fn)
    assert m["m"] == 2.0 and m["r_max"] == 3.0 and m["r_min"] == 0.25
