"""The OpenAI-compatible API against an independent TorchEngine on the same model folder."""

from __future__ import annotations

import asyncio

import pytest
import torch

from posttrain.rollout import SamplingParams
from tests.serve.conftest import SERVED_NAME

PROMPT_IDS = [[290, 30, 225, 21, 22], [40, 41, 42], [7, 8, 9, 10, 11, 12, 13, 14]]


def completions(http, **body):
    r = http.post("/v1/completions", json={"model": SERVED_NAME, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_health_and_models(http):
    assert http.get("/health").json() == {"status": "ok", "version": 0}
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [SERVED_NAME]
    info = http.get("/get_model_info").json()
    assert info["version"] == 0 and len(info["checksum"]) == 32 and info["logprob_kind"] == "full_temperature_scaled"


def test_greedy_token_ids_equal_engine(http, reference_engine):
    out = completions(http, prompt=PROMPT_IDS, n=2, max_tokens=12, temperature=0, return_token_ids=True)
    ref = reference_engine.generate(PROMPT_IDS, 2, SamplingParams(temperature=0.0, max_new_tokens=12))
    choices = out["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    assert [c["token_ids"] for c in choices] == ref.completion_ids
    assert [c["prompt_token_ids"] for c in choices] == ref.prompt_ids
    assert [c["text"] for c in choices] == ref.texts
    assert [c["finish_reason"] for c in choices] == ["stop" if f == "eos" else f for f in ref.finish_reason]
    assert out["usage"]["completion_tokens"] == sum(len(c) for c in ref.completion_ids)
    assert out["usage"]["prompt_tokens"] == sum(len(p) for p in PROMPT_IDS)


def test_greedy_text_prompt_equals_engine(http, reference_engine, tokenizer):
    texts = ["Solve: 12 × 34", "def f(x):"]
    out = completions(http, prompt=texts, max_tokens=10, temperature=0, return_token_ids=True)
    ids = [tokenizer(t)["input_ids"] for t in texts]
    ref = reference_engine.generate(ids, 1, SamplingParams(temperature=0.0, max_new_tokens=10))
    assert [c["prompt_token_ids"] for c in out["choices"]] == ids
    assert [c["token_ids"] for c in out["choices"]] == ref.completion_ids
    single = completions(http, prompt=texts[0], max_tokens=10, temperature=0, return_token_ids=True)
    assert single["choices"][0]["token_ids"] == ref.completion_ids[0]


def test_seeded_sampling_reproduces_engine(http, reference_engine):
    params = dict(temperature=0.8, top_p=0.9, top_k=50, max_tokens=16, seed=1234)
    out = completions(http, prompt=PROMPT_IDS[:2], n=3, return_token_ids=True, logprobs=0, **params)
    ref = reference_engine.generate(PROMPT_IDS[:2], 3, SamplingParams(
        temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=1234))
    assert [c["token_ids"] for c in out["choices"]] == ref.completion_ids
    assert [c["logprobs"]["token_logprobs"] for c in out["choices"]] == ref.logprobs
    assert [c["truncated_logprobs"] for c in out["choices"]] == ref.truncated_logprobs
    again = completions(http, prompt=PROMPT_IDS[:2], n=3, return_token_ids=True, **params)
    assert [c["token_ids"] for c in again["choices"]] == ref.completion_ids
    other = completions(http, prompt=PROMPT_IDS[:2], n=3, return_token_ids=True, **{**params, "seed": 99})
    assert [c["token_ids"] for c in other["choices"]] != ref.completion_ids


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 40, 0.8), (0.0, 0, 1.0)])
def test_logprobs_equal_plain_forward(http, nano_model_dir, temperature, top_k, top_p):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(nano_model_dir).eval()
    out = completions(http, prompt=PROMPT_IDS, n=2, max_tokens=20, temperature=temperature, top_k=top_k, top_p=top_p,
                      seed=5, logprobs=1, return_token_ids=True)
    scale = temperature if temperature > 0 else 1.0
    worst, count = 0.0, 0
    for c in out["choices"]:
        p, toks, lps = c["prompt_token_ids"], c["token_ids"], c["logprobs"]["token_logprobs"]
        assert len(lps) == len(toks) == len(c["truncated_logprobs"]) == len(c["logprobs"]["tokens"])
        with torch.no_grad():
            logits = model(torch.tensor([p + toks])).logits[0].float()
        ref = (logits[len(p) - 1: len(p) - 1 + len(toks)] / scale).log_softmax(-1)
        ref = ref.gather(-1, torch.tensor(toks)[:, None]).squeeze(-1)
        worst = max(worst, (ref - torch.tensor(lps)).abs().max().item())
        count += len(toks)
        if temperature == 0:
            assert c["truncated_logprobs"] == [0.0] * len(toks)
        elif top_k or top_p < 1:  # the sampled (truncated) distribution is sharper
            assert all(t >= f - 1e-6 for t, f in zip(c["truncated_logprobs"], lps))
    assert count > 0 and worst < 1e-5, worst


