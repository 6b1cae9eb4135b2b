"""Training clients on one base model: a LoRA adapter and an optimizer each, one shared base.

`Base` holds one base model wrapped once by peft; each training client is a named adapter on it
(peft's multi-adapter model), with its own `TrainCore` (AdamW) over that adapter's parameters
only. Choices:

* **Isolation.** A forward runs with exactly one adapter active; gradients land on that
  adapter's parameters and stay there until its own ``optim_step`` (another client's
  ``forward_backward`` in between does not touch them), and clipping and the optimizer see that
  adapter's parameters only. A failing request raises before any gradient is accumulated where it
  can (inputs are checked first) and never touches another adapter.
* **The same optimizer step as every trainer**: `TrainCore.backward` / `apply_gradients` (clip,
  AdamW, zero). Tinker sets Adam's parameters per ``optim_step``, so they are written into the
  optimizer's param group before each step; the schedule is constant (the client owns it).
* **Sampling** goes through a rollout engine, a parameter (`posttrain.tinker.samplers`: the
  in-process `TorchEngine`, or vLLM servers that take each snapshot as a LoRA adapter). A sampler
  snapshot is the adapter's tensors; the engine is handed one (merged into the base's weights, or
  pushed as an adapter) when a request needs a different snapshot than it holds.
* One thread runs every method here (the server's worker); nothing here locks.
* **Under torchrun** the base is sharded with FSDP2 over the ranks (`Base.shard`) and the methods
  marked `in_step` run on every rank in lock step, each on its block of the datums
  (`posttrain.tinker.ranks` says how); in one process they are plain calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from posttrain.algos.logprobs import token_logprobs
from posttrain.core.dist import World
from posttrain.core.fsdp import reshard, shard_model
from posttrain.core.trainer import TrainCore
from posttrain.tinker.losses import LossInputError, check_datum, per_token_loss
from posttrain.tinker.ranks import gather_logprobs, in_step, own_rows, same_as_rank0, sum_grads

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
UNEMBED = ["lm_head"]


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def targets(self) -> list[str]:
        return ATTN * self.train_attn + MLP * self.train_mlp + UNEMBED * self.train_unembed

    def as_dict(self) -> dict:
        return {"rank": self.rank, "seed": self.seed, "train_attn": self.train_attn, "train_mlp": self.train_mlp,
                "train_unembed": self.train_unembed}


class _AdapterParams:
    """What `TrainCore` reads of a model: one adapter's parameters, in a fixed order."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self._params = params

    def parameters(self):
        return iter(self._params)

    def train(self):
        return self


@dataclass
class Sampler:
    """A sampling session: a snapshot of one client's adapter (`Base.adapter_state` names), or the
    base's (None)."""

    base: str
    label: str
    adapter: dict | None
    model_path: str | None
    clients: int = 0
    session: str | None = None
    """The SDK session that made it: dropped when that session ends."""


@dataclass
class Adapter:
    name: str
    spec: LoraSpec
    core: TrainCore
    params: dict[str, torch.nn.Parameter]
    steps: int = 0


