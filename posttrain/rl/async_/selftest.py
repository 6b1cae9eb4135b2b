"""Start-up self-test of async RL: an update of size zero must change nothing anywhere.

Before the first step, with the trainer's weights unchanged (learning rate zero, in effect):

1. the weights go to the engine through the normal sync path, and the engine's read-back checksum
   must equal the sender's (the copy happened, in full);
2. the engine samples a few completions; the trainer scores the same tokens: the mismatch KL must be
   at most ``asynchrony.self_test_max_kl`` and the mean IS ratio within sqrt(2 KL_max) of 1;
3. perturbed weights are pushed: the same seed must now sample differently (the sync reached the
   sampler's compute path, not just its state dict);
4. the true weights are pushed back: the same seed must give exactly the samples of step 2.

Any failure raises `SelfTestError` naming the check, before a single update is made.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from posttrain.algos import IS_CORRECTIONS
from posttrain.rl.batch import build_batch
from posttrain.rollout.types import weights_checksum


class SelfTestError(RuntimeError):
    """Sampler and trainer disagree, or a weight sync did not reach the engine."""


def _push(engine, weights: dict, version: int) -> None:
    engine.load_version([weights], version, lambda: weights_checksum(weights))
    engine.wait_synced()


def agreement(run, ro) -> dict:
    """Mismatch KL and mean IS ratio between the engine's log-probs and the trainer's, same tokens."""
    batch = build_batch(ro, [0.0] * len(ro), [True] * len(ro), run.tokenizer.pad_token_id)
    old_logp_BT, _, _ = run.policy.score(batch)
    _, m = IS_CORRECTIONS["none"](old_logp_BT, batch.sampler_logp_BT, batch.mask_BT)
    return {"selftest/mismatch_kl": float(m["mismatch/kl"]), "selftest/is_ratio_mean": float(m["is/ratio_mean"]),
            "selftest/logprob_abs_diff_max": float(m["mismatch/logprob_abs_diff_max"])}


def perturbed(weights: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """``weights`` with noise; names holding equal tensors (a tied lm_head and its embedding) get
    the same noisy tensor, as an engine that ties them can hold only one of the two."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, list[str]] = {}  # (shape, first values) -> names: few full comparisons
    for k, v in weights.items():
        like = seen.setdefault((tuple(v.shape), tuple(v.flatten()[:8].tolist())), [])
        twin = next((t for t in like if torch.equal(weights[t], v)), None)
        like.append(k)
        if twin is not None:
            out[k] = out[twin]
        elif v.is_floating_point() and v.numel() > 1:
            noise = torch.randn(v.shape, generator=gen, dtype=torch.float32).to(v.dtype)
            out[k] = v + 0.1 * (v.float().std() + 1e-3).to(v.dtype) * noise
        else:
            out[k] = v.clone()
    return out


def self_test(run, engine) -> dict:
    """Checks 1-4 of the module docstring. An engine that verifies every sync itself
    (``verifies_every_sync``: rollout servers, by checksum or by probe log-probs) runs check 2 only:
    pushing perturbed weights under a version it already confirmed is what those servers refuse.

    Under torchrun the engine is rank 0's: it samples, every rank scores the samples (the trainer's
    forward is a collective) and a failure on rank 0 stops every rank."""
    from posttrain.rl.config import sampling_params
    from posttrain.rl.loop import encode_prompts, share_step

    cfg = run.cfg
    weights = {k: v.clone() for k, v in run.policy.export_weights().items()}  # every rank; {} off rank 0
    verified = share_step(run, lambda: getattr(engine, "verifies_every_sync", False))
    prompts = [run.train_prompts[i] for i in sorted(run.train_prompts)[:2]] or \
        encode_prompts(run.tokenizer, run.source.examples[:2], cfg.data.use_chat_template)  # environments
    sp = dataclasses.replace(sampling_params(cfg, cfg.seed + 12_345), max_new_tokens=min(cfg.rollout.max_new_tokens, 16))

    def sample():
        if not verified:
            _push(engine, weights, engine.version)
        return engine.generate(prompts, 2, sp)

    first = share_step(run, sample)
    m = agreement(run, first)
    max_kl = cfg.asynchrony.self_test_max_kl
    if not m["selftest/mismatch_kl"] <= max_kl or abs(m["selftest/is_ratio_mean"] - 1) > math.sqrt(2 * max_kl):
        raise SelfTestError(f"sampler and trainer disagree on identical weights: mismatch KL "
                            f"{m['selftest/mismatch_kl']:.2e} (limit {max_kl:g}), IS ratio mean "
                            f"{m['selftest/is_ratio_mean']:.4f}; check rollout.engine_dtype, the temperature, "
                            f"and asynchrony.self_test_max_kl")
    if not verified:
        share_step(run, lambda: _sync_reaches_the_sampler(engine, weights, prompts, sp, first, cfg.seed))
    return m | {"selftest/passed": 1}


def _sync_reaches_the_sampler(engine, weights: dict, prompts, sp, first, seed: int) -> None:
    """Checks 3 and 4: perturbed weights change the samples, the true ones restore them."""
    version = engine.version
    _push(engine, perturbed(weights, seed), version)
    probe = engine.generate(prompts, 2, sp)
    if probe.completion_ids == first.completion_ids and probe.logprobs == first.logprobs:
        raise SelfTestError("a weight sync did not reach the engine's sampler: perturbed weights were "
                            "acknowledged but sampling did not change")
    _push(engine, weights, version)
    again = engine.generate(prompts, 2, sp)
    if again.completion_ids != first.completion_ids or again.logprobs != first.logprobs:
        raise SelfTestError("restoring the weights did not restore the engine's samples: "
                            "the engine holds weights other than the trainer's")
