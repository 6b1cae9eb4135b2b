"""`HTTPEngine` with the vLLM dialect against a real vLLM server (``-m vllm``; `vllm_server` starts
one per session from .venv-vllm on the tiny model)."""

from __future__ import annotations

import time

import pytest
import torch

from posttrain.rollout import TorchEngine, weights_checksum
from posttrain.rollout.http import HTTPEngine, ServerUnreachable, model_eos_ids
from posttrain.rollout.sampling import truncate_logits
from posttrain.rollout.types import SamplingParams, WeightSyncError
from posttrain.rollout.vllm import VLLMDialect

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45, 46], [100, 101], [7, 300, 12, 99, 250]]
PROBE = [5] + list(range(60, 84))


@pytest.fixture(scope="module")
def hf_model(vllm_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(vllm_model_dir):
    from posttrain.models.hf import load_tokenizer

    return load_tokenizer(str(vllm_model_dir))


def engine(server, tmp_path, tokenizer, vllm_model_dir, **kw) -> HTTPEngine:
    return HTTPEngine(server.urls, weights_dir=str(tmp_path / "weights"), tokenizer=tokenizer,
                      eos_ids=model_eos_ids(str(vllm_model_dir), tokenizer), model_files=str(vllm_model_dir),
                      dialect=VLLMDialect(**kw))


def probe_of(model, ids=PROBE) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    return ids, [lp[i, t].item() for i, t in enumerate(ids[1:])]


def perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
            for k, v in model.state_dict().items()}


def trainer_truncated_logprobs(model, prompt, completion, s: SamplingParams) -> list[float]:
    """The trainer's log-prob of each sampled token under the top-k/top-p distribution at T."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    cand, index = truncate_logits(logits / s.temperature, s.top_k, s.top_p)
    lp = cand.log_softmax(-1)
    if index is None:
        return [lp[i, t].item() for i, t in enumerate(completion)]
    return [lp[i, (index[i] == t).nonzero()[0, 0]].item() for i, t in enumerate(completion)]


def test_greedy_equals_torch_engine(vllm_server, tmp_path, tokenizer, vllm_model_dir):
    s = SamplingParams(temperature=0.0, max_new_tokens=32, ignore_eos=True)
    ours = TorchEngine(str(vllm_model_dir), tokenizer=tokenizer).generate(PROMPTS, 1, s)
    theirs = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir).generate(PROMPTS, 1, s)
    assert theirs.completion_ids == ours.completion_ids
    assert all(len(c) == 32 for c in theirs.completion_ids)


def test_the_probe_runs_alone_exactly_on_a_server_with_lora_on(vllm_server, vllm_lora_server, tmp_path, tokenizer,
                                                              vllm_model_dir):
    """vLLM's CPU LoRA path cannot compute prompt log-probs beside decodes, adapter or not: the
    client learns from the server's config (not from its own LoRA setting) to hold requests for
    the probe, and keeps freezing requests in place on a server without LoRA."""
    plain = engine(vllm_server, tmp_path / "a", tokenizer, vllm_model_dir).dialect
    lora = engine(vllm_lora_server, tmp_path / "b", tokenizer, vllm_model_dir).dialect
    assert (plain.probe_alone, plain.pause_mode) == (False, "keep")
    assert (lora.probe_alone, lora.pause_mode) == (True, "wait")


def test_seeded_requests_past_one_steps_prefill_budget_keep_a_cpu_engine_alive(vllm_server, tmp_path, tokenizer,
                                                                                vllm_model_dir):
    """What RL and bench/vllm_vs_torch.py send: seeded, 32 prompts x 8 samples, more prompt tokens
    than one step prefills (2048 on CPU), so prefills are split over steps. vLLM 0.32 then rewinds a
    seeded request's generator, which a CPU generator cannot do: the engine died and every request
    answered HTTP 500. The client sends no seeds to a CPU build."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in torch.randint(8, 33, (32,), generator=g)]
    s = SamplingParams(temperature=1.0, max_new_tokens=32, ignore_eos=True, seed=0)
    eng = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir)
    assert eng.dialect.seeded is False  # read from the server's device_config
    assert sum(len(p) for p in prompts) * 8 > 2048
    ro = eng.generate(prompts, 8, s)
    assert ro.finish_reason == ["length"] * (32 * 8), sorted(set(ro.finish_reason))
    assert eng.stats["retries"] == 0 and eng.stats["failed"] == 0, eng.stats
    assert all(len(c) == 32 for c in ro.completion_ids)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 40, 0.8), (0.7, 0, 0.8)])
