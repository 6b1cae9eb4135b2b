"""Steps/s of our sync GRPO step vs TRL's `GRPOTrainer`, side by side in one process.

What is compared: one full RL step on each side — sample 8 prompts x G=8 completions of 32 new
tokens, score them with the arithmetic verifier, compute group-normalised advantages, one
clipped-surrogate AdamW update over all 64 completions, and (ours) push the new weights to the
rollout engine. Ours is ``posttrain.rl.loop.rl_step`` on a run built by ``setup(cfg)``; TRL's is
one optimizer step of ``GRPOTrainer.train()``.

Fairness choices:

* same model: the embedded ``tiny`` Llama (``build_tiny(dir, "tiny", seed=0)``) after 120 steps of
  SFT on the task (`build_assets`: the demo's recipe, cut short), so that rewards vary: about 1
  sample in 4 is right, and the zero-variance groups (all wrong, or all right) are about half, the
  regime of a real GRPO run. An untrained model earns reward 0 everywhere: both sides' updates are
  then exactly zero, and ours would skip its whole backward. The model is made once under
  ``--out`` and reused. fp32 on CPU, same torch thread count (one process). The default is one
  thread: on a shared machine whose load exceeds its cores, a second OpenMP thread makes every
  small kernel wait at a barrier for a descheduled thread (a 64 x 32-token rollout measured 0.46 s
  with one thread and 14-28 s with two at load 13 on 2 cores), and the timings then measure the
  scheduler, not the code;
* same prompts (``write_arithmetic(...)/prompts_train.jsonl``: one-digit additions, rendered with
  the tokenizer's chat template on both sides) and the same reward (our arithmetic verifier,
  wrapped as a TRL reward function, through ``score_batch`` on both sides);
* no reference model (ours: ``kl.coef=0, kl.track=false``; TRL: ``beta=0``), one update per
  generation (ours: ``ppo_epochs=1, mini_batches=1``; TRL: ``num_iterations=1`` and
  ``generation_batch_size = 64`` completions = one optimizer step);
* same optimizer: torch AdamW (TRL ``optim="adamw_torch"``), lr, betas (0.9, 0.95), eps 1e-8, no
  weight decay, constant schedule, no warmup, grad-norm clip 1.0; same clip range (0.2 / 0.28)
  and per-sequence token-mean aggregation (ours ``grpo`` = TRL ``loss_type="grpo"``);
* the same micro-batch size on both sides (``--micro-batch``: ours ``micro_batch_tokens`` of that
  many 64-token rows, TRL ``per_device_train_batch_size`` with gradient accumulation up to 64
  completions);
* TRL without gradient checkpointing (its GRPO default) so that neither side recomputes
  activations; TRL logging every step with ``report_to="none"``, no checkpoints;
* exactly 32 new tokens per completion on both sides: ours samples with ``ignore_eos`` (EOS may be
  drawn and generation goes on), TRL with ``generation_kwargs={"min_new_tokens": 32}`` (EOS is
  masked until the 32nd token). The script counts the generated tokens of each side and prints
  tokens/s as well as steps/s;
* warm-up steps on both sides are untimed; then the steps interleave (TRL step k, our step k,
  TRL step k+1, ...) so that bursts of load from other processes hit both alike. A TRL step is
  timed from the end of our previous step to TRL's ``on_step_end`` callback, so it includes
  everything TRL does between two optimizer steps (data loading, generation, logging).

What each side does beyond that is its own design. Ours samples with its KV-cache engine (one
prefill per distinct prompt), scores the rollouts with the trainer and differentiates that same
forward for the single update (``Policy(reuse_score_forward=...)``), runs each group's shared
prompt once in the trainer (``posttrain.rl.shared_prefix``), leaves the rows of zero-variance
groups out of the backward (their advantage is exactly 0, so the update is the same;
``skip_zero_variance_backward``, off with ``--no-skip``), compares trainer and sampler log-probs
(truncated importance weights, mismatch metrics) and syncs weights to the engine's own copy with a
checksum. TRL samples with ``model.generate`` and runs the full rows through the model once for
the update. The script prints the fraction of zero-variance groups each side sampled: the skip's
gain grows with it.

``--defaults --steps 20 --warmup 2`` on the 2-core development machine (one thread each), 49% of
the groups zero-variance on every side: at load average 2.6-2.9, TRL 1.432 s/step, ours at
`posttrain rl`'s defaults 0.762 s/step (1.88x) and with ``kl.track=false`` 0.732 s/step (1.96x);
right after, with ``--no-skip``, at load 2.9-3.0, TRL 1.374 s/step, ours 0.929 s/step (1.48x) and
0.913 s/step (1.50x). The skip halves our update stage (0.41 s -> 0.22 s); rollout 0.26-0.29 s,
log-probs 0.21-0.23 s and sync 0.02 s are the same either way.

Where our step goes, above its matmul floor: attention (the decoder reads the whole KV cache each
step, the trainer's CPU attention kernel is slow at these shapes), the Hugging Face model's
elementwise kernels and their backward, ~190 kernel launches per decode step, the tokenizer's
decode of the texts, and the weight sync (SHA-256 over the 10 MB of weights twice: the trainer's
checksum and the engine's check).

``--defaults`` runs ours as a user gets it: only the task is set (model, prompts, 8 x G=8, 32 new
tokens, the arithmetic verifier); everything else (learning rate, micro-batching, the reference
tracked every ``kl.track_every`` steps, the correction) is `posttrain rl`'s default, once as is and
once with ``kl.track=false``. TRL keeps the settings above (its default ``beta`` is 0: no
reference).

Run (about 1 minute on 2 loaded CPU cores with the defaults, plus about 1 minute the first time
to make the model under ``--out``):

    .venv/bin/python bench/grpo_vs_trl.py
    .venv/bin/python bench/grpo_vs_trl.py --defaults --steps 20 --warmup 2
    .venv/bin/python bench/grpo_vs_trl.py --defaults --steps 20 --warmup 2 --no-skip
    .venv/bin/python bench/grpo_vs_trl.py --steps 10 --warmup 2 --micro-batch 16
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from posttrain.algos.advantages import zero_variance
from posttrain.config import load_config
from posttrain.models.tiny import build_tiny
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import rl_step, setup
from posttrain.tasks.arithmetic import write_arithmetic
from posttrain.tracking import StageTimer
from posttrain.verifiers import build_reward, score_batch

PROMPTS, G, NEW_TOKENS = 8, 8, 32


class FixedLength:
    """Our engine, told to ignore EOS so every completion has exactly ``max_new_tokens`` tokens."""

    def __init__(self, engine):
        self._engine = engine

    def generate(self, prompts, n, sampling):
        return self._engine.generate(prompts, n, dataclasses.replace(sampling, ignore_eos=True))

    def __getattr__(self, name):
        return getattr(self._engine, name)


# The task: one-digit additions with a column trace (24-36 tokens, so those with a carry do not
# finish in 32), 70 problems (all there are, less the held-out ones).
TASK = dict(digits=1, ops="+", fmt="trace", n_train=70, n_eval=8, seed=0)
SFT_STEPS = 120


def build_assets(out: Path, printer=print) -> tuple[Path, Path]:
    """The SFT checkpoint both sides start from and the prompts, made once under ``out`` and reused.

    The demo's SFT recipe, cut short so that the model is right on ~1 sample in 4: many groups
    are all-wrong, many are not (the regime of a real GRPO run). Each SFT completion ends with a
    newline: both sides generate past the end (32 tokens each), and the extra tokens then start a
    new line instead of running into the answer's.
    """
    from posttrain.tracking import latest_checkpoint

    data, sft = out / "data", out / "sft"
    ckpt = latest_checkpoint(sft) if sft.is_dir() else None
    if ckpt is None or not (data / "prompts_train.jsonl").is_file():
        ckpt = sft_checkpoint(out, printer)
    return Path(ckpt), data / "prompts_train.jsonl"


def sft_checkpoint(out: Path, printer=print) -> str:
    import json

    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, run_sft

    printer(f"building the bench model in {out}: the tiny model, {SFT_STEPS} SFT steps on the arithmetic task")
    model_dir = build_tiny(out / "tiny", "tiny", seed=0)
    data = write_arithmetic(out / "data", **TASK)
    records = [json.loads(line) for line in Path(data["train"]).read_text().splitlines()]
    sft_data = out / "data" / "sft.jsonl"
    sft_data.write_text("".join(json.dumps(r | {"completion": r["completion"] + "\n"}) + "\n" for r in records))
    cfg = load_config(SFTConfig, None, [
        f"model.path={model_dir}", f"data.path={sft_data}", "data.max_len=128", "data.tokens_per_batch=1024",
        "optim.lr=3e-3", "optim.warmup_steps=20", f"num_steps={SFT_STEPS}", "eval_every=0", "save_every=0",
        "seed=0", f"out_dir={out / 'sft'}", "logging.progress=false"])
    return run_sft(cfg)["checkpoint"]


# Every row of a step is at most ROW_TOKENS long (a ~17-token prompt + 32 new tokens), so a budget of
# micro-batch x ROW_TOKENS padded tokens holds exactly --micro-batch sequences, as TRL's batch does.
ROW_TOKENS = 64


def our_run(model_dir: Path, prompts: Path, out: Path, args, defaults: bool = False, track: bool = True):
    """Our run: the task's settings only (``defaults``: what `posttrain rl` does out of the box,
    with or without the tracked reference), or every setting pinned to TRL's (the default)."""
    task = {"model.path": model_dir, "data.path": prompts, "prompts_per_step": PROMPTS, "rollout.group_size": G,
            "rollout.max_new_tokens": NEW_TOKENS, "verifier": "arithmetic", "eval_every": 0,
            "num_steps": args.warmup + args.steps, "seed": 0, "out_dir": out, "logging.progress": False}
    pinned = {"algorithm": "grpo", "rollout.temperature": 1.0, "kl.coef": 0.0, "kl.track": False,
              "ppo_epochs": 1, "mini_batches": 1, "micro_batch_tokens": args.micro_batch * ROW_TOKENS,
              "optim.lr": args.lr, "optim.beta1": 0.9, "optim.beta2": 0.95, "optim.eps": 1e-8,
              "optim.weight_decay": 0.0, "optim.schedule": "constant", "optim.warmup_steps": 0,
              "optim.grad_clip": 1.0, "clip_low": 0.2, "clip_high": 0.28}
    overrides = task | ({"kl.track": track} if defaults else pinned) | {"skip_zero_variance_backward": not args.no_skip}
    cfg = load_config(RLConfig, None, [f"{k}={v}" for k, v in overrides.items()])
    run = setup(cfg)
    run.engine = FixedLength(run.engine)
    return run


