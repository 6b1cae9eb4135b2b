"""The engines `Base` samples with: the in-process `TorchEngine`, Ray engine replicas, or vLLM servers.

All take the same calls from `Base` (``check``, ``load``, ``generate``, ``prompt_logprobs``),
so one queue and one ``sample_batch`` serve any of them; ``tinker-serve --sampler`` picks one.

* `TorchSampling`: a snapshot is the base's weights with the adapter merged in (W + B·A per
  layer), copied into the engine with its checksum.
* `RaySampling`: the same, on `TorchEngine` replicas that are Ray actors (ray is imported only
  when one is made).
* `VLLMSampling`: a snapshot is pushed to the servers as a LoRA adapter, the rollout engine's
  adapter-only sync (`posttrain.rollout.vllm`): the adapter's tensors and a peft
  ``adapter_config.json`` written to a version folder, ``/v1/load_lora_adapter`` in place under
  one of the servers' ``--max-loras`` adapter names (several snapshots stay loaded, the least
  recently used one replaced), the version read back, and the servers' log-probs of a probe sequence checked
  against the trainer's of the same snapshot (vLLM has no trustworthy checksum on CPU builds). The
  base is never re-sent: the base sampler asks for the server's own model (its probe is checked
  too, so a server on another model is refused at the first base sample). vLLM is a client here:
  nothing imports it, and its servers run in their own environment.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from posttrain.errors import UserError
from posttrain.rollout.types import weights_checksum
from posttrain.tinker.losses import LossInputError

log = logging.getLogger("posttrain.tinker")

ADAPTER_NAME = "tinker"
"""The names vLLM serves snapshots under: ``tinker-0`` .. ``tinker-{slots-1}``, each reloaded in place."""


class TorchSampling:
    """Samples with an in-process `TorchEngine`; a snapshot is merged into a full copy of the weights."""

    name = "torch"

    def __init__(self, engine):
        self.engine = engine

    def check(self, adapter: dict | None, topk_prompt: int = 0) -> None:
        """Every snapshot of this base can be sampled here."""

    def load(self, base, adapter: dict[str, torch.Tensor] | None, label: str = "") -> None:
        from posttrain.tinker.training import merge_adapter

        weights = base.base_weights if adapter is None else merge_adapter(base.base_weights, adapter)
        self.engine.load_weights(weights, self.engine.version + 1, weights_checksum(weights))

    def generate(self, prompts: list[list[int]], n: int, sampling):
        return self.engine.generate(prompts, n, sampling)

    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        return self.score(engine_prompt_logprobs, prompt)

    def topk_prompt_logprobs(self, prompt: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.score(engine_topk_prompt_logprobs, prompt, k)

    def score(self, fn, *args):
        """``fn(engine, *args)`` without gradients: what needs the model rather than samples."""
        with torch.no_grad():
            return fn(self.engine, *args)

    def close(self) -> None:
        pass


class RaySampling(TorchSampling):
    """`TorchSampling` on engine replicas that are Ray actors (`posttrain.distributed.engines.RayEngines`):
    a snapshot is merged the same way and put in Ray's object store once, every replica loading it
    and answering with the checksum it reads back; a call's prompts are split across the replicas
    with per-prompt seeds (the same samples as one engine); prompt log-probs run on one replica,
    so the server keeps no second copy of the model for them."""

    name = "ray"

    def score(self, fn, *args):
        return self.engine.score(fn, *args)

    def close(self) -> None:
        self.engine.close()


def engine_prompt_logprobs(engine, prompt: list[int]) -> list[float]:
    """log p(prompt[t] | prompt[:t]) at temperature 1 for t >= 1, from a `TorchEngine`'s model."""
    from posttrain.serve.app import prompt_logprobs

    return prompt_logprobs(engine, prompt)