def test_stop_strings(http, reference_engine):
    plain = completions(http, prompt=PROMPT_IDS[0], max_tokens=24, temperature=0)["choices"][0]["text"]
    stop = next(ch for ch in plain[3:] if ch.isalnum())
    out = completions(http, prompt=PROMPT_IDS[0], max_tokens=24, temperature=0, stop=stop, return_token_ids=True)
    c = out["choices"][0]
    ref = reference_engine.generate([PROMPT_IDS[0]], 1, SamplingParams(temperature=0.0, max_new_tokens=24, stop=[stop]))
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop
    assert c["token_ids"] == ref.completion_ids[0]
    assert c["text"] + stop == ref.texts[0] and stop not in c["text"]
    kept = completions(http, prompt=PROMPT_IDS[0], max_tokens=24, temperature=0, stop=[stop],
                       include_stop_str_in_output=True)
    assert kept["choices"][0]["text"] == ref.texts[0]


def test_openai_client_completions_and_chat(server, reference_engine, tokenizer):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [SERVED_NAME]
    r = client.completions.create(model=SERVED_NAME, prompt=PROMPT_IDS[1], max_tokens=8, temperature=0, logprobs=1,
                                  extra_body={"return_token_ids": True, "top_k": 5})
    ref = reference_engine.generate([PROMPT_IDS[1]], 1, SamplingParams(temperature=0.0, max_new_tokens=8))
    choice = r.choices[0]
    assert choice.token_ids == ref.completion_ids[0] and choice.text == ref.texts[0]
    assert choice.logprobs.token_logprobs == ref.logprobs[0]
    assert choice.truncated_logprobs == [0.0] * 8

    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "Solve: 3 + 4"}]
    chat = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=12, temperature=0,
                                          logprobs=True, extra_body={"return_token_ids": True})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    ref = reference_engine.generate([prompt], 1, SamplingParams(temperature=0.0, max_new_tokens=12))
    c = chat.choices[0]
    assert c.prompt_token_ids == prompt and c.token_ids == ref.completion_ids[0]
    assert c.message.role == "assistant" and c.message.content == ref.texts[0]
    assert [t.logprob for t in c.logprobs.content] == ref.logprobs[0]
    assert c.finish_reason in ("stop", "length")

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt="x", temperature=-1)
    assert err.value.body["param"] == "temperature"