def test_sampled_logprobs_are_the_behaviour_policy(vllm_server, tmp_path, tokenizer, vllm_model_dir, hf_model,
                                                  temperature, top_k, top_p):
    s = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=16, seed=3)
    ro = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir).generate(PROMPTS, 4, s)
    assert ro.truncated_logprobs is not None
    worst = 0.0
    for prompt, ids, lp in zip(ro.prompt_ids, ro.completion_ids, ro.truncated_logprobs):
        assert ids, "an empty completion"
        want = trainer_truncated_logprobs(hf_model, prompt, ids, s)
        worst = max(worst, max(abs(a - b) for a, b in zip(lp, want)))
    assert worst < 1e-4, worst
    assert len({tuple(c) for c in ro.completion_ids}) > len(PROMPTS)  # it sampled, not one answer per prompt


def test_weight_sync_serves_the_new_weights(vllm_server, tmp_path, tokenizer, vllm_model_dir, hf_model):
    eng = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    before = eng.generate(PROMPTS, 1, greedy).completion_ids
    new = perturbed(hf_model, seed=1)
    moved = TorchEngine(str(vllm_model_dir), tokenizer=tokenizer)
    moved.load_weights(new, 1, weights_checksum(new))
    twin = type(hf_model)(hf_model.config).eval()
    twin.load_state_dict(new)
    try:  # streamed in parts: vLLM reloads a folder of shards with their index
        names = list(new)
        eng.load_buckets(iter([{k: new[k] for k in names[i:i + 8]} for i in range(0, len(names), 8)]), 1,
                         probe=probe_of(twin))
        assert len(list((tmp_path / "weights" / "v1").glob("model-*-of-*.safetensors"))) == -(-len(names) // 8)
        after = eng.generate(PROMPTS, 1, greedy).completion_ids
        assert eng.version == 1
        assert after == moved.generate(PROMPTS, 1, greedy).completion_ids
        assert after != before
    finally:  # the session's server goes back to the model it started with
        base = {k: v.clone() for k, v in hf_model.state_dict().items()}
        eng.load_weights(base, 2, weights_checksum(base), probe=probe_of(hf_model))
    assert eng.generate(PROMPTS, 1, greedy).completion_ids == before


def test_a_push_while_a_completion_is_generating_never_mixes_weights_within_it(vllm_server, tmp_path, tokenizer,
                                                                                vllm_model_dir, hf_model):
    """A push while a long completion is generating: the completion's tokens split at one point —
    those before were drawn by the old weights, every one after by the new — so no token is drawn
    from a mix (old keys under new weights, or weights swapped mid-step, would match neither).
    Where the split falls is the server's: vLLM may freeze a running request at once (then the
    cache reset preempts it and it continues under the new weights) or let it finish first (the
    CPU build of 0.32 does; a request still queued is frozen and runs wholly under the new
    weights). Everything the push needs is made before the request goes out, so the push follows it
    within milliseconds, long before its 400 tokens are drawn; each try pushes the other weight set."""
    eng = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir)
    held = eng.version  # the session's server keeps what earlier tests pushed (the base model's weights)
    base = {k: v.clone() for k, v in hf_model.state_dict().items()}
    twin = type(hf_model)(hf_model.config).eval()
    twin.load_state_dict(perturbed(hf_model, seed=2))
    models = [hf_model, twin]
    s = SamplingParams(temperature=1.0, max_new_tokens=400, ignore_eos=True, seed=3)
    prompt = PROMPTS[1]
    overlapped = 0
    try:
        for version in range(held + 1, held + 4):
            old, new = models[(version - held - 1) % 2], models[(version - held) % 2]
            weights = {k: v.clone() for k, v in new.state_dict().items()}
            checksum, probe = weights_checksum(weights), probe_of(new)
            rid = eng.submit([prompt], 2, s)
            call, _ = eng.submissions.pending[rid]
            while eng.gate.posting == 0 and not call.done():
                time.sleep(0.001)
            overlapped += not call.done()
            eng.load_weights(weights, version, checksum, probe=probe)
            (got,) = eng.poll(wait=True)
            assert got.rollouts.policy_version == [version - 1] * 2  # tagged with the version it was sent under
            for completion, sampled in zip(got.rollouts.completion_ids, got.rollouts.logprobs):
                assert len(completion) == 400
                ids, target = torch.tensor([prompt + completion]), torch.tensor(completion)[:, None]
                with torch.no_grad():
                    by_old, by_new = ((m(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
                                       .gather(-1, target).squeeze(-1) - torch.tensor(sampled)).abs() < 1e-4
                                      for m in (old, new))
                switch = int(by_old.logical_not().nonzero().min()) if not by_old.all() else len(completion)
                assert by_old[:switch].all() and by_new[switch:].all(), (version, switch)
    finally:  # the session's server goes back to the model it started with
        eng.load_weights(base, held + 4, weights_checksum(base), probe=probe_of(hf_model))
    assert overlapped, "every completion ended before its push was sent"


def test_a_sync_the_probe_contradicts_is_refused(vllm_server, tmp_path, tokenizer, vllm_model_dir, hf_model):
    eng = engine(vllm_server, tmp_path, tokenizer, vllm_model_dir)
    held = eng.version  # the session's server keeps what earlier tests pushed
    base = {k: v.clone() for k, v in hf_model.state_dict().items()}
    ids, expected = probe_of(type(hf_model)(hf_model.config).eval())  # another model's log-probs
    with pytest.raises(WeightSyncError, match=vllm_server.urls[0] + ".*probe log-probs differ"):
        eng.load_weights(base, held + 1, weights_checksum(base), probe=(ids, expected))
    assert eng.version == held


def test_lora_adapter_sync(vllm_lora_server, tmp_path, tokenizer, vllm_model_dir, hf_model):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    base = type(hf_model)(hf_model.config)
    base.load_state_dict(hf_model.state_dict())
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    adapter = get_peft_model_state_dict(peft_model)
    config = peft_model.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    config["peft_type"], config["task_type"] = "LORA", "CAUSAL_LM"
    eng = HTTPEngine(vllm_lora_server.urls, weights_dir=str(tmp_path / "w"), tokenizer=tokenizer,
                     dialect=VLLMDialect(lora_name="policy"), adapter_config=config)
    eng.load_weights(adapter, 1, weights_checksum(adapter), probe=probe_of(peft_model.eval()))
    s = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    with torch.no_grad():
        want = peft_model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=16, do_sample=False,
                                   min_new_tokens=16)[0, len(PROMPTS[1]):].tolist()
    assert eng.generate([PROMPTS[1]], 1, s).completion_ids[0] == want
    assert (tmp_path / "w" / "v1" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "w" / "v1" / "model.safetensors").exists()


def test_a_server_in_raw_logprob_mode_is_refused(tmp_path, vllm_model_dir):
    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    spec = ServerSpec(model=str(vllm_model_dir), max_model_len=256, extra_args=["--logprobs-mode", "raw_logprobs"])
    with VLLMServers(spec, 1, tmp_path, printer=lambda *_: None) as urls:
        with pytest.raises(ServerUnreachable, match="--logprobs-mode processed_logprobs"):
            HTTPEngine(urls, dialect=VLLMDialect())