def engine_topk_prompt_logprobs(engine, prompt: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` likeliest tokens after each prefix ``prompt[:t]``, t >= 1, and their log-probs
    (temperature 1), most likely first, from a `TorchEngine`'s model: two (len(prompt) - 1, k) arrays."""
    x = torch.tensor([prompt], device=engine.device)
    logp = engine.model(input_ids=x).logits[0, :-1].float().log_softmax(-1)
    top = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy().astype(np.float32)


class VLLMSampling:
    """Samples on vLLM servers started with runtime LoRA (see the module docstring): ``urls`` are
    running servers; ``servers`` (a `VLLMServers`), when given, were launched for this and stop on
    `close`. Each push writes under ``weights_dir``. Up to ``slots`` snapshots stay loaded at once
    (default: the servers' ``--max-loras``), one adapter name each, the least recently used one
    replaced by a new snapshot: clients that take turns are not pushed again at each turn."""

    name = "vllm"

    def __init__(self, urls: list[str], *, model_path: str, tokenizer, weights_dir: Path, servers=None,
                 probe_tol: float = 1e-4, slots: int | None = None):
        from collections import OrderedDict

        import httpx

        from posttrain.rl.loop import probe_ids
        from posttrain.rollout.http import HTTPEngine, auth_headers, model_eos_ids
        from posttrain.rollout.vllm import VLLMDialect, server_config

        self.loaded: dict[str, dict] = {}  # adapter name -> the adapter pushed under it (zeroed ones dropped)
        self.resident: OrderedDict[str, str] = OrderedDict()  # snapshot label -> its verified name, LRU first
        self.weights_dir, self.model_path = Path(weights_dir), model_path
        common = {"tokenizer": tokenizer, "eos_ids": model_eos_ids(model_path, tokenizer)}
        self.adapter = HTTPEngine(urls, weights_dir=str(weights_dir), servers=servers,
                                  dialect=VLLMDialect(probe_tol, lora_name=f"{ADAPTER_NAME}-0"), **common)
        try:
            self.base = HTTPEngine(urls, dialect=VLLMDialect(probe_tol), **common)
            with httpx.Client(timeout=30, headers=auth_headers(None)) as client:
                configs = [(server_config(client, url) or {}).get("lora_config") or {} for url in self.adapter.urls]
        except BaseException:
            self.adapter.close()
            raise
        ranks = [c.get("max_lora_rank") for c in configs]
        if not all(isinstance(r, int) for r in ranks):
            self.close()
            raise UserError(f"vLLM server(s) {', '.join(self.adapter.urls)}: LoRA is off or unreadable; start them "
                            f"with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (and "
                            f"VLLM_SERVER_DEV_MODE=1)")
        self.max_rank = min(ranks)
        self.slots = slots or min(c.get("max_loras") if isinstance(c.get("max_loras"), int) else 1 for c in configs)
        self.probe = probe_ids(tokenizer)
        self.held: HTTPEngine | None = None  # the engine whose model is the snapshot held

    def check(self, adapter: dict | None, topk_prompt: int = 0) -> None:
        """`LossInputError` for a snapshot the servers cannot take (a rank past --max-lora-rank)."""
        rank = adapter_rank(adapter)
        if rank > self.max_rank:
            raise LossInputError(f"an adapter of rank {rank}: the vLLM sampler takes rank <= {self.max_rank} "
                                 f"(its servers' --max-lora-rank)")

    def load(self, base, adapter: dict[str, torch.Tensor] | None, label: str = "") -> None:
        """A snapshot: served under its name when it is still loaded, else pushed under a free name
        or the least recently used one's, verified by version and probe. The base: every loaded
        adapter zeroed first (vLLM 0.32's CPU build applies a loaded adapter's ``lm_head`` to
        requests that name no adapter too: 0.49 off the base's log-probs measured), then the base's
        probe checked on requests without an adapter."""
        from posttrain.rollout.vllm import prompt_logprobs

        self.check(adapter)
        self.held = None
        if adapter is not None and label in self.resident:
            self.resident.move_to_end(label)
            self._select(self.resident[label])
            return
        probe = (self.probe, base.snapshot_logprobs(adapter, self.probe))
        if adapter is None:
            self.resident.clear()
            for name in list(self.loaded):
                self._push(name, {k: torch.zeros_like(v) for k, v in self.loaded[name].items()}, base.path, probe)
                del self.loaded[name]
            client, url = self.base.weights.client, self.base.urls[0]
            got = prompt_logprobs(client, url, probe[0])
            worst = max(abs(a - b) for a, b in zip(got, probe[1]))
            if not worst <= self.base.dialect.probe_tol:
                raise RuntimeError(f"vLLM server {url}: its base model's probe log-probs differ from the trainer's "
                                   f"by {worst:.3g}: it serves another model than --model")
            self.held = self.base
            return
        name = self._free_name()
        self.loaded[name] = adapter  # also when the push fails: zeroed before the base is sampled (its probe checks)
        self._push(name, adapter, base.path, probe)
        self.resident[label] = name
        self._select(name)

    def _free_name(self) -> str:
        """A name no verified snapshot holds, or the least recently used snapshot's (dropped)."""
        used = set(self.resident.values())
        for i in range(self.slots):
            if f"{ADAPTER_NAME}-{i}" not in used:
                return f"{ADAPTER_NAME}-{i}"
        return self.resident.popitem(last=False)[1]

    def _select(self, name: str) -> None:
        self.adapter.dialect.lora_name = name
        self.held = self.adapter

    def _push(self, name: str, adapter: dict[str, torch.Tensor], base_path: str, probe) -> None:
        """``adapter`` loaded in place under ``name``, its folders under ``weights_dir/name``: the
        pruning after a push stays in that folder, so the folder each other name was loaded from is
        kept (a server may read it again)."""
        tensors = {k.replace(".ADAPTER.", "."): v for k, v in adapter.items()}
        self.adapter.dialect.lora_name = name
        self.adapter.weights.weights_dir = self.weights_dir / name
        self.adapter.weights.adapter_config = adapter_config(adapter, base_path)  # each snapshot's own layout
        self.adapter.load_weights(tensors, self.adapter.version + 1, weights_checksum(tensors), probe=probe)

    def generate(self, prompts: list[list[int]], n: int, sampling):
        return self._held().generate(prompts, n, sampling)

    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """The servers' log-probs of the prompt's tokens, sent alone (vLLM's CPU LoRA path cannot
        compute them beside decoding requests): after the samples, never with them."""
        from posttrain.rollout.vllm import prompt_logprobs

        engine = self._held()
        return prompt_logprobs(engine.weights.client, engine.urls[0], prompt, model=engine.dialect.lora_name)

    def topk_prompt_logprobs(self, prompt: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """`TorchSampling.topk_prompt_logprobs` from the servers' ``prompt_logprobs=k`` (each
        position's k likeliest tokens by vLLM's rank, plus the prompt's own token when it is not
        among them, which is left out here)."""
        from posttrain.rollout.vllm import post_json

        engine = self._held()
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
        if engine.dialect.lora_name:
            body["model"] = engine.dialect.lora_name
        entries = post_json(engine.weights.client, f"{engine.urls[0]}/v1/completions", body)["choices"][0]["prompt_logprobs"]
        rows = [sorted((e["rank"], int(t), float(e["logprob"])) for t, e in entry.items() if e["rank"] <= k)
                for entry in entries[1:]]
        return (np.array([[t for _, t, _ in row] for row in rows], np.int32),
                np.array([[lp for _, _, lp in row] for row in rows], np.float32))

    def _held(self):
        if self.held is None:
            raise RuntimeError("the vLLM sampler holds no verified snapshot (its last push failed)")
        return self.held

    @property
    def version(self) -> int:
        """The adapter version every server confirmed last."""
        return self.adapter.version

    def close(self) -> None:
        """Servers this started stop; running ones are left with the adapter zeroed (its lm_head
        would leak into other users' base requests, see `load`), as far as they answer."""
        for name, adapter in list(self.loaded.items()) if self.adapter.servers is None else ():
            try:
                self._push(name, {k: torch.zeros_like(v) for k, v in adapter.items()}, self.model_path, None)
            except Exception as e:  # noqa: BLE001 - shutting down: said, not raised
                log.warning("could not zero the adapter %s on the vLLM servers: %s", name, e)
        if getattr(self, "base", None) is not None:
            self.base.close()
        self.adapter.close()


def adapter_rank(adapter: dict | None) -> int:
    return max((t.shape[0] for k, t in (adapter or {}).items() if ".lora_A." in k), default=0)


def adapter_config(adapter: dict[str, torch.Tensor], base_path: str) -> dict:
    """peft's ``adapter_config.json`` of a snapshot (alpha = rank, as `Base.add_adapter` makes them),
    its rank and target modules read from the tensors."""
    import json

    from peft import LoraConfig

    targets = sorted({k.split(".lora_A.")[0].rsplit(".", 1)[-1] for k in adapter if ".lora_A." in k})
    rank = adapter_rank(adapter)
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM",
                        base_model_name_or_path=base_path)
    return json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
