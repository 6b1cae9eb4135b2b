"""`HTTPEngine` with the SGLang dialect: against ``posttrain serve`` on loopback (which answers
SGLang's routes and fields), and against scripted answers for what only a real SGLang would do
wrong. No real SGLang server runs here."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from posttrain.rollout import TorchEngine, weights_checksum
from posttrain.rollout.http import HTTPEngine, model_eos_ids
from posttrain.rollout.sglang import SGLangDialect
from posttrain.rollout.types import SamplingParams, WeightSyncError
from posttrain.serve.app import Access
from tests.serve.conftest import make_server

PROMPTS = [[290, 30, 225, 21, 22], [40, 41, 42], [100, 101, 102, 103]]
PROBE = [5] + list(range(60, 84))


@pytest.fixture(scope="module")
def hf_model(nano_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(nano_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(nano_model_dir):
    from posttrain.models.hf import load_tokenizer

    return load_tokenizer(str(nano_model_dir))


@pytest.fixture
def server(nano_model_dir):
    with make_server(nano_model_dir) as s:
        yield s


def engine_for(urls, tmp_path, tokenizer, nano_model_dir, **kw) -> HTTPEngine:
    return HTTPEngine(urls, weights_dir=str(tmp_path / "weights"), tokenizer=tokenizer,
                      eos_ids=model_eos_ids(str(nano_model_dir), tokenizer), model_files=str(nano_model_dir),
                      retry_backoff_s=0.01, dialect=SGLangDialect(**kw))


def probe_of(model, ids=PROBE) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    return ids, [lp[i, t].item() for i, t in enumerate(ids[1:])]


def perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("stop", [[], ["e"]])
def test_greedy_equals_torch_engine(server, tmp_path, tokenizer, nano_model_dir, stop):
    engine = engine_for([server.url], tmp_path, tokenizer, nano_model_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop=stop)
    got = engine.generate(PROMPTS, 1, greedy)
    want = TorchEngine(str(nano_model_dir)).generate(PROMPTS, 1, greedy)
    assert got.completion_ids == want.completion_ids and got.finish_reason == want.finish_reason
    assert got.texts == want.texts
    for a, b in zip(got.logprobs, want.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert got.truncated_logprobs is None  # SGLang reports none


def test_sampled_logprobs_are_the_full_distributions_at_temperature(server, tmp_path, tokenizer, nano_model_dir,
                                                                      hf_model):
    engine = engine_for([server.url], tmp_path, tokenizer, nano_model_dir)
    s = SamplingParams(temperature=0.7, top_k=20, max_new_tokens=10, seed=3)
    got = engine.generate(PROMPTS, 2, s)
    for prompt, completion, logprobs in zip(got.prompt_ids, got.completion_ids, got.logprobs):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
        want = (logits / s.temperature).log_softmax(-1)[torch.arange(len(completion)), torch.tensor(completion)]
        assert torch.allclose(torch.tensor(logprobs), want, atol=1e-5, rtol=0)


def test_a_push_changes_generations_and_the_version_reads_back(server, tmp_path, tokenizer, nano_model_dir, hf_model):
    engine = engine_for([server.url], tmp_path, tokenizer, nano_model_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    before = engine.generate(PROMPTS, 1, greedy).completion_ids
    state = perturbed(hf_model, seed=1)
    moved = type(hf_model)(hf_model.config).eval()
    moved.load_state_dict(state)
    engine.load_weights(state, 1, weights_checksum(state), probe=probe_of(moved))
    assert engine.version == 1
    assert httpx.get(f"{server.url}/model_info").json()["weight_version"] == "1"
    after = engine.generate(PROMPTS, 1, greedy)
    reference = TorchEngine(str(nano_model_dir))
    reference.load_weights(state, 1, weights_checksum(state))
    assert after.completion_ids != before
    assert after.completion_ids == reference.generate(PROMPTS, 1, greedy).completion_ids
    assert after.policy_version == [1] * len(PROMPTS)
    assert not httpx.get(f"{server.url}/server_info").json()["paused"]


def test_a_push_the_probe_contradicts_is_refused_naming_the_server(server, tmp_path, tokenizer, nano_model_dir,
                                                                  hf_model):
    engine = engine_for([server.url], tmp_path, tokenizer, nano_model_dir)
    state = perturbed(hf_model, seed=2)
    with pytest.raises(WeightSyncError, match="probe log-probs differ") as refused:
        engine.load_weights(state, 1, weights_checksum(state), probe=probe_of(hf_model))  # the old weights' probe
    assert server.url in str(refused.value) and engine.version == 0


def test_a_server_that_refuses_the_reload_is_named_and_left_generating(nano_model_dir, tmp_path, tokenizer, hf_model):
    with make_server(nano_model_dir, access=Access()) as closed:  # no weights root: reloads are 403
        engine = engine_for([closed.url], tmp_path, tokenizer, nano_model_dir)
        state = perturbed(hf_model, seed=3)
        with pytest.raises(WeightSyncError, match="update_weights_from_disk answered 403") as refused:
            engine.load_weights(state, 1, weights_checksum(state), probe=probe_of(hf_model))
        assert closed.url in str(refused.value) and engine.version == 0
        assert not httpx.get(f"{closed.url}/server_info").json()["paused"]  # continued after the failure
        assert len(engine.generate(PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=3))) == 1


# ------------------------------------------------------------------ scripted answers (what SGLang says)

class Scripted:
    """An SGLang stand-in: answers each route from ``routes`` and records the calls in order."""

    def __init__(self, **overrides):
        self.calls: list[tuple[str, dict | None]] = []
        self.routes = {
            "/health": lambda body: httpx.Response(200),
            "/model_info": lambda body: httpx.Response(200, json={"weight_version": self.version}),
            "/v1/completions": lambda body: httpx.Response(200, json={"choices": [{
                "index": 0, "text": "x", "finish_reason": "length", "token_ids": [7],
                "logprobs": {"token_logprobs": [-2.5]}}]}),
            "/generate": lambda body: httpx.Response(200, json={"meta_info": {"input_token_logprobs": (
                [[None, body["input_ids"][0], None]] + [[-2.5, t, None] for t in body["input_ids"][1:]])}}),
            "/pause_generation": lambda body: httpx.Response(200, json={"status": "ok"}),
            "/update_weights_from_disk": self.update,
            "/flush_cache": lambda body: httpx.Response(200, text="Cache flushed.\n"),
            "/continue_generation": lambda body: httpx.Response(200, json={"status": "ok"}),
        } | overrides
        self.version = "default"
        self.client = httpx.Client(transport=httpx.MockTransport(self.answer), base_url="http://sglang")

    def update(self, body):
        self.version = body["weight_version"]
        return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body))
        return self.routes[request.url.path](body)

    def push(self, dialect=None, probe=None) -> str:
        return (dialect or SGLangDialect()).push(self.client, "http://sglang", "/w/v4", 4, "c" * 64, probe)


def test_push_pauses_reloads_flushes_continues_and_reads_back():
    sglang = Scripted()
    assert sglang.push(probe=([1, 2, 3], [-2.5, -2.5])) == ""
    assert [path for path, _ in sglang.calls] == ["/pause_generation", "/update_weights_from_disk", "/flush_cache",
                                                  "/continue_generation", "/model_info", "/generate"]
    assert sglang.calls[0][1] == {"mode": "retract"}
    assert sglang.calls[1][1] == {"model_path": "/w/v4", "weight_version": "4", "flush_cache": True,
                                  "abort_all_requests": False}
    assert sglang.calls[5][1]["logprob_start_len"] == 0 and sglang.calls[5][1]["return_logprob"] is True


@pytest.mark.parametrize("route,answer,why", [
    ("/update_weights_from_disk", httpx.Response(400, json={"success": False, "message": "no such folder"}),
     "update_weights_from_disk answered 400"),
    ("/update_weights_from_disk", httpx.Response(200, json={"success": False, "message": "half loaded"}),
     "half loaded"),
    ("/flush_cache", httpx.Response(400, text="Cache not flushed: pending requests"), "flush_cache answered 400"),
])
def test_a_failed_step_is_reported_and_generation_always_continues(route, answer, why):
    sglang = Scripted(**{route: lambda body: answer})
    assert why in sglang.push()
    assert sglang.calls[-1][0] == "/continue_generation"


def test_a_version_not_read_back_is_reported():
    sglang = Scripted(**{"/update_weights_from_disk": lambda body: httpx.Response(200, json={"success": True})})
    assert sglang.push() == "reads back weight version 'default', expected 4"


def test_a_server_reporting_pre_temperature_logprobs_is_refused():
    sglang = Scripted()  # the token sampled at temperature 2 carries -2.5, its raw log-prob too
    with pytest.raises(RuntimeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        SGLangDialect().check_server(sglang.client, "http://sglang", [1, 2, 3])


def test_a_server_without_token_ids_is_refused():
    sglang = Scripted(**{"/v1/completions": lambda body: httpx.Response(200, json={"choices": [{
        "index": 0, "text": "x", "finish_reason": "length", "logprobs": {"token_logprobs": [-1.0]}}]})})
    with pytest.raises(RuntimeError, match="return_token_ids"):
        SGLangDialect().check_server(sglang.client, "http://sglang", [1, 2, 3])


def test_requests_carry_token_ids_and_no_seed():
    body = SGLangDialect().body({"prompt": [1, 2], "n": 4, "seed": 11, "temperature": 1.0})
    assert body == {"prompt": [1, 2], "n": 4, "temperature": 1.0, "return_token_ids": True}
