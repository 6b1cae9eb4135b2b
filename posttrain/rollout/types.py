"""Data that crosses the rollout boundary: sampling parameters, the rollout record, the engine protocol.

`Rollouts` holds one entry per sample; the samples of prompt ``i`` are contiguous, at indices
``i*n .. i*n+n-1``. Log-probs follow one convention, named in ``Rollouts.logprob_kind``:

* ``"full_temperature_scaled"``: the log-prob of each sampled token under the *full* distribution
  ``log_softmax(logits / T)`` over the whole vocabulary, not the top-k/top-p truncated one, because
  that is what a trainer recomputes from its own forward pass. For greedy decoding (T = 0) it is
  ``log_softmax(logits)``.

The truncated distribution the token was actually drawn from is reported separately in
``truncated_logprobs`` (log-prob after top-k/top-p renormalisation; 0.0 for greedy, where the
choice had probability one).

Sampling streams are per prompt: prompt ``i`` of a call seeded with ``seed`` draws from its own
generator seeded with `prompt_seed` ``(seed, i)`` (or ``SamplingParams.prompt_seeds[i]``), so its
samples depend only on that seed and the weights, never on which other prompts share the call. A
call split into parts (chunks, engine replicas, servers) reproduces the whole call exactly when each
part passes the seeds of its prompts' indices in the whole (`SamplingParams.for_prompts`).

`weights_checksum` hashes parameter names, dtypes, shapes and raw bytes in name order, so a sender
and a receiver that hold the same tensors agree, whatever order the dict was built in.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import torch
import xxhash

FINISH_REASONS = ("eos", "stop", "length", "error")
"""Why a sample ended. "error": the engine could not produce it (e.g. a server request that failed
after its retries); its completion is empty and the RL loop scores it INFRA_FAIL."""
LOGPROB_KIND = "full_temperature_scaled"


class WeightSyncError(RuntimeError):
    """Weights pushed to a rollout engine were refused (checksum, name or shape mismatch).

    The engine's weights and version are unchanged when this is raised.
    """


@dataclass(kw_only=True)
class SamplingParams:
    """How to sample completions. Also a config section (``rollout.sampling`` in recipes)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax) decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens before sampling (0 = off)."""
    max_new_tokens: int = 64
    """Most tokens generated per completion; a completion that reaches it finishes with "length"."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: the completion is cut right after the first one it contains (finish "stop")."""
    seed: int | None = None
    """Seed of the sampling generator; the same seed, prompts and weights give the same samples."""
    ignore_eos: bool = False
    """Keep generating past EOS tokens (benchmarks that need a fixed number of tokens)."""
    prompt_seeds: list[int] | None = None
    """The sampling seed of each prompt of the call, overriding the ones derived from ``seed``: a part
    of a call sent elsewhere carries its prompts' seeds from the whole call (see `for_prompts`)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.prompt_seeds is not None and not all(isinstance(x, int) for x in self.prompt_seeds):
            raise ValueError(f"prompt_seeds must be a list of ints or None, got {self.prompt_seeds!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def seeds(self, count: int) -> list[int | None]:
        """The sampling seed of each of the call's ``count`` prompts (None: unseeded)."""
        if self.prompt_seeds is None:
            return [prompt_seed(self.seed, i) for i in range(count)]
        if len(self.prompt_seeds) != count:
            raise ValueError(f"prompt_seeds has {len(self.prompt_seeds)} seeds for {count} prompts")
        return list(self.prompt_seeds)

    def for_prompts(self, indices: list[int], count: int) -> "SamplingParams":
        """These parameters for the prompts at ``indices`` of a call of ``count`` prompts: a part
        that samples exactly what those prompts sample in the whole call."""
        if self.seed is None and self.prompt_seeds is None:
            return self
        seeds = self.seeds(count)
        return dataclasses.replace(self, prompt_seeds=[seeds[i] for i in indices])


def prompt_seed(seed: int | None, index: int) -> int | None:
    """The sampling seed of prompt ``index`` of a call seeded with ``seed`` (None stays None).

    A 31-bit hash of both, so neighbouring prompts and neighbouring calls get unrelated streams
    and every server implementation accepts it.
    """
    if seed is None:
        return None
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:4], "big") >> 1


