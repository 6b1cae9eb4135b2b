"""TorchEngine against Hugging Face references on a tiny random Llama (both decoders)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posttrain.rollout import Rollouts, RolloutEngine, SamplingParams, TorchEngine, WeightSyncError, weights_checksum
from tests.rollout.conftest import EOS_ID, PROMPTS, make_model

BACKENDS = ["fast", "hf"]


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    """Unbatched `model.generate` reference, cut after EOS."""
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=new)[0, len(prompt):].tolist()
    return out[: out.index(EOS_ID) + 1] if EOS_ID in out else out


def trainer_logprobs(model, rollouts: Rollouts, temperature: float) -> list[list[float]]:
    """Trainer-style recomputation: one forward over prompt+completion, log_softmax(logits/T) gathered."""
    padded = rollouts.to_padded()
    with torch.no_grad():
        logits = model(input_ids=padded.input_ids_BT, attention_mask=padded.attention_mask_BT).logits.float()
    scale = temperature if temperature > 0 else 1.0
    logp_BT = (logits[:, :-1] / scale).log_softmax(-1).gather(-1, padded.input_ids_BT[:, 1:, None]).squeeze(-1)
    out = []
    for b, (p, c) in enumerate(zip(rollouts.prompt_ids, rollouts.completion_ids)):
        out.append(logp_BT[b, len(p) - 1: len(p) - 1 + len(c)].tolist())
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_hf_generate(model, backend):
    engine = TorchEngine(model, backend=backend)
    r = engine.generate(PROMPTS, n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=20))
    assert r.prompt_idx == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for i, prompt in enumerate(PROMPTS):
        expected = hf_greedy(model, prompt, 20)
        assert r.completion_ids[2 * i] == expected
        assert r.completion_ids[2 * i + 1] == expected
        assert r.finish_reason[2 * i] == ("eos" if expected[-1] == EOS_ID else "length")
    assert isinstance(engine, RolloutEngine)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 20), (0.0, 1.0, 0)])
def test_sampler_logprobs_match_trainer_recomputation(model, backend, temperature, top_p, top_k):
    engine = TorchEngine(model, backend=backend)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=16, seed=3)
    r = engine.generate(PROMPTS, n=3, sampling=sampling)
    assert r.logprob_kind == "full_temperature_scaled"
    reference = trainer_logprobs(model, r, temperature)
    diffs = [abs(a - b) for row, ref in zip(r.logprobs, reference) for a, b in zip(row, ref)]
    assert len(diffs) == sum(len(c) for c in r.completion_ids) > 0
    assert max(diffs) < 1e-5
    if top_k or top_p < 1.0:
        # The truncated distribution is sharper: each token is at least as likely under it.
        assert all(t >= f - 1e-6 for tr, fu in zip(r.truncated_logprobs, r.logprobs) for t, f in zip(tr, fu))


def test_bf16_engine_keeps_its_own_copy():
    trainer = make_model()
    engine = TorchEngine(trainer, dtype=torch.bfloat16)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert next(trainer.parameters()).dtype == torch.float32
    before = engine.model.lm_head.weight.clone()
    with torch.no_grad():
        trainer.lm_head.weight.add_(1.0)  # a trainer update must not leak into the sampler
    assert torch.equal(engine.model.lm_head.weight, before)
    r = engine.generate(PROMPTS[:2], n=2, sampling=SamplingParams(max_new_tokens=8, seed=0))
    reference = trainer_logprobs(make_model(), r, 1.0)
    gap = max(abs(a - b) for row, ref in zip(r.logprobs, reference) for a, b in zip(row, ref))
    assert 0 < gap < 0.5  # bf16 sampler vs fp32 trainer: a real but small mismatch


def perturbed_state(model, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_update_changes_generations_and_version(model, backend):
    engine = TorchEngine(model, backend=backend)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = engine.generate(PROMPTS, n=1, sampling=greedy)
    new = perturbed_state(model)
    engine.load_weights(new, version=1, checksum=weights_checksum(new))
    after = engine.generate(PROMPTS, n=1, sampling=greedy)
    assert engine.version == 1 and after.policy_version == [1] * len(PROMPTS)
    assert before.policy_version == [0] * len(PROMPTS)
    assert after.completion_ids != before.completion_ids
    reference = make_model()
    reference.load_state_dict(new)
    for i, prompt in enumerate(PROMPTS):
        assert after.completion_ids[i] == hf_greedy(reference, prompt, 12)


def test_corrupted_checksum_is_refused_and_old_weights_stay(model):
    engine = TorchEngine(model)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = engine.generate(PROMPTS, n=1, sampling=greedy)
    state_before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    new = perturbed_state(model)
    checksum = weights_checksum(new)
    new["model.norm.weight"][0] += 1e-3  # corrupted in transit
    with pytest.raises(WeightSyncError, match="checksum mismatch"):
        engine.load_weights(new, version=1, checksum=checksum)
    with pytest.raises(WeightSyncError, match="checksum mismatch"):
        engine.load_weights(perturbed_state(model), version=1, checksum="0" * 64)
    assert engine.version == 0
    assert all(torch.equal(v, state_before[k]) for k, v in engine.model.state_dict().items())
    assert engine.generate(PROMPTS, n=1, sampling=greedy).completion_ids == before.completion_ids


def _parts(weights: dict, size: int) -> list[dict]:
    names = list(weights)
    return [{k: weights[k] for k in names[i:i + size]} for i in range(0, len(names), size)]


def test_weights_streamed_in_parts_load_like_the_whole(model):
    new = perturbed_state(model)
    whole, streamed = TorchEngine(model), TorchEngine(model)
    whole.load_weights(new, version=1, checksum=weights_checksum(new))
    asked = []
    streamed.load_buckets(iter(_parts(new, 3)), 1, lambda: asked.append(1) or weights_checksum(new))
    assert asked == [1] and streamed.version == 1
    assert all(torch.equal(v, whole.model.state_dict()[k]) for k, v in streamed.model.state_dict().items())
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    assert streamed.generate(PROMPTS, 1, greedy).completion_ids == whole.generate(PROMPTS, 1, greedy).completion_ids


def test_a_stream_that_arrives_corrupted_or_breaks_off_leaves_an_engine_that_refuses_to_generate(model):
    engine = TorchEngine(model)
    new = perturbed_state(model)
    checksum = weights_checksum(new)
    parts = _parts(new, 3)
    parts[1] = {k: v + 1e-3 for k, v in parts[1].items()}  # corrupted in transit
    with pytest.raises(WeightSyncError, match="mixed"):
        engine.load_buckets(iter(parts), 1, lambda: checksum)
    assert engine.version == 0
    with pytest.raises(WeightSyncError, match="not one version"):
        engine.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_new_tokens=4))
    bad = _parts(new, 3)[:1] + [{"model.not_a_weight": torch.zeros(3)}]
    with pytest.raises(WeightSyncError, match="unknown weight names"):
        engine.load_buckets(iter(bad), 1, lambda: checksum)
    with pytest.raises(WeightSyncError, match="interrupted"):
        engine.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_new_tokens=4))
    engine.load_buckets(iter(_parts(new, 3)), 1, lambda: checksum)  # a whole version heals it
    assert engine.version == 1 and engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=4)).completion_ids


def test_unknown_names_and_shapes_are_refused(model):
    engine = TorchEngine(model)
    bad = {"model.not_a_weight": torch.zeros(3)}
    with pytest.raises(WeightSyncError, match="unknown weight names"):
        engine.load_weights(bad, version=1, checksum=weights_checksum(bad))
    bad = {"model.norm.weight": torch.zeros(3)}
    with pytest.raises(WeightSyncError, match="shape"):
        engine.load_weights(bad, version=1, checksum=weights_checksum(bad))
    assert engine.version == 0


def test_partial_update_of_one_tensor(model):
    engine = TorchEngine(model)
    new = {"lm_head.weight": torch.zeros_like(model.lm_head.weight)}
    engine.load_weights(new, version=4, checksum=weights_checksum(new))
    r = engine.generate(PROMPTS[:1], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=3))
    # All logits equal: greedy picks token 0 and its log-prob is log(1/V).
    assert r.completion_ids[0] == [0, 0, 0]
    assert r.logprobs[0][0] == pytest.approx(-torch.log(torch.tensor(128.0)).item(), abs=1e-6)
    assert engine.version == 4


# ------------------------------------------------------------------ batch-invariant sampling streams


def _finishing_model():
    """A model with many EOS ids, so sampled rows finish at scattered steps (and the batch compacts)."""
    m = make_model()
    m.generation_config.eos_token_id = list(range(100, 120))
    return m


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompts_samples_do_not_depend_on_its_batch(backend):
    """One call over [a, b, c, d] equals [a, b] and [c, d] sent apart with their seeds from the whole
    call (what an engine replica receives), and equals chunking by 5 samples (groups cut mid-way)."""
    model, prompts, n = _finishing_model(), PROMPTS[:4], 3
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=11)
    whole = TorchEngine(model, backend=backend).generate(prompts, n, sampling)
    halves = [TorchEngine(model, backend=backend).generate(prompts[i:i + 2], n, sampling.for_prompts([i, i + 1], 4))
              for i in (0, 2)]
    chunked = TorchEngine(model, backend=backend, max_batch=5).generate(prompts, n, sampling)
    lengths = [len(c) for c in whole.completion_ids]
    assert {"eos", "length"} <= set(whole.finish_reason) and len(set(lengths)) > 2  # rows end apart
    for other in (Rollouts.concat(halves), chunked):
        assert other.completion_ids == whole.completion_ids
        assert other.finish_reason == whole.finish_reason
        for got, want in zip(other.logprobs, whole.logprobs):
            assert got == pytest.approx(want, abs=1e-5)
    # a prompt alone with its own seed samples what it samples among others
    alone = TorchEngine(model, backend=backend).generate([prompts[2]], n, sampling.for_prompts([2], 4))
    assert alone.completion_ids == whole.completion_ids[2 * n: 3 * n]


def test_prompt_seeds_must_match_the_prompts(model):
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        TorchEngine(model).generate(PROMPTS[:3], 1, SamplingParams(prompt_seeds=[1, 2]))


def test_new_stop_lists_decode_the_vocabulary_once_and_the_cache_stays_bounded(model, tokenizer):
    """A server sees a new stop list per request: each must not decode the vocabulary again (it
    ran on the engine thread, stalling every request), and the tables kept stay bounded."""
    from posttrain.rollout.engine import STOP_CHECKERS_KEPT

    decodes = []
    decode = tokenizer.decode

    class Counting(type(tokenizer)):
        def decode(self, ids, skip_special_tokens=False):
            if len(ids) == 1:
                decodes.append(ids[0])
            return decode(ids, skip_special_tokens)

    engine = TorchEngine(model, tokenizer=Counting())
    s = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    for i in range(STOP_CHECKERS_KEPT + 20):
        engine.generate([[5, 6, 7]], 1, dataclasses.replace(s, stop=[chr(0x100 + i % 100) + str(i)]))
    assert len(engine._stop_checkers) == STOP_CHECKERS_KEPT
    assert len(decodes) <= len(tokenizer) + 4 * (STOP_CHECKERS_KEPT + 20)  # one pass, then a few tails


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # the fast decoder, the generic one
def test_set_dtype_up_after_a_16_bit_spell_is_exactly_float32_once_a_version_loads(arch, tmp_path):
    """A bf16 engine raised to float32 and handed the float32 weights samples exactly what a float32
    engine does (the rotary frequencies a cast would round are recomputed), and back in bf16
    exactly what it sampled before."""
    from transformers import AutoModelForCausalLM

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    path = str(build_tiny(tmp_path, "nano", seed=0, arch=arch))
    weights = AutoModelForCausalLM.from_pretrained(path).state_dict()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    engine, reference = TorchEngine(path, dtype=torch.bfloat16), TorchEngine(path, dtype=torch.float32)
    before = engine.generate([[5, 6, 7, 8]], 2, sampling)
    engine.set_dtype(torch.float32)
    engine.load_weights(weights, 1, weights_checksum(weights))
    up, want = engine.generate([[5, 6, 7, 8]], 2, sampling), reference.generate([[5, 6, 7, 8]], 2, sampling)
    assert up.completion_ids == want.completion_ids and up.logprobs == want.logprobs
    engine.set_dtype(torch.bfloat16)
    engine.load_weights(weights, 2, weights_checksum(weights))
    back = engine.generate([[5, 6, 7, 8]], 2, sampling)
    assert back.completion_ids == before.completion_ids and back.logprobs == before.logprobs
