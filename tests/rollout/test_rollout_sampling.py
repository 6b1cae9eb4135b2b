"""Sampling, finish reasons, reproducibility, batch compaction and the rollout record."""

from __future__ import annotations

import pytest
import torch

from posttrain.rollout import Rollouts, SamplingParams, TorchEngine, weights_checksum
from posttrain.rollout.sampling import sample_next, truncate_logits
from tests.rollout.conftest import PROMPTS, make_model

# ------------------------------------------------------------------------------ pure sampling


def test_truncation_keeps_hand_worked_sets():
    # probs 0.5, 0.25, 0.125, 0.125 (already sorted)
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    cand, index = truncate_logits(logits, top_k=0, top_p=0.7)
    assert torch.isfinite(cand).tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.75
    cand, index = truncate_logits(logits, top_k=0, top_p=0.5)
    assert torch.isfinite(cand).tolist() == [[True, False, False, False]]
    cand, index = truncate_logits(logits[:, [3, 1, 0, 2]], top_k=2, top_p=1.0)
    assert index.tolist() == [[2, 1]]  # vocabulary ids of 0.5 and 0.25


def test_sampled_frequencies_follow_the_truncated_distribution():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))[None].repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    tok, logp, tlogp = sample_next(logits, SamplingParams(top_k=3), torch.rand(len(logits), generator=g))
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    expected = torch.tensor([4, 3, 2, 0]) / 9
    assert torch.allclose(freq, expected, atol=0.015)
    assert freq[3] == 0
    assert torch.allclose(logp, torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))[tok])
    assert torch.allclose(tlogp, torch.log(expected[tok]), atol=1e-6)


def test_temperature_scales_the_full_logprob():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    tok, logp, _ = sample_next(logits, SamplingParams(temperature=0.5, top_k=1), torch.rand(1))
    assert tok.tolist() == [0]
    z = torch.tensor([4.0, 2.0, 0.0])
    assert logp.item() == pytest.approx((z[0] - z.exp().sum().log()).item(), abs=1e-6)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                    dict(max_new_tokens=0), dict(stop=[""]), dict(stop="x"), dict(seed=1.5)])
def test_sampling_params_checks(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


# ------------------------------------------------------------------------ finish reasons, seeds


def test_max_new_tokens_gives_length(model):
    engine = TorchEngine(model)
    r = engine.generate(PROMPTS, n=2, sampling=SamplingParams(max_new_tokens=5, ignore_eos=True, seed=0))
    assert all(len(c) == 5 for c in r.completion_ids)
    assert r.finish_reason == ["length"] * 10


def test_eos_gives_eos_and_is_kept(model):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    first = TorchEngine(model).generate(PROMPTS[:1], n=1, sampling=greedy).completion_ids[0]
    eos_model = make_model()
    eos_model.generation_config.eos_token_id = first[3]  # the 4th greedy token becomes EOS
    r = TorchEngine(eos_model).generate(PROMPTS[:1], n=1, sampling=greedy)
    assert r.completion_ids[0] == first[: first.index(first[3]) + 1]
    assert r.finish_reason == ["eos"]


def test_stop_string_cuts_after_it(model, tokenizer):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    engine = TorchEngine(model, tokenizer=tokenizer)
    full = engine.generate(PROMPTS, n=1, sampling=greedy)
    text = tokenizer.decode(full.completion_ids[1])
    stop = text[4:6]
    end = text.find(stop) + len(stop)
    r = engine.generate(PROMPTS, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True,
                                                              stop=[stop, "never-there"]))
    assert r.finish_reason[1] == "stop"
    assert r.completion_ids[1] == full.completion_ids[1][:end]  # one character per token
    assert r.completion_texts()[1] == text[:end] and r.completion_texts()[1].endswith(stop)
    for i, t in enumerate(full.completion_texts()):
        if stop not in t:
            assert r.finish_reason[i] == "length" and r.completion_ids[i] == full.completion_ids[i]


def test_stop_strings_need_a_tokenizer(model):
    with pytest.raises(ValueError, match="tokenizer"):
        TorchEngine(model).generate(PROMPTS, n=1, sampling=SamplingParams(stop=["x"]))


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_same_seed_same_samples(model, backend):
    engine = TorchEngine(model, backend=backend)
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=7)
    a = engine.generate(PROMPTS, n=4, sampling=sampling)
    b = engine.generate(PROMPTS, n=4, sampling=sampling)
    c = engine.generate(PROMPTS, n=4, sampling=SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=8))
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids
    # samples of one prompt differ from each other (each row draws its own numbers)
    assert len({tuple(x) for x in a.completion_ids[:4]}) > 1


# ----------------------------------------------------------------------------------- compaction


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_finished_rows_leave_the_batch(model, backend):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    first = TorchEngine(model).generate(PROMPTS[:1], n=1, sampling=greedy).completion_ids[0]
    k = next(i for i in range(2, 10) if first.index(first[i]) == i)  # a token first seen at step k+1
    eos_model = make_model()
    eos_model.generation_config.eos_token_id = first[k]  # prompt 0 finishes at step k+1
    engine = TorchEngine(eos_model, backend=backend)
    r = engine.generate(PROMPTS, n=1, sampling=greedy)
    assert r.finish_reason[0] == "eos" and len(r.completion_ids[0]) == k + 1
    seen = engine.decoder.rows_seen
    assert seen[0] == len(PROMPTS)  # prefill of the distinct prompts
    # decode step j (making token j+1) runs exactly the rows that have not finished by token j
    assert seen[1:] == [sum(len(c) > j for c in r.completion_ids) for j in range(1, len(seen))]
    assert min(seen[1:]) < 5
    # the same answers as with compaction off
    plain = TorchEngine(eos_model, backend=backend, compact_fraction=1.0)
    assert plain.generate(PROMPTS, n=1, sampling=greedy).completion_ids == r.completion_ids
    assert min(plain.decoder.rows_seen[1:]) == 5