def trl_trainer(model_dir: Path, prompts: Path, out: Path, args, callbacks):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models.hf import load_tokenizer

    verifier = build_reward("arithmetic")
    tokens, zero_variance = callbacks[0].tokens, callbacks[0].trl_zero_variance

    def arithmetic_reward(prompts, completions, completion_ids, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        tokens.append(sum(len(c) for c in completion_ids))
        outcomes = score_batch(verifier, texts, [{"answer": a} for a in answer])
        rewards = [o.reward if o.is_reward else 0.0 for o in outcomes]
        zero_variance.append(zero_variance_frac(rewards))
        return rewards

    data = load_dataset("json", data_files=str(prompts), split="train")
    data = data.map(lambda ex: {"prompt": [{"role": "user", "content": ex["prompt"]}]})
    mb = min(args.micro_batch, PROMPTS * G)
    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0,
        num_generations=G, per_device_train_batch_size=mb, gradient_accumulation_steps=PROMPTS * G // mb,
        max_completion_length=NEW_TOKENS, generation_kwargs={"min_new_tokens": NEW_TOKENS},
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type="grpo",
        scale_rewards="group", epsilon=0.2, epsilon_high=0.28, learning_rate=args.lr,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        max_steps=args.warmup + args.steps, logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=config, train_dataset=data,
                          processing_class=load_tokenizer(str(model_dir)), callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # TRL still computes its per-step logs; we just do not print them
    return trainer


def zero_variance_frac(rewards: list[float]) -> float:
    """The fraction of groups whose rewards are all equal (TRL lays each prompt's G samples out in a row)."""
    assert len(rewards) % G == 0, len(rewards)
    groups = torch.tensor(rewards).view(-1, G)
    return float(zero_variance(groups, torch.ones_like(groups, dtype=torch.bool)).float().mean())


def make_interleaver(runs: dict, warmup: int):
    """A TRL callback that times TRL's step, then runs and times one step of each of ours, at each step end."""
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        def __init__(self):
            self.tokens: list[int] = []  # TRL generated tokens, one entry per generation
            self.trl_zero_variance: list[float] = []  # the fraction of TRL's groups, one entry per generation
            self.ours_zero_variance: dict[str, list[float]] = {name: [] for name in runs}
            self.trl_s: list[float] = []
            self.ours_s: dict[str, list[float]] = {name: [] for name in runs}
            self.ours_tokens: dict[str, list[int]] = {name: [] for name in runs}
            self.stages: dict[str, list[dict]] = {name: [] for name in runs}
            self.resume = None

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step = state.global_step
            if step > warmup:
                self.trl_s.append(now - self.resume)
            for name, run in runs.items():
                timer = StageTimer()
                t0 = time.perf_counter()
                metrics = rl_step(run, step, timer)
                took = time.perf_counter() - t0
                if step > warmup:
                    self.ours_s[name].append(took)
                    self.ours_tokens[name].append(metrics["tokens/generated"])
                    self.ours_zero_variance[name].append(metrics["groups/zero_variance_frac"])
                    self.stages[name].append(timer.pop())
            self.resume = time.perf_counter()

    return Interleave()


def report(cb, warmup: int) -> None:
    trl_tokens = cb.tokens[warmup:]
    assert len(trl_tokens) == len(cb.trl_s), (len(trl_tokens), len(cb.trl_s))
    trl_rate, trl_tok = len(cb.trl_s) / sum(cb.trl_s), sum(trl_tokens) / sum(cb.trl_s)
    print(f"timed steps per side: {len(cb.trl_s)}; tokens per step: TRL {set(trl_tokens)}, "
          + ", ".join(f"{n} {set(t)}" for n, t in cb.ours_tokens.items()) + f" (wanted {PROMPTS * G * NEW_TOKENS})")
    print(f"{'':22} {'steps/s':>8} {'s/step':>7} {'median s':>9} {'tokens/s':>9} {'vs TRL':>7}")
    print(f"{'TRL':22} {trl_rate:8.3f} {1 / trl_rate:7.3f} {statistics.median(cb.trl_s):9.3f} {trl_tok:9.0f}")
    for name, times in cb.ours_s.items():
        rate, tok = len(times) / sum(times), sum(cb.ours_tokens[name]) / sum(times)
        print(f"{name:22} {rate:8.3f} {1 / rate:7.3f} {statistics.median(times):9.3f} {tok:9.0f} "
              f"{rate / trl_rate:6.2f}x")
    zero_variance = {"TRL": cb.trl_zero_variance[warmup:], **cb.ours_zero_variance}
    print("zero-variance groups (mean over the timed steps): "
          + ", ".join(f"{name} {statistics.mean(f):.0%}" for name, f in zero_variance.items()))
    for name, stages in cb.stages.items():
        mean = {k: statistics.mean(s.get(k, 0.0) for s in stages) for k in stages[0]}
        print(f"{name} stages (mean s): " + ", ".join(f"{k[5:-2]} {v:.3f}" for k, v in mean.items()))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, torch threads {torch.get_num_threads()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--micro-batch", type=int, default=64, help="sequences per forward/backward, both sides")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides (see the docstring)")
    parser.add_argument("--out", default="runs/bench_grpo_vs_trl",
                        help="where the bench model (SFT checkpoint) and prompts are made once and reused")
    parser.add_argument("--no-skip", action="store_true",
                        help="ours differentiates every row (skip_zero_variance_backward=false): the skip's gain")
    parser.add_argument("--defaults", action="store_true",
                        help="ours at `posttrain rl`'s defaults (task settings only), with and without the "
                             "tracked reference, instead of every setting pinned to TRL's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if (PROMPTS * G) % args.micro_batch:
        parser.error(f"--micro-batch must divide {PROMPTS * G}")
    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    model_dir, prompts = build_assets(Path(args.out))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.defaults:
            runs = {"ours (defaults)": our_run(model_dir, prompts, root / "ours", args, defaults=True),
                    "ours (kl.track=false)": our_run(model_dir, prompts, root / "noref", args, defaults=True,
                                                     track=False)}
        else:
            runs = {"ours": our_run(model_dir, prompts, root / "ours", args)}
        cb = make_interleaver(runs, args.warmup)
        trainer = trl_trainer(model_dir, prompts, root / "trl", args, [cb])
        print(f"{PROMPTS} prompts x G={G} x {NEW_TOKENS} new tokens, micro-batch {args.micro_batch}, "
              f"{args.warmup} warm-up + {args.steps} timed steps per side, interleaved")
        cb.resume = time.perf_counter()
        trainer.train()
        report(cb, args.warmup)


if __name__ == "__main__":
    main()
