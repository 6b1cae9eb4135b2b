"""A stock vLLM CPU server (float32) as the rollout engine for SmolLM2-135M-Instruct, with a weight
sync that moves the tied embedding (``-m vllm``; one session server, `smollm2_vllm_server`).

Before the sync, vLLM's sampler log-probs equal the base model's within the fp32 gap between
vLLM's kernels and transformers' (`VLLM_TOL`). After a full fine-tuning step (the embedding moves,
and lm_head with it) is written as a folder and reloaded through the sync route, the server passes
the sync's probe and its sampler log-probs equal the trainer's within the same gap, and not those
of a model that took the new embedding but kept the old lm_head (`tests.real.tied.stale_head`)."""

from __future__ import annotations

import pytest

from posttrain.core.dist import World
from posttrain.core.fsdp import export_state_dict
from posttrain.rl.loop import probe_ids
from posttrain.rollout.http import HTTPEngine, model_eos_ids
from posttrain.rollout.types import weights_checksum
from posttrain.rollout.vllm import VLLMDialect
from tests.real.test_smollm2 import trainer_logprobs
from tests.real.tied import max_gap, probe_prompts, probe_sampling, stale_head, stepped

pytestmark = pytest.mark.vllm

VLLM_TOL = 1e-4
"""vLLM's CPU kernels against transformers' forward, both float32 (the sync probe's default
tolerance): 0.9e-5 to 1.9e-5 measured before the sync, 1.2e-5 to 1.3e-5 after it; a stale lm_head is
off by 0.41 to 0.42 (vLLM's CPU build takes no seed: each run samples other tokens)."""

STALE_MIN = 0.05


def _probe(model, tokenizer):
    ids = probe_ids(tokenizer)
    return ids, trainer_logprobs(model, ids[:1], ids[1:]).tolist()


def _sampled_gaps(engine, tokenizer, *models) -> list[float]:
    prompts = probe_prompts(tokenizer)
    out = engine.generate(prompts, 1, probe_sampling())
    return [max_gap(m, prompts, out.completion_ids, out.logprobs) for m in models]


def test_a_full_sync_moves_vllms_tied_head_with_the_embedding(smollm2_vllm_server, smollm2, smollm2_dir, tmp_path):
    base, tokenizer = smollm2
    engine = HTTPEngine(smollm2_vllm_server.urls, weights_dir=str(tmp_path / "weights"), tokenizer=tokenizer,
                        eos_ids=model_eos_ids(smollm2_dir, tokenizer), model_files=smollm2_dir,
                        dialect=VLLMDialect(probe_tol=VLLM_TOL))
    (before,) = _sampled_gaps(engine, tokenizer, base)
    assert before <= VLLM_TOL, before
    trainer = stepped(base, tokenizer)
    weights = export_state_dict(trainer, World())
    # the session server keeps these weights: a later case on it syncs the ones it needs first
    engine.load_weights(weights, 1, weights_checksum(weights), probe=_probe(trainer, tokenizer))
    gap, stale_gap = _sampled_gaps(engine, tokenizer, trainer, stale_head(trainer, base))
    print(f"vLLM vs base {before:.2e}; after the sync vs trainer {gap:.2e}, vs a stale lm_head {stale_gap:.3f}")
    assert gap <= VLLM_TOL and stale_gap > STALE_MIN, (before, gap, stale_gap)