def test_prefill_runs_each_distinct_prompt_once(model):
    engine = TorchEngine(model)
    engine.generate(PROMPTS, n=8, sampling=SamplingParams(max_new_tokens=2, seed=0))
    assert engine.decoder.rows_seen[0] == len(PROMPTS)
    assert engine.decoder.rows_seen[1] == 8 * len(PROMPTS)


def test_max_batch_chunks_give_the_same_greedy_answers(model):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    whole = TorchEngine(model).generate(PROMPTS, n=3, sampling=greedy)
    engine = TorchEngine(model, max_batch=4)
    chunked = engine.generate(PROMPTS, n=3, sampling=greedy)
    assert chunked.completion_ids == whole.completion_ids
    assert chunked.prompt_idx == whole.prompt_idx
    assert max(engine.decoder.rows_seen) <= 4


# ---------------------------------------------------------------------------- record, checksum


def test_to_padded_layout():
    r = Rollouts(prompt_idx=[0, 1], prompt_ids=[[1, 2], [3]], completion_ids=[[4], [5, 6]],
                 logprobs=[[-0.5], [-1.0, -2.0]], finish_reason=["eos", "length"], policy_version=[0, 0],
                 sampling=SamplingParams())
    p = r.to_padded(pad_id=9)
    assert p.input_ids_BT.tolist() == [[1, 2, 4], [3, 5, 6]]
    assert p.attention_mask_BT.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert p.completion_mask_BT.tolist() == [[0, 0, 1], [0, 1, 1]]
    assert p.sampler_logp_BT.tolist() == [[0, 0, -0.5], [0, -1.0, -2.0]]
    r2 = Rollouts.concat([r, r])
    assert r2.prompt_idx == [0, 1, 0, 1] and len(r2) == 4


def test_checksum_is_order_free_and_sensitive():
    a = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.ones(2, dtype=torch.bfloat16)}
    b = {"y": torch.ones(2, dtype=torch.bfloat16), "x": torch.arange(6.0).reshape(2, 3)}
    assert weights_checksum(a) == weights_checksum(b)
    assert weights_checksum(a) != weights_checksum({**a, "x": a["x"].reshape(3, 2)})
    assert weights_checksum(a) != weights_checksum({**a, "y": a["y"].float()})
    c = {**a, "x": a["x"].clone()}
    c["x"][1, 2] = torch.nextafter(torch.tensor(5.0), torch.tensor(6.0))  # one ulp
    assert weights_checksum(a) != weights_checksum(c)
    assert weights_checksum(a) != weights_checksum({"z": a["x"], "y": a["y"]})  # a renamed tensor
    assert len(weights_checksum(a)) == 32  # XXH3-128, hex


def test_a_digest_built_in_parts_equals_the_checksum_of_the_whole():
    from posttrain.rollout.types import WeightsDigest

    g = torch.Generator().manual_seed(0)
    whole = {f"w{i}": torch.randn(3, i + 1, generator=g) for i in range(7)}
    for parts in ([["w0", "w1", "w2", "w3", "w4", "w5", "w6"]], [["w5", "w1"], ["w6"], ["w0", "w2", "w3", "w4"]]):
        digest = WeightsDigest()
        for names in parts:
            digest.update({k: whole[k] for k in names})
        assert digest.hexdigest() == weights_checksum(whole)
    short = WeightsDigest()
    short.update({k: v for k, v in whole.items() if k != "w3"})  # a part that never arrived
    assert short.hexdigest() != weights_checksum(whole)


def test_bad_prompts_are_refused(model):
    engine = TorchEngine(model)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1], []], n=1, sampling=SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 500]], n=1, sampling=SamplingParams())
    with pytest.raises(ValueError, match="n must be"):
        engine.generate([[1]], n=0, sampling=SamplingParams())


def test_candidate_tables_from_the_indexed_vocabulary_equal_a_pass_over_it(nano_model_dir):
    """Fast (the vocabulary decoded once, indexed by character) against slow (every token decoded
    for this stop list): the same tokens are candidates."""
    from transformers import AutoTokenizer

    from posttrain.rollout.sampling import StopChecker, TokenTexts

    tok = AutoTokenizer.from_pretrained(nano_model_dir)
    V = len(tok) + 3  # rows past the tokenizer (padded embeddings) are always checked
    texts = TokenTexts(tok, V)
    for stops in (["Answer:"], ["\n\n", "42"], ["é", "xyz"], ["7"]):
        last = {s[-1] for s in stops}
        slow = torch.ones(V, dtype=torch.bool)
        for tid in range(len(tok)) if not any(c.isspace() for c in last) else ():
            text = tok.decode([tid], skip_special_tokens=False)
            slow[tid] = (not text) or ("\ufffd" in text) or any(c in text for c in last)
        fast = StopChecker(tok, stops, V, texts).candidate_V
        assert torch.equal(fast, slow), stops
        assert 0 < int(fast[: len(tok)].sum()) < len(tok) or any(c.isspace() for c in last)
