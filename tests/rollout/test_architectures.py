"""TorchEngine on the architectures users bring, against transformers' own generate and forward.

Tiny random-weight models from transformers' own config classes, saved and loaded from a folder as
users load them. Sliding windows (8) are shorter than every sequence here (prompts of 5 and 12
tokens, 32 new), and the two prompts differ in length, so left padding meets the window.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from posttrain.errors import UserError
from posttrain.rollout import SamplingParams, TorchEngine
from posttrain.rollout.fast_llama import supports
from tests.rollout.conftest import CharTokenizer
from tests.rollout.test_rollout_engine import trainer_logprobs

WINDOW = 8
NEW = 32
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 22))]
DIMS = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, eos_token_id=None, bos_token_id=None,
            pad_token_id=0, tie_word_embeddings=False)
MIXED = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]

CONFIGS = {  # name -> (config, the backend "auto" must pick)
    "llama": (lambda: transformers.LlamaConfig(**DIMS), "fast"),
    "mistral": (lambda: transformers.MistralConfig(sliding_window=WINDOW, **DIMS), "fast"),
    "ministral": (lambda: transformers.MinistralConfig(sliding_window=WINDOW, layer_types=MIXED, **DIMS), "hf"),
    "qwen2_sliding": (lambda: transformers.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW,
                                                       max_window_layers=2, **DIMS), "fast"),
    "qwen3": (lambda: transformers.Qwen3Config(**DIMS), "fast"),
    "qwen3_moe": (lambda: transformers.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                      **DIMS), "hf"),
    "phi3": (lambda: transformers.Phi3Config(sliding_window=WINDOW, **DIMS), "hf"),
    "olmo2": (lambda: transformers.Olmo2Config(**DIMS), "hf"),
    # soft caps small enough to bind on a random model's logits and scores
    "gemma2": (lambda: transformers.Gemma2Config(sliding_window=WINDOW, query_pre_attn_scalar=8, attn_logit_softcapping=1.0,
                                                 final_logit_softcapping=2.0, **DIMS), "hf"),
    "gemma3": (lambda: transformers.Gemma3TextConfig(sliding_window=WINDOW, query_pre_attn_scalar=8, layer_types=MIXED,
                                                     **DIMS), "hf"),
}
CASES = [(name, backend) for name, (_, auto) in CONFIGS.items() for backend in (["fast", "hf"] if auto == "fast" else ["hf"])]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    dirs = {}
    for name, (config, _) in CONFIGS.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config())
        dirs[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(dirs[name])
    return dirs


def load(model_dirs, name):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dirs[name]).eval()


def engine_for(model_dirs, name, backend, **kw):
    return TorchEngine(str(model_dirs[name]), tokenizer=CharTokenizer(), backend=backend, **kw)


def hf_greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)[0, len(prompt):].tolist()


@pytest.mark.parametrize("name,backend", CASES)
def test_greedy_equals_hf_generate(model_dirs, name, backend):
    engine = engine_for(model_dirs, name, backend)
    r = engine.generate(PROMPTS, n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True))
    model = load(model_dirs, name)
    for i, prompt in enumerate(PROMPTS):
        expected = hf_greedy(model, prompt)
        assert len(expected) == NEW
        assert r.completion_ids[2 * i] == r.completion_ids[2 * i + 1] == expected


@pytest.mark.parametrize("name,backend", CASES)
def test_sampled_logprobs_equal_a_plain_forward(model_dirs, name, backend):
    engine = engine_for(model_dirs, name, backend)
    r = engine.generate(PROMPTS, n=2, sampling=SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=NEW, seed=5, ignore_eos=True))
    assert all(len(c) == NEW for c in r.completion_ids)
    reference = trainer_logprobs(load(model_dirs, name), r, 0.7)
    assert max(abs(a - b) for row, ref in zip(r.logprobs, reference) for a, b in zip(row, ref)) < 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_auto_picks_the_fast_decoder_where_it_applies(model_dirs, name):
    assert engine_for(model_dirs, name, "auto").backend == CONFIGS[name][1]


@pytest.mark.parametrize("name,backend", [("gemma3", "hf"), ("mistral", "fast"), ("qwen2_sliding", "fast")])
def test_finished_rows_leave_the_batch_with_sliding_windows(model_dirs, name, backend):
    """With many EOS ids rows end at scattered steps; compacting them away changes no sample."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=3)
    runs = []
    for fraction in (0.125, 1.0):
        engine = engine_for(model_dirs, name, backend, compact_fraction=fraction)
        engine.eos_ids = list(range(100, 112))
        runs.append((engine.generate(PROMPTS, n=3, sampling=sampling), engine.decoder.rows_seen))
    (compacted, seen), (plain, _) = runs
    lengths = [len(c) for c in compacted.completion_ids]
    assert len(set(lengths)) > 2 and max(lengths) > WINDOW + 2  # rows end apart, some past the window
    assert min(seen[1:]) < len(lengths)  # the batch did shrink
    assert compacted.completion_ids == plain.completion_ids
    for got, want in zip(compacted.logprobs, plain.logprobs):
        assert got == pytest.approx(want, abs=1e-5)
    reference = trainer_logprobs(load(model_dirs, name), compacted, 1.0)
    assert max(abs(a - b) for row, ref in zip(compacted.logprobs, reference) for a, b in zip(row, ref)) < 1e-5


