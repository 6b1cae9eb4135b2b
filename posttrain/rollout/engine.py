"""`TorchEngine`: the default rollout engine, a batched KV-cache sampler in plain PyTorch.

The engine holds its **own copy** of the policy weights (a deep copy of the model it is given, cast
to ``dtype``, e.g. bf16 while the trainer stays in fp32, so real sampler/trainer mismatch shows)
and receives new ones through `load_version` (streamed, `load_buckets`) or `load_weights` (one dict),
which verify a checksum.

One `generate` call:

1. expands each prompt to ``n`` samples (contiguous), in chunks of at most ``max_batch`` samples;
2. prefills each *distinct* prompt of the chunk once, left-padded to a common length, then copies
   its KV rows to its ``n`` samples (prefill costs 1/n of a naive batched prefill);
3. decodes step by step into a preallocated KV cache; each step samples all rows at once
   (`sampling.sample_next`) with uniform numbers drawn up front from one generator per prompt
   (`sampling.uniforms`, seeded by ``SamplingParams.seeds``: a prompt's samples do not depend on
   its batch, its chunk, or compaction), records token and log-probs into preallocated (B, max_new) tensors,
   and marks rows finished on EOS, a stop string, or ``max_new_tokens``;
4. **compacts** the batch when finished rows reach ``compact_fraction`` of it (at least one): the
   decoder index-selects the live rows of its cache, positions and padding bias, so finished
   samples stop costing compute. The threshold trades the copy of the cache against the wasted
   rows: a compaction reads and writes the filled cache once, about what one step's attention reads.

Two decoders sit behind it: `fast_llama.FastLlamaDecoder` for Llama-family models (Llama, Mistral,
Qwen2, Qwen3: fused weights, no per-step mask building) and `hf_decoder.HFDecoder` for other Hugging
Face causal LMs (``model.forward`` with a static cache and the masks each layer type needs: Gemma
2/3, Phi-3, ...). ``backend="auto"`` picks the fast one when it supports the model. A model neither
can run exactly is refused here, when the engine is built (`windows.UnsupportedModel`), not mid-run.

Log-probs: see `posttrain.rollout.types` (``logprob_kind = "full_temperature_scaled"``).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import Callable

import torch

from posttrain.rollout.fast_llama import FastLlamaDecoder, supports
from posttrain.rollout.hf_decoder import HFDecoder
from posttrain.rollout.protocol import Buckets, Probe
from posttrain.rollout.sampling import StopChecker, TokenTexts, sample_next, uniforms
from posttrain.rollout.types import Rollouts, SamplingParams, WeightsDigest, WeightSyncError, weights_checksum

FINISH_CODES = ("length", "eos", "stop")
STOP_CHECKERS_KEPT = 32
"""Stop-string lists whose candidate tables an engine keeps (least recently used go first)."""


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _recompute_rotary(model) -> None:
    """Rotary frequencies are computed, not loaded: a cast to 16 bits rounds them and no weight load
    restores them. Rebuild them in float32 (as serving engines keep them), so that the engine's
    rotation is the trainer's in any dtype, and float32 again after a 16-bit spell."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and hasattr(module, "config"):
            try:
                fresh = type(module)(module.config)
            # A constructor of another shape, or a config it cannot build (a layer type the
            # decoders refuse just after, with the reason): its buffers stay as cast.
            except (TypeError, KeyError, ValueError):
                continue
            for name, buf in fresh.named_buffers(recurse=False):
                if buf.is_floating_point() and name in module._buffers:
                    module._buffers[name] = buf.to(module._buffers[name].device)