class Base:
    """A base model (loaded once) and the adapters of the training clients on it."""

    world = World()
    """The ranks the model is sharded over: one process unless `shard` was called."""
    whole = None
    """Under torchrun, on rank 0: the base unsharded and without adapters, for what rank 0 runs alone."""

    def __init__(self, name: str, model, tokenizer, sampling, max_context: int, path: str = ""):
        """``sampling``: the engine samples come from (`posttrain.tinker.samplers`), holding the base
        at first; ``path``: the model's folder (what a vLLM adapter names as its base)."""
        self.name, self.tokenizer, self.sampling, self.max_context = name, tokenizer, sampling, max_context
        self.model = model  # the plain HF model until the first adapter wraps it
        self.path = path
        self.base_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.adapters: dict[str, Adapter] = {}
        self.engine_holds: str | None = "base" if getattr(sampling, "name", None) == "torch" else None  # the snapshot it holds
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))

    def shard(self, world: World, orders) -> None:
        """Under torchrun, before any adapter: the frozen base sharded over ``world`` with FSDP2, the
        `in_step` calls announced on ``orders`` (`posttrain.tinker.ranks.Orders`). Only rank 0
        samples, so the other ranks keep no full copy of the base's weights; rank 0 keeps one as a
        model (`whole`, its tensors the base's weights, so no more memory than one process uses):
        a vLLM push's probe runs it there, while a forward of the sharded model would wait on the
        other ranks' gathers."""
        import copy

        self.world, self.orders = world, orders
        self.model.requires_grad_(False)
        if world.main:
            self.whole = copy.deepcopy(self.model)
            self.base_weights = {k: v.detach() for k, v in self.whole.state_dict().items()}
        else:
            self.base_weights = {}
        self.model = shard_model(self.model, world)

    # ------------------------------------------------------------------------- adapters

    @in_step
    def add_adapter(self, name: str, spec: LoraSpec) -> Adapter:
        from peft import LoraConfig, get_peft_model

        targets = [t for t in spec.targets() if not (t == "lm_head" and self.tied)]
        if not targets:
            raise LossInputError("lora_config: train_attn, train_mlp and train_unembed are all false: nothing to train")
        config = LoraConfig(r=spec.rank, lora_alpha=spec.rank, lora_dropout=0.0, target_modules=targets,
                            task_type="CAUSAL_LM")
        if spec.seed is not None:
            torch.manual_seed(spec.seed)
        if not self.adapters and not hasattr(self.model, "peft_config"):
            self.model = get_peft_model(self.model, config, adapter_name=name)
        else:
            self.model.add_adapter(name, config)
        params = {k: p for k, p in self.model.named_parameters() if f".{name}." in k}
        for p in params.values():
            p.requires_grad_(True)
        same_as_rank0(list(params.values()), self.world)
        optimizer = torch.optim.AdamW(list(params.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        # one process's core even under torchrun: the adapter is whole on every rank (not sharded), its
        # gradients are summed over ranks by `optim_step` before the core clips and steps
        core = TrainCore(_AdapterParams(list(params.values())), optimizer, None, grad_clip=0.0, world=World())
        adapter = Adapter(name=name, spec=spec, core=core, params=params)
        self.adapters[name] = adapter
        return adapter

    @in_step
    def remove_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)
        if hasattr(self.model, "peft_config") and name in self.model.peft_config:
            self.model.delete_adapter(name)

    def _activate(self, name: str) -> Adapter:
        adapter = self.adapters[name]
        self.model.base_model.set_adapter(name)
        for p in adapter.params.values():  # set_adapter may freeze; this client trains its own
            p.requires_grad_(True)
        return adapter

    # ------------------------------------------------------------------------- training

    @in_step
    def forward_backward(self, name: str, loss_fn: str, data: list, config: dict, backward: bool) -> tuple[list, dict]:
        """Per-datum ``logprobs`` and ``elementwise_loss``, and the summed loss; gradients added to
        the adapter's (not applied) unless ``backward`` is false. Under torchrun each rank runs its
        block of ``data``, and rank 0 computes the losses and metrics of the whole request from the
        gathered log-probs (the other ranks return nothing)."""
        self.check_data(loss_fn, data)
        adapter = self._activate(name)
        mine, live = own_rows(data, self.world)
        rows = gather_logprobs(self._run(adapter, mine, live, loss_fn, config, backward), live, self.world)
        if not self.world.main:
            return [], {}
        _, mask, x = _pad(data)
        del x["target_tokens"]
        logp = torch.zeros(mask.shape)
        for i, row in enumerate(rows):
            logp[i, :len(row)] = row
        loss_BT, metrics = per_token_loss(loss_fn, logp, x, mask, config)
        loss = loss_BT.sum()
        outputs = [{"logprobs": logp[i, :len(d.tokens)].detach().numpy().astype(np.float32),
                    "elementwise_loss": loss_BT[i, :len(d.tokens)].detach().numpy().astype(np.float32)}
                   for i, d in enumerate(data)]
        report = {"loss:sum": float(loss.detach())}
        report |= {f"{k}:mean": float(v) for k, v in metrics.items() if not k.endswith("_max")}
        report |= {f"{k}:max": float(v) for k, v in metrics.items() if k.endswith("_max")}
        return outputs, report

    def _run(self, adapter: Adapter, data: list, live: bool, loss_fn: str, config: dict, backward: bool) -> list:
        """Forward of ``data`` with ``adapter`` active, and backward of its summed loss (times 0 unless
        ``live``) into the adapter's gradients; each datum's log-probs."""
        ids, mask, x = _pad(data)
        self.model.train()
        with torch.set_grad_enabled(backward):
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            logp = token_logprobs(logits.float(), x.pop("target_tokens").long())
            if backward:
                loss = per_token_loss(loss_fn, logp, x, mask, config)[0].sum()
                adapter.core.backward(loss if live else loss * 0.0)
        if not backward:
            reshard(self.model)  # FSDP keeps the root's weights gathered after a forward with no backward
        return [logp[i, :len(d.tokens)].detach() for i, d in enumerate(data)]

    def check_data(self, loss_fn: str, data: list) -> None:
        """`LossInputError` for a datum the loss cannot read or the model cannot take."""
        for i, d in enumerate(data):
            check_datum(loss_fn, i, d.tokens, d.inputs)
            if not d.tokens:
                raise LossInputError(f"data[{i}].model_input: no tokens")
            if len(d.tokens) > self.max_context:
                raise LossInputError(f"data[{i}].model_input: {len(d.tokens)} tokens, the model takes {self.max_context}")
            targets = d.inputs["target_tokens"]
            if min(d.tokens) < 0 or max(d.tokens) >= self.vocab or targets.min() < 0 or targets.max() >= self.vocab:
                raise LossInputError(f"data[{i}]: token ids must be in [0, {self.vocab})")
            if any(not np.isfinite(a).all() for a in d.inputs.values()):
                raise LossInputError(f"data[{i}].loss_fn_inputs: NaN or infinite values")

    @in_step
    def optim_step(self, name: str, adam: dict) -> dict:
        adapter = self.adapters[name]
        sum_grads(list(adapter.params.values()), self.world)
        group = adapter.core.optimizer.param_groups[0]
        group.update(lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                     weight_decay=adam["weight_decay"])
        adapter.core.grad_clip = adam["grad_clip_norm"]
        core = adapter.core
        core.scheduler = _NoSchedule()
        metrics = core.apply_gradients()
        adapter.steps += 1
        return {"grad_norm:mean": metrics["grad_norm"], "learning_rate:mean": metrics["lr"]}

    # ------------------------------------------------------------------------- state

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter's tensors under names without the adapter's own name (portable between names)."""
        return {k.replace(f".{name}.", ".ADAPTER."): p.detach().clone() for k, p in self.adapters[name].params.items()}

    def optimizer_state(self, name: str) -> dict:
        return {"optimizer": self.adapters[name].core.optimizer.state_dict(), "steps": self.adapters[name].steps}

    @in_step
    def load_state(self, name: str, tensors: dict[str, torch.Tensor], optimizer: dict | None) -> None:
        adapter = self.adapters[name]
        wanted = {k.replace(f".{name}.", ".ADAPTER."): p for k, p in adapter.params.items()}
        if set(wanted) != set(tensors):
            raise LossInputError("the checkpoint's adapter does not match this model's LoRA layout (rank or targets)")
        with torch.no_grad():
            for k, p in wanted.items():
                if p.shape != tensors[k].shape:
                    raise LossInputError(f"the checkpoint's {k} has shape {list(tensors[k].shape)}, "
                                         f"the model's {list(p.shape)}")
                p.copy_(tensors[k])
        if optimizer is not None:
            adapter.core.optimizer.load_state_dict(optimizer["optimizer"])
            adapter.steps = optimizer["steps"]

    # ------------------------------------------------------------------------- sampling

    def use_snapshot(self, label: str, adapter: dict[str, torch.Tensor] | None) -> None:
        """Put snapshot ``label`` (``adapter``; None: the base) in the sampling engine unless it is there."""
        if self.engine_holds == label:
            return
        self.engine_holds = None  # a load that fails leaves no snapshot believed held
        self.sampling.load(self, adapter, label)
        self.engine_holds = label

    def snapshot_logprobs(self, adapter: dict[str, torch.Tensor] | None, ids: list[int]) -> list[float]:
        """The trainer's log-probs of ``ids[1:]`` under a snapshot (None: the base): what a sampler
        serving it must reproduce. The model's own forward with the merged weights in place of its
        base layers and every adapter off, so no client's adapter is touched. Under torchrun, rank 0's
        `whole` copy runs it, on rank 0 alone."""
        from contextlib import nullcontext

        peft = self.whole is None and hasattr(self.model, "peft_config")
        model = self.whole if self.whole is not None else self.model.get_base_model() if peft else self.model
        names = {k for k, _ in model.named_parameters()}
        weights = {}
        for key, value in (self.base_weights if adapter is None else merge_adapter(self.base_weights, adapter)).items():
            wrapped = key.removesuffix(".weight") + ".base_layer.weight"
            weights[key if key in names or wrapped not in names else wrapped] = value
        x = torch.tensor([ids])
        with torch.no_grad(), (self.model.disable_adapter() if peft else nullcontext()):
            logits = torch.func.functional_call(model, weights, args=(x,)).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).tolist()

    def sample(self, prompt: list[int], n: int, params: dict, want_prompt_logprobs: bool):
        return self.sample_batch([prompt], n, params, want_prompt_logprobs)[0]

    def sample_batch(self, prompts: list[list[int]], n: int, params: dict, want_prompt_logprobs: bool,
                     topk_prompt: int = 0) -> list:
        """``n`` samples of each prompt in one engine call (one set of sampling parameters): per
        prompt, its sequences (finish reason, tokens, log-probs), its prompt log-probs or None, and
        with ``topk_prompt`` = k > 0 the k likeliest tokens at each prompt position and their
        log-probs ((len(prompt), k) arrays, row 0 `wire.TOPK_MASK`) or None."""
        from posttrain.rollout.types import SamplingParams

        stop = params["stop"]
        sampling = SamplingParams(temperature=params["temperature"], top_p=params["top_p"],
                                  top_k=max(params["top_k"], 0), max_new_tokens=params["max_tokens"],
                                  stop=[s for s in stop if isinstance(s, str)], seed=params["seed"])
        out = self.sampling.generate(prompts, n, sampling)
        stop_ids = {s for s in stop if isinstance(s, int)}
        results = []
        for p, prompt in enumerate(prompts):
            rows = range(p * n, (p + 1) * n)  # the engine's order: prompt-major
            sequences = [_cut(out.completion_ids[i], out.logprobs[i], out.finish_reason[i], stop_ids) for i in rows]
            prompt_lp = None
            if want_prompt_logprobs:
                prompt_lp = [math.nan] + self.sampling.prompt_logprobs(prompt)
            topk = self._topk_prompt(prompt, topk_prompt) if topk_prompt else None
            results.append((sequences, prompt_lp, topk))
        return results


    def _topk_prompt(self, prompt: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        from posttrain.tinker.wire import TOPK_MASK

        ids, logprobs = self.sampling.topk_prompt_logprobs(prompt, k)
        k = ids.shape[1]  # the vocabulary may be smaller than k
        first_id, first_lp = np.full((1, k), TOPK_MASK[0], np.int32), np.full((1, k), TOPK_MASK[1], np.float32)
        return np.concatenate([first_id, ids]), np.concatenate([first_lp, logprobs])


def merge_adapter(base_weights: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base's weights with an adapter (`Base.adapter_state` names) merged in: W + B·A per layer
    (alpha = rank, so the scale is 1), under the base model's names."""
    weights = dict(base_weights)
    with torch.no_grad():
        for key, a in adapter.items():
            if ".lora_A.ADAPTER." not in key:
                continue
            b = adapter[key.replace(".lora_A.", ".lora_B.")]
            layer = key.split(".lora_A.")[0].removeprefix("base_model.model.")
            weights[layer + ".weight"] = base_weights[layer + ".weight"] + b.float() @ a.float()
    return weights


class _NoSchedule:
    """Tinker's client owns the learning rate: each ``optim_step`` names it."""

    def step(self):
        pass


def _cut(tokens: list[int], logprobs: list[float], reason: str, stop_ids: set[int]):
    """Token-id stops, which the engine does not take: the sample up to and including the first one."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return "stop", tokens[:i + 1], logprobs[:i + 1]
    return ("length" if reason == "length" else "stop"), tokens, logprobs


def _pad(data: list) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Right-padded (B, T) input ids, attention mask and loss inputs (0 at padding)."""
    T = max(len(d.tokens) for d in data)
    ids = torch.zeros(len(data), T, dtype=torch.long)
    mask = torch.zeros(len(data), T, dtype=torch.long)
    names = set().union(*(d.inputs for d in data))
    x = {k: torch.zeros(len(data), T, dtype=torch.long if k == "target_tokens" else torch.float32) for k in names}
    for i, d in enumerate(data):
        n = len(d.tokens)
        ids[i, :n] = torch.tensor(d.tokens)
        mask[i, :n] = 1
        for k, arr in d.inputs.items():
            x[k][i, :n] = torch.from_numpy(np.array(arr)).to(x[k].dtype)
    return ids, mask, x
