"""SGLang's routes on `posttrain serve`: native /generate (the sample and the prompt's log-probs),
/pause_generation and /continue_generation (new generations wait in between), /flush_cache; bad
bodies are 4xx and change nothing, and every route needs the API key."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

from posttrain.rollout import SamplingParams
from posttrain.serve.app import Access
from tests.serve.conftest import make_server

IDS = [290, 30, 225, 21, 22, 40]


@pytest.fixture(scope="module")
def hf_model(nano_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(nano_model_dir, dtype=torch.float32).eval()


def generate(http, **body):
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_answers_the_sample_and_the_prompts_logprobs(http, reference_engine, hf_model):
    got = generate(http, input_ids=IDS, sampling_params={"max_new_tokens": 6, "temperature": 0},
                   return_logprob=True, logprob_start_len=0, rid="probe-1")
    want = reference_engine.generate([IDS], 1, SamplingParams(temperature=0.0, max_new_tokens=6))
    meta = got["meta_info"]
    assert got["output_ids"] == want.completion_ids[0] and meta["id"] == "probe-1"
    assert meta["finish_reason"]["type"] == {"length": "length"}.get(want.finish_reason[0], "stop")
    assert meta["prompt_tokens"] == len(IDS) and meta["completion_tokens"] == len(want.completion_ids[0])
    assert meta["weight_version"] == "0"
    out = meta["output_token_logprobs"]
    assert [e[1] for e in out] == want.completion_ids[0]
    assert torch.allclose(torch.tensor([e[0] for e in out]), torch.tensor(want.logprobs[0]), atol=1e-5, rtol=0)

    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == IDS and entries[0][0] is None
    with torch.no_grad():
        lp = hf_model(torch.tensor([IDS])).logits[0, :-1].log_softmax(-1)
    trainer = lp[torch.arange(len(IDS) - 1), torch.tensor(IDS[1:])]
    assert torch.allclose(torch.tensor([e[0] for e in entries[1:]]), trainer, atol=1e-5, rtol=0)

    later = generate(http, input_ids=IDS, sampling_params={"max_new_tokens": 1, "temperature": 0},
                     return_logprob=True, logprob_start_len=3)["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in later] == IDS[3:] and later[0][0] is None
    assert [e[0] for e in later[1:]] == [e[0] for e in entries[4:]]
    plain = generate(http, input_ids=IDS, sampling_params={"max_new_tokens": 2})["meta_info"]
    assert "input_token_logprobs" not in plain and "output_token_logprobs" not in plain


def test_generations_wait_between_pause_and_continue(http):
    assert http.post("/pause_generation", json={"mode": "retract"}).json()["status"] == "ok"
    answers = []
    try:
        assert http.get("/server_info").json()["paused"] is True
        assert http.get("/health").json()["status"] == "ok"
        late = threading.Thread(target=lambda: answers.append(
            http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})))
        late.start()
        late.join(timeout=1.0)
        assert late.is_alive() and not answers  # held while paused
    finally:
        assert http.post("/continue_generation", json={}).status_code == 200
    late.join(timeout=30)
    assert answers and answers[0].status_code == 200
    assert http.get("/server_info").json()["paused"] is False


def test_flush_cache_answers_get_and_post(http):
    for method in ("GET", "POST"):
        r = http.request(method, "/flush_cache", params={"timeout": 1.5})
        assert r.status_code == 200 and r.json()["success"] is True


MALFORMED = [
    ("/generate", {}),
    ("/generate", {"input_ids": "the text"}),
    ("/generate", {"input_ids": []}),
    ("/generate", {"input_ids": [1, 2.5]}),
    ("/generate", {"input_ids": [[1, 2], [3]]}),
    ("/generate", {"input_ids": [1, 100_000]}),
    ("/generate", {"input_ids": [1], "text": "hi"}),
    ("/generate", {"input_ids": [1], "stream": True}),
    ("/generate", {"input_ids": [1], "top_logprobs_num": 2}),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}),
    ("/generate", {"input_ids": [1], "return_logprob": "yes"}),
    ("/generate", {"input_ids": [1], "sampling_params": [1]}),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 100_000}}),
    ("/generate", {"input_ids": [1], "sampling_params": {"temperature": -1}}),
    ("/generate", {"input_ids": [1], "sampling_params": {"n": 2}}),
    ("/generate", {"input_ids": [1], "sampling_params": {"min_p": 0.1}}),
    ("/generate", {"input_ids": [1], "sampling_params": {"sampling_seed": "x"}}),
    ("/generate", b"{not json"),
    ("/pause_generation", {}),
    ("/pause_generation", {"mode": "abort"}),
    ("/pause_generation", {"mode": 3}),
    ("/pause_generation", {"mode": "retract", "later": True}),
    ("/pause_generation", b"[1, 2]"),
    ("/continue_generation", {"torch_empty_cache": "yes"}),
    ("/continue_generation", {"now": 1}),
    ("/flush_cache?timeout=-1", None),
    ("/flush_cache?timeout=soon", None),
    ("/flush_cache?everything=1", None),
    ("/flush_cache", {"all": True}),
]


@pytest.mark.parametrize("path,body", MALFORMED, ids=[f"{i}" for i in range(len(MALFORMED))])
def test_bad_bodies_are_4xx_and_change_nothing(http, path, body):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body) if body is not None else http.post(path)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert http.get("/server_info").json()["paused"] is False  # a refused pause pauses nothing
    assert http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}).status_code == 200


def test_every_sglang_route_needs_the_key(nano_model_dir, tmp_path):
    with make_server(nano_model_dir, access=Access(api_key="k3y", weights_root=tmp_path)) as keyed:
        routes = [("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}),
                  ("POST", "/pause_generation", {"mode": "retract"}), ("POST", "/continue_generation", {}),
                  ("GET", "/flush_cache", None), ("POST", "/flush_cache", None), ("GET", "/model_info", None)]
        for method, path, body in routes:
            r = httpx.request(method, keyed.url + path, json=body)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert keyed.state.generating.is_set()  # the refused pause did not pause
        authed = {"Authorization": "Bearer k3y"}
        for method, path, body in routes:
            assert httpx.request(method, keyed.url + path, json=body, headers=authed).status_code == 200, path