class TorchEngine:
    """Rollout engine over a Hugging Face causal LM (see module docstring).

    ``model`` is a `PreTrainedModel` (deep-copied) or a local path (loaded with
    ``AutoModelForCausalLM``; the tokenizer too, when ``tokenizer`` is None). A tokenizer is needed
    for stop strings and for the ``texts`` stored in `Rollouts`.
    """

    def __init__(self, model, *, tokenizer=None, dtype: torch.dtype = torch.float32, device="cpu",
                 max_batch: int | None = None, backend: str = "auto", compact_fraction: float = 0.125):
        if isinstance(model, str):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            # One conversion of a GGUF file, cached, serves every reader: the callers pass its folder
            # (`posttrain.models.hf.model_folder`), so the engine never dequantises the file again.
            if model.lower().endswith(".gguf"):
                raise ValueError(f"{model}: a GGUF file; pass its converted folder (posttrain.models.hf.model_folder)")
            path = model
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        else:
            model = copy.deepcopy(model)
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")
        if not 0.0 <= compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in [0, 1], got {compact_fraction}")
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        _recompute_rotary(self.model)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.compact_fraction = compact_fraction
        self.version = 0
        self._mixed: str | None = None  # why the weights are not one version's (`load_buckets`)
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.eos_ids = self._eos_ids()
        if backend == "auto":
            backend = "fast" if supports(self.model) else "hf"
        if backend not in ("fast", "hf"):
            raise ValueError(f"backend must be 'auto', 'fast' or 'hf', got {backend!r}")
        if backend == "fast" and not supports(self.model):
            raise ValueError(f"the fast decoder does not support model type {self.model.config.model_type!r}")
        self.backend = backend
        self.decoder = FastLlamaDecoder(self.model) if backend == "fast" else HFDecoder(self.model)
        self._stop_checkers: OrderedDict[tuple[str, ...], StopChecker] = OrderedDict()  # LRU
        self._token_texts: TokenTexts | None = None

    def _eos_ids(self) -> list[int]:
        gen_cfg = getattr(self.model, "generation_config", None)
        ids = _as_id_list(getattr(gen_cfg, "eos_token_id", None)) or _as_id_list(self.model.config.eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return sorted(set(ids))

    # ----------------------------------------------------------------------------------- weights

    def load_weights(self, weights: dict[str, torch.Tensor], version: int, checksum: str, *,
                     allow_older: bool = False) -> None:
        """Replace (some or all of) the weights, by state-dict name, after verifying ``checksum``.

        The checksum is recomputed over the tensors as received (before the cast to the engine's
        dtype). Any mismatch of checksum, name or shape raises `WeightSyncError` before a single
        weight is changed. On success ``version`` becomes the engine's version. A version older
        than the loaded one is refused (an update arriving out of order) unless ``allow_older``:
        a server taking weights from a new or resumed trainer restarts its count.
        """
        actual = weights_checksum(weights)
        if actual != checksum:
            raise WeightSyncError(f"checksum mismatch for version {version}: expected {checksum}, computed {actual}; "
                                  f"weights left at version {self.version}")
        self._check_version(version, allow_older)
        self._check_names(weights)
        self._copy(weights)
        self.decoder.refresh()
        self.version = version

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None:
        """`RolloutEngine.load_version`: `set_dtype` when asked, then `load_buckets`. The probe adds
        nothing here: the checksum of the very tensors copied in is the proof."""
        if dtype is not None:
            self.set_dtype(getattr(torch, dtype))
        self.load_buckets(buckets, version, digest)

    def load_buckets(self, buckets, version: int, checksum) -> None:
        """`load_weights` for weights streamed in parts (dicts, e.g. `export_buckets`' on their way
        from the trainer's shards): each part's names and shapes are checked and it is copied in as
        it arrives, so no second full copy is ever held. ``checksum()`` — the sender's, asked for
        after the last part — must equal that of everything received; otherwise the engine holds a
        mix of versions and refuses to generate until a whole version loads."""
        self._check_version(version, False)
        self._mixed = f"a load of version {version} was interrupted"
        digest = WeightsDigest()
        for part in buckets:
            self._check_names(part)
            digest.update(part)
            self._copy(part)
            del part  # not held while the next one arrives
        expected, actual = checksum(), digest.hexdigest()
        if actual != expected:
            self._mixed = f"version {version} arrived corrupted (checksum {actual[:12]}, sent {expected[:12]})"
            raise WeightSyncError(f"checksum mismatch for version {version}: expected {expected}, computed {actual}; "
                                  "the engine's weights are mixed and it generates nothing until a whole version loads")
        self._mixed = None
        self.decoder.refresh()
        self.version = version

    def set_dtype(self, dtype: torch.dtype) -> None:
        """Hold the weights in ``dtype`` from now on (``rollout.precision_fallback``). The values are
        cast as they stand, so a rise to float32 gains precision only when the next version loads."""
        if self.model.get_output_embeddings().weight.dtype == dtype:
            return
        self.model.to(dtype=dtype)
        _recompute_rotary(self.model)
        self.decoder = FastLlamaDecoder(self.model) if self.backend == "fast" else HFDecoder(self.model)

    def _check_version(self, version: int, allow_older: bool) -> None:
        if version < self.version and not allow_older:
            raise WeightSyncError(f"version {version} is older than the loaded version {self.version}")

    def _check_names(self, weights: dict[str, torch.Tensor]) -> None:
        targets = self.model.state_dict()
        unknown = sorted(set(weights) - set(targets))
        if unknown:
            raise WeightSyncError(f"{len(unknown)} unknown weight names, e.g. {unknown[:3]}; weights left at version {self.version}")
        for name, t in weights.items():
            if tuple(t.shape) != tuple(targets[name].shape):
                raise WeightSyncError(f"{name}: shape {tuple(t.shape)} != {tuple(targets[name].shape)}; "
                                      f"weights left at version {self.version}")

    def _copy(self, weights: dict[str, torch.Tensor]) -> None:
        targets = self.model.state_dict()
        with torch.no_grad():
            for name, t in weights.items():
                targets[name].copy_(t)

    # -------------------------------------------------------------------------------- generation

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts:
        """``n`` samples of each prompt; samples of prompt i are at i*n .. i*n+n-1."""
        if self._mixed:
            raise WeightSyncError(f"the engine's weights are not one version's ({self._mixed}); load a whole version first")
        self._check_prompts(prompts, n)
        stop = self._stop_checker(sampling.stop)
        seeds = sampling.seeds(len(prompts))
        total = len(prompts) * n
        chunk = self.max_batch or total
        parts = [self._generate_chunk(prompts, n, start, min(start + chunk, total), sampling, seeds, stop)
                 for start in range(0, total, chunk)]
        return Rollouts.concat(parts)

    def _check_prompts(self, prompts: list[list[int]], n: int) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            raise ValueError("no prompts given")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.vocab_size})")

    def _stop_checker(self, stops: list[str]) -> StopChecker | None:
        if not stops:
            return None
        if self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass tokenizer= to TorchEngine")
        key = tuple(stops)
        if key in self._stop_checkers:
            self._stop_checkers.move_to_end(key)
            return self._stop_checkers[key]
        if self._token_texts is None:  # the vocabulary is decoded once, not once per stop list
            self._token_texts = TokenTexts(self.tokenizer, self.vocab_size)
        self._stop_checkers[key] = StopChecker(self.tokenizer, stops, self.vocab_size, self._token_texts)
        if len(self._stop_checkers) > STOP_CHECKERS_KEPT:  # each holds a (V,) table: keep the recent ones
            self._stop_checkers.popitem(last=False)
        return self._stop_checkers[key]

    def _generate_chunk(self, prompts, n, start, end, sampling, seeds, stop) -> Rollouts:
        prompt_of_sample = torch.arange(start, end) // n
        unique, expand = torch.unique_consecutive(prompt_of_sample, return_inverse=True)
        u_BT = None
        if not sampling.greedy:  # the chunk's rows of its prompts' whole blocks
            first = int(unique[0]) * n
            u_BT = uniforms([seeds[i] for i in unique.tolist()], n, sampling.max_new_tokens)
            u_BT = u_BT[start - first: end - first].to(self.device)
        chunk_prompts = [prompts[i] for i in unique.tolist()]
        width = max(len(p) for p in chunk_prompts)
        ids = torch.zeros(len(chunk_prompts), width, dtype=torch.long)
        for u, p in enumerate(chunk_prompts):
            ids[u, width - len(p):] = torch.tensor(p, dtype=torch.long)
        pad = torch.tensor([width - len(p) for p in chunk_prompts], dtype=torch.long)
        dev = self.device
        logits = self.decoder.prefill(ids.to(dev), pad.to(dev), expand.to(dev), width + sampling.max_new_tokens)
        tok, lp, tlp, length, reason = self._decode(logits, sampling, u_BT, stop)
        return self._package(prompt_of_sample.tolist(), prompts, tok, lp, tlp, length, reason, sampling, stop)

    @torch.inference_mode()
    def _decode(self, logits, sampling: SamplingParams, u_BT, stop):
        """The step loop. Returns per-row tokens/log-probs (B, max_new), lengths and finish codes."""
        b, steps, dev = logits.shape[0], sampling.max_new_tokens, self.device
        out_tok = torch.zeros(b, steps, dtype=torch.long, device=dev)
        out_lp = torch.zeros(b, steps, dtype=torch.float32, device=dev)
        out_tlp = torch.zeros(b, steps, dtype=torch.float32, device=dev)
        length = torch.full((b,), steps, dtype=torch.long, device=dev)
        reason = torch.zeros(b, dtype=torch.long, device=dev)  # index into FINISH_CODES
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=dev) if self.eos_ids and not sampling.ignore_eos else None
        rows = torch.arange(b, device=dev)  # original row of each live batch position
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        for step in range(steps):
            tok, lp, tlp = sample_next(logits, sampling, None if u_BT is None else u_BT[rows, step])
            out_tok[rows, step], out_lp[rows, step], out_tlp[rows, step] = tok, lp, tlp
            hit_eos = alive & torch.isin(tok, eos) if eos is not None else torch.zeros_like(alive)
            hit_stop = self._stop_hits(stop, tok, alive & ~hit_eos, rows, out_tok, step)
            newly = hit_eos | hit_stop
            if newly.any():
                length[rows[newly]] = step + 1
                reason[rows[newly]] = torch.where(hit_eos[newly], 1, 2)
                alive &= ~newly
                if not alive.any():
                    break
                dead = len(alive) - int(alive.sum())
                if dead >= max(1, math.ceil(self.compact_fraction * len(alive))):
                    keep = alive.nonzero().squeeze(1)
                    self.decoder.keep(keep)
                    rows, alive, tok = rows[keep], alive[keep], tok[keep]
            if step + 1 < steps:
                logits = self.decoder.step(tok)
        return out_tok, out_lp, out_tlp, length, reason

    def _stop_hits(self, stop, tok, candidates, rows, out_tok, step) -> torch.Tensor:
        hits = torch.zeros_like(candidates)
        if stop is None:
            return hits
        check = candidates & stop.rows_to_check(tok)
        for i in check.nonzero().flatten().tolist():  # only rows whose new token may end a stop string
            if stop.hits(out_tok[rows[i], : step + 1].tolist()):
                hits[i] = True
        return hits

    def _package(self, prompt_of_sample, prompts, tok, lp, tlp, length, reason, sampling, stop) -> Rollouts:
        lengths, reasons = length.tolist(), [FINISH_CODES[r] for r in reason.tolist()]
        tok, lp, tlp = tok.tolist(), lp.tolist(), tlp.tolist()
        completion = [row[:k] for row, k in zip(tok, lengths)]
        texts = None
        if self.tokenizer is not None:
            texts = self.tokenizer.batch_decode(completion, skip_special_tokens=True)
            for i, why in enumerate(reasons):
                if why == "stop":
                    texts[i] = stop.cut(completion[i])
        return Rollouts(
            prompt_idx=list(prompt_of_sample),
            prompt_ids=[list(prompts[i]) for i in prompt_of_sample],
            completion_ids=completion,
            logprobs=[row[:k] for row, k in zip(lp, lengths)],
            finish_reason=reasons,
            policy_version=[self.version] * len(lengths),
            sampling=sampling,
            truncated_logprobs=[row[:k] for row, k in zip(tlp, lengths)],
            texts=texts,
        )