@dataclass
class PaddedRollouts:
    """Rollouts as right-padded tensors, ready for a trainer forward pass.

    Row b is ``prompt_ids[b] + completion_ids[b]`` followed by padding. Position t of
    ``sampler_logp_BT`` holds the sampler's log-prob of ``input_ids_BT[b, t]`` where
    ``completion_mask_BT[b, t]`` is 1, and 0 elsewhere; a trainer compares it with
    ``log_softmax(logits[b, t-1] / T)[input_ids_BT[b, t]]``.
    """

    input_ids_BT: torch.Tensor
    """(B, T) int64: prompt then completion, right-padded with pad_id."""
    attention_mask_BT: torch.Tensor
    """(B, T) int64: 1 on real tokens."""
    completion_mask_BT: torch.Tensor
    """(B, T) float32: 1 on completion tokens the policy chose (with ``Rollouts.loss_mask``: only
    where it is 1; environment tokens inside a multi-turn completion are 0)."""
    sampler_logp_BT: torch.Tensor
    """(B, T) float32: sampler log-prob of each completion token, 0 elsewhere."""
    truncated_logp_BT: torch.Tensor | None = None
    """(B, T) float32: like ``sampler_logp_BT`` under the top-k/top-p distribution actually sampled;
    None when the rollouts carry no truncated log-probs."""