MALFORMED = [
    ("/v1/completions", b"{bad"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b""),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}'),
    ("/v1/completions", b"[" * 100_000),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),
    ("/v1/completions", {}),
    ("/v1/completions", {"prompt": "x", "n": 0}),
    ("/v1/completions", {"prompt": "x", "n": "2"}),
    ("/v1/completions", {"prompt": "x", "n": 10**7}),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}),
    ("/v1/completions", {"prompt": "x", "top_p": 0}),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}),
    ("/v1/completions", {"prompt": "x", "top_k": -2}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100_000}),
    ("/v1/completions", {"prompt": [1, 2, 100_000]}),
    ("/v1/completions", {"prompt": [-1, 3]}),
    ("/v1/completions", {"prompt": [5] * 600}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": [1, "a"]}),
    ("/v1/completions", {"prompt": [[1, 2], [3.5]]}),
    ("/v1/completions", {"prompt": [[1, 2], []]}),
    ("/v1/completions", {"prompt": [True, False]}),
    ("/v1/completions", {"prompt": {"text": "x"}}),
    ("/v1/completions", {"prompt": "x", "bogus": 1}),
    ("/v1/completions", {"prompt": "x", "stream": True}),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}),
    ("/v1/completions", {"prompt": "x", "stop": [""]}),
    ("/v1/completions", {"prompt": "x", "stop": 3}),
    ("/v1/completions", {"prompt": "x", "seed": "abc"}),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}),
    ("/v1/completions", {"prompt": "x", "return_token_ids": "yes"}),
    ("/v1/completions", {"prompt": "x", "model": "someone-else"}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": "hello"}),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}),
    ("/v1/chat/completions", {"prompt": "x"}),
    ("/update_weights_from_disk", {}),
    ("/update_weights_from_disk", {"model_path": "/nonexistent/folder"}),
    ("/update_weights_from_disk", {"model_path": "/tmp", "load_format": "gguf"}),
    ("/update_weights_from_disk", {"model_path": "/tmp", "version": "one"}),
    ("/v1/nothing-here", {}),
]


@pytest.mark.parametrize("path,body", MALFORMED, ids=[f"{i}" for i in range(len(MALFORMED))])
def test_malformed_requests_get_4xx_json_errors(http, path, body):
    r = (http.post(path, content=body, headers={"content-type": "application/json"}) if isinstance(body, bytes)
         else http.post(path, json=body))
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if path == "/update_weights_from_disk":
        assert r.json()["success"] is False
    assert http.get("/health").json()["status"] == "ok"


def test_wrong_method_and_server_still_answers(http):
    r = http.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    assert completions(http, prompt=[1, 2, 3], max_tokens=2)["choices"][0]["finish_reason"] in ("stop", "length")


def test_engine_failure_is_a_500_for_that_request_only(server, http):
    """An engine exception fails its own request (also inside a batch); the server keeps serving."""
    import httpx

    engine = server.state.engine
    original = engine.generate
    poison = [3, 3, 3, 3, 3, 3, 3]

    def flaky(prompts, n, sampling):
        if poison in prompts:
            raise RuntimeError("boom")
        return original(prompts, n, sampling)

    engine.generate = flaky
    try:
        r = http.post("/v1/completions", json={"prompt": poison, "max_tokens": 3})
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_server_error"

        async def together():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                reqs = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 3, "temperature": 0})
                        for p in ([1, 2, 3], poison, [4, 5, 6], [7, 8])]
                return await asyncio.gather(*reqs)

        codes = [r.status_code for r in asyncio.run(together())]
        assert codes == [200, 500, 200, 200]
    finally:
        engine.generate = original
    assert http.get("/health").json()["status"] == "ok"
    assert completions(http, prompt=poison, max_tokens=3)["choices"]


@pytest.mark.parametrize("stop", [[f"s{i}" for i in range(17)], ["x" * 257]])
def test_stop_lists_past_the_caps_are_400_and_the_server_goes_on(http, stop):
    r = http.post("/v1/completions", json={"model": "nano", "prompt": "Solve", "max_tokens": 2, "stop": stop})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    ok = http.post("/v1/completions", json={"model": "nano", "prompt": "Solve", "max_tokens": 2, "stop": ["s1"]})
    assert ok.status_code == 200
