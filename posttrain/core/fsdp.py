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
    from posttrain.models.hf import is_lora

    if not is_sharded(model):
        if not world.main:
            return {}
        raw = {k: v.detach() for k, v in model.state_dict().items()}
        # merged from the state dict, not a deep copy of the model: only the adapted layers are new tensors
        return merge_lora_weights(raw, _lora_scaling(model)) if is_lora(model) else raw
    if raw is None:
        return _joined(export_buckets(model, world, float("inf")))
    if not world.main or not is_lora(model):
        return raw
    return merge_lora_weights(raw, _lora_scaling(model))


def export_adapter(model, world: World) -> dict[str, torch.Tensor]:
    """A LoRA model's adapter tensors under the names peft saves them with
    (``...q_proj.lora_A.weight``), on rank 0 (other ranks: {}); a collective when sharded."""
    if not is_sharded(model):
        from peft import get_peft_model_state_dict

        return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()} if world.main else {}
    return _joined(export_buckets(model, world, float("inf"), adapter=True))


def export_buckets(model, world: World, bucket_mb: float, *, adapter: bool = False):
    """`export_state_dict` (or, with ``adapter``, `export_adapter`) as consecutive dicts of about
    ``bucket_mb`` each, on rank 0 (other ranks get as many empty dicts).

    A sharded model's parameters are gathered one at a time as the buckets are consumed, so rank 0
    holds one bucket of full weights at a time, never a second full copy of the model. Every rank
    must iterate it to the end in step (each gather is a collective). A LoRA layer's base weight and
    its A and B stay in one bucket, where they are merged.
    """
    from posttrain.models.hf import is_lora

    limit = bucket_mb * 2**20
    lora = is_lora(model)
    if not is_sharded(model):
        weights = export_adapter(model, world) if adapter else export_state_dict(model, world)
        yield from _split(weights, limit) if world.main else iter([{}])
        return
    bucket, size = {}, 0
    for group in _module_groups(model.state_dict(), adapter):
        for name, value in group:
            full = value.full_tensor() if hasattr(value, "full_tensor") else value  # a collective
            if world.main:
                bucket[name] = full.detach().cpu()
            size += value.numel() * value.element_size()
        if size >= limit:
            yield _finish(bucket, lora, adapter, model)
            bucket, size = {}, 0
    if size:
        yield _finish(bucket, lora, adapter, model)


def _module_groups(state: dict, adapter: bool):
    """The state dict's items in order, grouped so that a LoRA layer's tensors come together."""
    group, key = [], None
    for name, value in state.items():
        if adapter and ".lora_" not in name:
            continue
        own = name.split(".base_layer.")[0].split(".lora_")[0]
        if group and own != key:
            yield group
            group = []
        group.append((name, value))
        key = own
    if group:
        yield group


def _finish(bucket: dict, lora: bool, adapter: bool, model) -> dict[str, torch.Tensor]:
    if adapter:
        return {k.replace(".default.", "."): v for k, v in bucket.items()}
    return merge_lora_weights(bucket, _lora_scaling(model)) if lora and bucket else bucket


def _lora_scaling(model) -> float:
    cfg = model.peft_config["default"]
    return cfg.lora_alpha / cfg.r


def _split(weights: dict[str, torch.Tensor], limit: float):
    """Consecutive parts of ``weights`` of at least ``limit`` bytes (the last may be smaller)."""
    bucket, size = {}, 0
    for name, t in weights.items():
        bucket[name] = t
        size += t.numel() * t.element_size()
        if size >= limit:
            yield bucket
            bucket, size = {}, 0
    if bucket or not weights:
        yield bucket


def _joined(buckets) -> dict[str, torch.Tensor]:
    out = {}
    for bucket in buckets:
        out.update(bucket)
    return out


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
