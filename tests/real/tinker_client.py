"""A user's loop on SmolLM2-135M-Instruct through the official `tinker` SDK, run by .venv-tinker's
python: ``python tinker_client.py BASE_URL BASE IDS_JSON``, where IDS_JSON is ``[prompt, answer]``,
the token ids of a ChatML prompt and its reply (the test encodes them: this environment has no
jinja2 for the chat template).

A LoRA training client; one forward_backward + optim_step on a chat reply; then samples from a
sampling client of the stepped weights, and the trainer's log-probs of the same tokens (a forward
of the training client). Prints ``REPORT {json}``: the step's loss, how far the step moved the
reply's log-probs, and the largest |sampler - trainer| log-prob over the sampled tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinker"))
from sdk_client import datum_sl, logprobs_of  # noqa: E402  (the cookbook's datum, shared with the tinker lane)



def main(base_url: str, base: str, prompt: list[int], answer: list[int]) -> None:
    service = tinker.ServiceClient(base_url=base_url)
    tc = service.create_lora_training_client(base, rank=8, seed=0).result()
    data = [datum_sl(prompt + answer, len(prompt))]
    before = logprobs_of(tc, data)[0]
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    after = logprobs_of(tc, data)[0]
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=16, temperature=1.0, seed=0)
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result()
    gaps = []
    for seq in res.sequences:
        tokens = list(seq.tokens)
        trainer = logprobs_of(tc, [datum_sl(prompt + tokens, len(prompt))])[0][len(prompt) - 1:]
        gaps += [abs(a - b) for a, b in zip(seq.logprobs, trainer)]
    report = {"loss": loss, "moved": max(abs(a - b) for a, b in zip(before, after)), "gap": max(gaps),
              "tokens": len(gaps), "stop_reasons": [str(s.stop_reason) for s in res.sequences]}
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *json.loads(sys.argv[3]))