@pytest.mark.parametrize("name", ["mistral", "ministral", "qwen2_sliding", "phi3", "gemma2", "gemma3"])
def test_the_window_binds_on_these_sequences(model_dirs, name):
    """Guards the tests above: the same model with the window opened up predicts differently here,
    so an engine ignoring the window fails them."""
    model = load(model_dirs, name)
    ids = torch.tensor([PROMPTS[1] + list(range(30, 30 + NEW))])
    with torch.no_grad():
        windowed = model(ids).logits
        model.config.sliding_window = 10_000
        opened = model(ids).logits
    assert (windowed - opened).abs().max() > 1e-2


def test_gemma2_final_soft_cap_is_in_the_engine_logits(model_dirs):
    """The engine's log-probs are those of the capped logits, not the raw ones."""
    r = engine_for(model_dirs, "gemma2", "hf").generate(PROMPTS, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=8))
    model = load(model_dirs, "gemma2")
    capped = trainer_logprobs(model, r, 1.0)
    model.config.final_logit_softcapping = None
    raw = trainer_logprobs(model, r, 1.0)
    flat = lambda rows: torch.tensor([x for row in rows for x in row])  # noqa: E731
    assert (flat(r.logprobs) - flat(capped)).abs().max() < 1e-5
    assert (flat(r.logprobs) - flat(raw)).abs().max() > 1e-3  # 100x the tolerance: a missing cap fails


def test_a_flex_attention_model_runs_on_sdpa_in_the_engines_copy(model_dirs):
    """Flex (and flash) kernels take no additive 4-D mask; the engine's own copy is switched."""
    flex = transformers.AutoModelForCausalLM.from_pretrained(model_dirs["gemma3"], attn_implementation="flex_attention")
    engine = TorchEngine(flex, backend="hf")
    assert engine.model.config._attn_implementation == "sdpa"
    assert flex.config._attn_implementation == "flex_attention"  # the caller's model is left alone
    r = engine.generate(PROMPTS, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True))
    model = load(model_dirs, "gemma3")
    assert r.completion_ids == [hf_greedy(model, p) for p in PROMPTS]


# ------------------------------------------------------------------------------- refusals at start


def _gemma3(**overrides):
    """A Gemma 3 whose config then says ``overrides`` (set after building: the model code itself
    would not build some of them, e.g. a RoPE per layer type it has no parameters for)."""
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(CONFIGS["gemma3"][0]()).eval()
    for k, v in overrides.items():
        setattr(model.config, k, v)
    return model


@pytest.mark.parametrize("overrides,what", [
    ({"use_bidirectional_attention": True}, "bidirectional attention"),
    ({"layer_types": ["chunked_attention", "full_attention", "sliding_attention", "full_attention"]},
     r"layer types \['chunked_attention'\]"),
    ({"sliding_window": None}, "sliding_attention layers without a sliding_window"),
])
def test_what_cannot_run_exactly_is_refused_at_start(overrides, what):
    with pytest.raises(UserError, match=f"model type 'gemma3_text': {what}") as e:
        TorchEngine(_gemma3(**overrides))
    assert "\n" not in str(e.value)


def test_a_forward_that_ignores_the_masks_is_refused_at_start():
    """The start probe: a model whose forward drops the 4-D masks (as ALiBi models rebuild their own)
    attends to padding, and is refused before any rollout rather than drifting."""
    model = _gemma3()
    forward = model.forward

    @functools.wraps(forward)
    def without_masks(*args, **kw):
        return forward(*args, **{**kw, "attention_mask": None})

    model.forward = without_masks
    with pytest.raises(UserError, match="model type 'gemma3_text': its forward with the rollout cache and masks differs"):
        TorchEngine(model)


def test_models_whose_forward_cannot_take_the_cache_are_refused_at_start():
    torch.manual_seed(0)
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=128, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(UserError, match="model type 'bloom': its forward fails with the rollout cache and masks"):
        TorchEngine(bloom)


def test_fast_decoder_declines_what_it_does_not_implement(model_dirs):
    """A q/k norm outside Qwen3, and attention `layer_windows` cannot describe, go to the generic path."""
    assert supports(load(model_dirs, "qwen3"))
    qwen3 = load(model_dirs, "qwen3")
    qwen3.config.model_type = "qwen2"  # a Qwen2 with q/k norms: not a computation the fast path knows
    assert not supports(qwen3)
    qwen2 = load(model_dirs, "qwen2_sliding")
    assert supports(qwen2)
    qwen2.config.layer_types = ["chunked_attention"] * 4
    assert not supports(qwen2)
