"""Rollouts on a real vLLM server vs the in-process `TorchEngine`, side by side in one run, and the
seconds of one weight sync to vLLM with full weights vs a LoRA adapter.

Same model (the embedded tiny model by default, built locally), same prompts, same sampling
(temperature 1, EOS ignored so both sides generate exactly prompts x n x new tokens; the script
checks the count). vLLM is started from .venv-vllm (`bash scripts/setup.sh vllm`) with the flags
posttrain's client needs, its threads bound to ``--server-cpus`` when given
(``VLLM_CPU_OMP_THREADS_BIND``), and the engine runs with ``--engine-threads``. Each timing is the best of ``--repeats`` after a warm-up.
Weight sync: `HTTPEngine.load_weights` end to end (write the safetensors, pause, reload or load the
adapter, reset the prefix cache, set and read back the version, resume, check the probe).

    .venv/bin/python bench/vllm_vs_torch.py
    .venv/bin/python bench/vllm_vs_torch.py --prompts 64 --n 8 --new 64 --server-cpus 1 --engine-threads 1

Whichever wins is printed; on a small CPU machine the in-process engine has no HTTP, no
scheduler and no process hop, so expect vLLM's advantage only with larger models or a GPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def lora_adapter(model_dir: str, r: int):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    config = cfg.to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    config = {k: (str(v) if not isinstance(v, (int, float, str, bool, list, dict, type(None))) else v)
              for k, v in config.items()}
    return get_peft_model_state_dict(model), config, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a model folder (default: build the tiny model)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--new", type=int, default=64, help="new tokens per sample")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine-threads", type=int, default=0, help="torch threads of TorchEngine (0: torch's)")
    ap.add_argument("--server-cpus", default="", help="CPUs the vLLM server's threads are bound to, e.g. 1 or 0-1")
    ap.add_argument("--lora-rank", type=int, default=8)
    args = ap.parse_args()

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny
    from posttrain.rollout import HTTPEngine, SamplingParams, TorchEngine, weights_checksum
    from posttrain.rollout.vllm import VLLMDialect, prompt_logprobs
    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    quiet_transformers()
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    model_dir = args.model or str(build_tiny(work / "model", "tiny", seed=0))
    if args.engine_threads:
        torch.set_num_threads(args.engine_threads)
    g = torch.Generator().manual_seed(1)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(8, 33, (args.prompts,), generator=g)]
    s = SamplingParams(temperature=1.0, max_new_tokens=args.new, ignore_eos=True, seed=0)
    want = args.prompts * args.n * args.new

    if args.server_cpus:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.server_cpus
    spec = ServerSpec(model=model_dir, max_model_len=512, lora_rank=args.lora_rank)
    with VLLMServers(spec, 1, work / "logs") as urls:
        theirs = HTTPEngine(urls, weights_dir=str(work / "w"), dialect=VLLMDialect())
        ours = TorchEngine(model_dir)
        for name, eng in (("TorchEngine", ours), ("vLLM", theirs)):
            got = sum(len(c) for c in eng.generate(prompts, args.n, s).completion_ids)
            assert got == want, (name, got, want)
        t_ours = timed(lambda: ours.generate(prompts, args.n, s), args.repeats)
        t_theirs = timed(lambda: theirs.generate(prompts, args.n, s), args.repeats)

        from transformers import AutoModelForCausalLM

        full = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
        probe = list(range(5, min(37, vocab)))

        def expected(model):
            with torch.no_grad():
                lp = model(torch.tensor([probe])).logits[0, :-1].log_softmax(-1)
            return probe, [lp[i, t].item() for i, t in enumerate(probe[1:])]

        base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        version = iter(range(1, 1000))
        t_full = timed(lambda: theirs.load_weights(full, next(version), weights_checksum(full), probe=expected(base)),
                       args.repeats)
        adapter, config, peft_model = lora_adapter(model_dir, args.lora_rank)
        lora = HTTPEngine(urls, weights_dir=str(work / "a"), dialect=VLLMDialect(lora_name="policy"),
                          adapter_config=config)
        lora_probe = expected(peft_model.eval())
        t_lora = timed(lambda: lora.load_weights(adapter, next(version), weights_checksum(adapter), probe=lora_probe),
                       args.repeats)
        assert prompt_logprobs(theirs.weights.client, urls[0], probe, model="policy")  # the adapter is served

    size = lambda w: sum(t.numel() * t.element_size() for t in w.values())  # noqa: E731
    print(f"{args.prompts} prompts x {args.n} samples x {args.new} new tokens, temperature 1, {model_dir}")
    print(f"  TorchEngine {want / t_ours:9.0f} tokens/s   ({t_ours:.2f} s)")
    print(f"  vLLM        {want / t_theirs:9.0f} tokens/s   ({t_theirs:.2f} s)")
    winner = "vLLM" if t_theirs < t_ours else "TorchEngine"
    print(f"  {winner} is faster: vLLM / TorchEngine = {t_ours / t_theirs:.2f}x")
    print("weight sync to vLLM (write, pause, reload, reset, version, resume, read back, probe):")
    print(f"  full weights   {size(full) / 2**20:8.2f} MiB  {t_full:.3f} s")
    print(f"  LoRA r={args.lora_rank:<3d}     {size(adapter) / 2**20:8.2f} MiB  {t_lora:.3f} s   "
          f"(bytes {size(adapter) / size(full):.1%} of full, time {t_lora / t_full:.2f}x)")


if __name__ == "__main__":
    main()
