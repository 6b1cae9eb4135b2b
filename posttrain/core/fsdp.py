"""Sharding a model over the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each decoder layer becomes its own FSDP unit, then the root (embeddings, final norm, head): a
layer's full parameters exist only while that layer runs, and between steps every rank holds
1/world_size of the parameters, gradients and AdamW state (they are ``DTensor`` shards). On a GPU
parameters compute in bf16 and gradients are reduced in fp32 (``MixedPrecisionPolicy``); on the
CPU everything stays fp32 so that 2 ranks reproduce 1 rank to rounding.

Frozen models (reference, reward model, teacher) are sharded the same way; they only run forwards.
At world size 1 nothing is wrapped: the single-process path is the plain model.

Gradient scale: FSDP averages gradients over ranks, while our losses are already shares of a
global mean (their denominators are the whole step's token counts); ``backward_scale`` is the
factor that turns the average back into the sum.
"""

from __future__ import annotations

import torch

from posttrain.core.dist import World


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (``model.layers``), through any peft wrapper."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    return []


def shard_model(model, world: World, *, activation_checkpointing: bool = False):
    """``model`` with FSDP2 applied per decoder layer then at the root (no-op at world size 1)."""
    if activation_checkpointing:
        _checkpoint_layers(model)
    if not world.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(world.device.type, (world.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if world.device.type == "cuda" else MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _checkpoint_layers(model) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    layers = set(map(id, decoder_layers(model)))
    apply_activation_checkpointing(model, check_fn=lambda m: id(m) in layers)


def is_sharded(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def reshard(model) -> None:
    """Put a sharded model's parameters back in their shards after forwards without a backward.

    FSDP2 leaves the root unit's parameters (embeddings, final norm, head) gathered after a forward,
    expecting the backward to release them; after evaluation or reference scoring nothing would,
    and an optimizer built then would hold the gathered copies instead of the shards.
    """
    from torch.distributed.fsdp import FSDPModule

    if model is None:
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def backward_scale(world: World) -> float:
    return float(world.world_size)


def clip_gradients(params, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (over every rank's shard); returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def full_state_dict(model, world: World) -> dict[str, torch.Tensor]:
    """The whole model's weights under their plain names, on rank 0's CPU only (other ranks: {}).

    Gathered one parameter at a time into CPU memory, so no rank holds more than one full copy.
    """
    if not is_sharded(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export_state_dict(model, world: World, *, raw: dict | None = None) -> dict[str, torch.Tensor]:
    """Full weights under the base model's names (LoRA merged in), on rank 0 (other ranks: {}).

    What the rollout engine loads and what the consolidated checkpoint holds. Every rank must call
    it when the model is sharded (the gather is a collective) unless ``raw``, the gathered
    `full_state_dict`, is passed.
    """
    from posttrain.models.hf import is_lora, merged_state_dict

    if not is_sharded(model):
        return merged_state_dict(model) if world.main else {}
    weights = full_state_dict(model, world) if raw is None else raw
    if not world.main or not is_lora(model):
        return weights
    cfg = model.peft_config["default"]
    return merge_lora_weights(weights, cfg.lora_alpha / cfg.r)


def export_adapter(model, world: World) -> dict[str, torch.Tensor]:
    """A LoRA model's adapter tensors under the names peft saves them with
    (``...q_proj.lora_A.weight``), on rank 0 (other ranks: {}); a collective when sharded."""
    if not is_sharded(model):
        from peft import get_peft_model_state_dict

        return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()} if world.main else {}
    weights = full_state_dict(model, world)
    return {k.replace(".default.", "."): v for k, v in weights.items() if ".lora_" in k}


def merge_lora_weights(sd: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft LoRA state dict folded into plain weights: ``W + scaling · B @ A`` under the base names.

    Modules peft trains whole (``modules_to_save``, e.g. a reward model's head) keep their trained
    copy under the plain name; the frozen original is dropped.
    """
    out = {}
    for key, value in sd.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        if key.endswith(".base_layer.weight"):
            prefix = key[: -len("base_layer.weight")]
            a, b = sd[prefix + "lora_A.default.weight"], sd[prefix + "lora_B.default.weight"]
            value = value + (scaling * (b.float() @ a.float())).to(value.dtype)
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out[name.replace(".modules_to_save.default.", ".")] = value
    return out
