"""`torchrun --nproc-per-node 2 -m posttrain tinker-serve --sampler vllm` against the session's vLLM
LoRA server: the base is sharded over two gloo ranks, rank 0 pushes each sampler snapshot as a LoRA
adapter and checks the server's probe log-probs against its own unsharded copy of the base with the
snapshot merged (no collective); the samples' log-probs equal the sharded trainer's."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.tinker.test_tinker_ranks import Ranks
from tests.tinker.test_tinker_server import result
from tests.tinker.test_tinker_vllm import PROMPT, TOL, base_logprobs, new_client, sample, train, trainer_logprobs

pytestmark = pytest.mark.vllm


def test_two_ranks_sample_on_vllm(vllm_lora_server, vllm_model_dir, tmp_path):
    ranks = Ranks(tmp_path, vllm_model_dir, name="tiny", flags=["--sampler", "vllm", "--vllm-url", vllm_lora_server.urls[0]])
    try:
        with httpx.Client(base_url=ranks.url(), timeout=120) as http:
            model_id = new_client(http)
            train(http, model_id, steps=2)
            sid = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id}))["sampling_session_id"]
            seqs, prompt_lp = sample(http, sid, {"max_tokens": 8, "temperature": 1.0}, n=3, prompt_logprobs=True)
            gap, from_base = 0.0, 0.0
            for tokens, logprobs in seqs:  # the trainer's: a forward on both ranks, each its shard
                full = PROMPT + tokens
                gap = max(gap, float(np.abs(trainer_logprobs(http, model_id, full)[len(PROMPT) - 1:] - logprobs).max()))
                from_base = max(from_base, float(np.abs(base_logprobs(vllm_model_dir, full)[len(PROMPT) - 1:] - logprobs).max()))
            gap = max(gap, float(np.abs(trainer_logprobs(http, model_id, PROMPT) - prompt_lp[1:]).max()))
            print(f"\nvLLM sampler vs 2-rank trainer log-prob gap: {gap:.2e} (vs the base: {from_base:.2f})")
            assert gap < TOL, gap
            assert from_base > 0.05, from_base  # the trained adapter is what vLLM applied
            # the base sampler (the pushed adapters zeroed first): the session server is left on its base
            base_sid = http.post("/api/v1/create_sampling_session", json={"base_model": "tiny"}).json()["sampling_session_id"]
            _, base_lp = sample(http, base_sid, {"max_tokens": 1}, prompt_logprobs=True)
            np.testing.assert_allclose(base_lp[1:], base_logprobs(vllm_model_dir, PROMPT), atol=TOL)
            assert ranks.proc.poll() is None and len(ranks.ranks()) == 2
    finally:
        ranks.kill()