@dataclass
class Rollouts:
    """One entry per sample; samples of prompt i are contiguous at i*n .. i*n+n-1."""

    prompt_idx: list[int]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    """Generated tokens; includes the EOS token if one was generated, ends at the stop token."""
    logprobs: list[list[float]]
    """Sampler log-prob per completion token, see ``logprob_kind``."""
    finish_reason: list[str]
    """"eos" | "stop" | "length" | "error" (see ``FINISH_REASONS``)."""
    policy_version: list[int]
    sampling: SamplingParams
    logprob_kind: str = LOGPROB_KIND
    truncated_logprobs: list[list[float]] | None = None
    """Log-prob under the top-k/top-p renormalised distribution that was sampled (0.0 for greedy)."""
    texts: list[str] | None = None
    """Completion texts decoded at generate time (cut right after the stop string), if a tokenizer was set."""
    loss_mask: list[list[int]] | None = None
    """Per completion token: 1 where the policy sampled it, 0 where an environment wrote it (a
    multi-turn episode's observations, `posttrain.envs`; their logprobs are 0.0). None: every
    completion token was sampled (single-turn)."""

    def __len__(self) -> int:
        return len(self.completion_ids)

    def model_tokens(self) -> list[int]:
        """Tokens the policy generated in each row (an environment's tokens in a multi-turn row,
        loss mask 0, are not the model's)."""
        if self.loss_mask is None:
            return [len(c) for c in self.completion_ids]
        return [int(sum(m)) for m in self.loss_mask]

    def completion_texts(self, tokenizer=None) -> list[str]:
        """The completion texts: the ones stored at generate time, else decoded with ``tokenizer``."""
        if self.texts is not None and tokenizer is None:
            return list(self.texts)
        if tokenizer is None:
            raise ValueError("Rollouts has no stored texts; pass a tokenizer to decode the completions")
        return tokenizer.batch_decode(self.completion_ids, skip_special_tokens=True)

    def to_padded(self, pad_id: int = 0) -> PaddedRollouts:
        """Right-padded tensors (see `PaddedRollouts`)."""
        rows = [p + c for p, c in zip(self.prompt_ids, self.completion_ids)]
        B, T = len(rows), max(len(r) for r in rows)
        ids = torch.full((B, T), pad_id, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        comp = torch.zeros((B, T), dtype=torch.float32)
        logp = torch.zeros((B, T), dtype=torch.float32)
        trunc = torch.zeros((B, T), dtype=torch.float32) if self.truncated_logprobs is not None else None
        for b, (p, c, lp) in enumerate(zip(self.prompt_ids, self.completion_ids, self.logprobs)):
            ids[b, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
            attn[b, : len(p) + len(c)] = 1
            comp[b, len(p) : len(p) + len(c)] = 1.0 if self.loss_mask is None else \
                torch.tensor(self.loss_mask[b], dtype=torch.float32)
            logp[b, len(p) : len(p) + len(c)] = torch.tensor(lp, dtype=torch.float32)
            if trunc is not None:
                trunc[b, len(p) : len(p) + len(c)] = torch.tensor(self.truncated_logprobs[b], dtype=torch.float32)
        return PaddedRollouts(input_ids_BT=ids, attention_mask_BT=attn, completion_mask_BT=comp,
                              sampler_logp_BT=logp, truncated_logp_BT=trunc)

    def select(self, rows: list[int], prompt_idx: list[int]) -> "Rollouts":
        """The samples at ``rows``, renumbered to ``prompt_idx`` (one entry per row)."""
        pick = lambda xs: None if xs is None else [xs[r] for r in rows]  # noqa: E731
        return dataclasses.replace(self, prompt_idx=list(prompt_idx), prompt_ids=pick(self.prompt_ids),
                                   completion_ids=pick(self.completion_ids), logprobs=pick(self.logprobs),
                                   finish_reason=pick(self.finish_reason),
                                   policy_version=pick(self.policy_version),
                                   truncated_logprobs=pick(self.truncated_logprobs), texts=pick(self.texts),
                                   loss_mask=pick(self.loss_mask))

    @staticmethod
    def concat(parts: list["Rollouts"]) -> "Rollouts":
        """Join rollouts produced with the same sampling parameters, in order."""
        if not parts:
            raise ValueError("nothing to concatenate")
        out = {}
        for f in dataclasses.fields(Rollouts):
            first = getattr(parts[0], f.name)
            if isinstance(first, list) or (first is None and f.name in ("truncated_logprobs", "texts", "loss_mask")):
                vals = [getattr(p, f.name) for p in parts]
                if f.name == "loss_mask" and any(v is not None for v in vals):  # all-sampled parts: ones
                    vals = [v if v is not None else [[1] * len(c) for c in p.completion_ids] for v, p in zip(vals, parts)]
                out[f.name] = None if any(v is None for v in vals) else [x for v in vals for x in v]
            else:
                out[f.name] = first
        return Rollouts(**out)


def _tensor_bytes(t: torch.Tensor):
    """The tensor's raw bytes as a buffer, without a copy when it is a contiguous CPU tensor (a
    fresh bytes object of every weight cost more than hashing it)."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else b""


def weights_checksum(weights: dict[str, torch.Tensor]) -> str:
    """XXH3-128 hex digest of the weights: of each tensor's digest over (name, dtype, shape, raw
    bytes), taken in sorted name order (`WeightsDigest`, which builds it a bucket at a time).

    Deterministic across processes; any change of a value, a dtype, a shape or a name changes it.
    Hash the tensors as sent (before any cast on the receiving side). It guards against corruption
    and mix-ups, not an adversary, so a fast non-cryptographic hash does: XXH3 reads ~20 GB/s where
    SHA-256 reads ~1.4 GB/s, and both ends hash every weight of every sync (14 GB for a 7B model
    in bf16: about 0.7 s instead of 10 s, each side).
    """
    digest = WeightsDigest()
    digest.update(weights)
    return digest.hexdigest()


class WeightsDigest:
    """`weights_checksum` of weights that arrive in parts, in any order: each tensor is hashed as it
    comes (16 bytes kept per name) and the parts are combined in name order at the end, so weights
    streamed in buckets need never be all in memory at once to be checked."""

    def __init__(self):
        self._parts: dict[str, bytes] = {}

    def update(self, weights: dict[str, torch.Tensor]) -> None:
        for name in weights:
            t = weights[name]
            h = xxhash.xxh3_128()
            h.update(f"{name}|{str(t.dtype)}|{tuple(t.shape)}\n".encode())
            h.update(_tensor_bytes(t))
            self._parts[name] = h.digest()

    def hexdigest(self) -> str:
        h = xxhash.xxh3_128()
        for name in sorted(self._parts):
            h.update(self._parts[name])
        return h.hexdigest()
