"""Peak memory of one GRPO update at long completions: the output head in chunks vs full logits.

One update of posttrain's `Policy` (the scoring forward, then the loss's forward and backward and
the optimizer step) on one prompt of 16 tokens and a completion of T tokens, for T = 1k, 4k, 8k and
vocabularies of 32k (Llama, Mistral) and 152k (Qwen), on a model built here (Llama layout, hidden
256, 2 layers: small, so that the head's share shows), fp32 on the CPU. Each (T, V, mode) runs in
its own process, and its peak extra memory is the process's peak resident set size during the
update minus its size just before (the model, the optimizer state and the batch). The two modes'
loss and gradient norm are printed side by side: the chunked head computes the same update.

``--head-only`` measures the head's share alone: the same hidden states (2 rows of 16 + T positions,
width 256) and head, the token log-probs (``log_softmax(h W^T)[x]``, or `head_token_logprobs`) and
their backward into h and W; the ratio there is what the head costs, without the body around it.

Configurations whose full-logits side would not fit in this machine's available memory (about 3 x
T x V x 4 bytes) are skipped with a line saying so.

    .venv/bin/python bench/long_context_memory.py [--tokens 1024,4096,8192] [--vocab 32000,151936] [--head-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def one(tokens: int, vocab: int, chunked: bool) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.core.optim import OptimConfig, build_scheduler
    from posttrain.rl.batch import build_batch
    from posttrain.rl.config import RLConfig
    from posttrain.rl.losses import make_loss_fn
    from posttrain.rl.policy import Policy
    from posttrain.rollout import Rollouts, SamplingParams

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens + 64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    policy = Policy(model, opt, build_scheduler(opt, OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant"), 1),
                    temperature=1.0, grad_clip=1e9, micro_batch_tokens=4 * (tokens + 16), chunked_head=chunked)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (16,), generator=g).tolist()
    rows = [torch.randint(0, vocab, (tokens,), generator=g).tolist() for _ in range(2)]
    ro = Rollouts(prompt_idx=[0, 0], prompt_ids=[prompt, prompt], completion_ids=rows,
                  logprobs=[[-1.0] * tokens] * 2, finish_reason=["length"] * 2, policy_version=[0, 0],
                  sampling=SamplingParams())
    batch = build_batch(ro, [1.0, 0.0], [True, True], pad_id=0)
    batch.adv_B = torch.tensor([1.0, -1.0])
    before = rss_bytes()
    batch.old_logp_BT, batch.ref_logp_BT, _ = policy.score(batch)
    metrics = policy.train_step(batch, make_loss_fn(RLConfig()), aggregation="seq_mean_token_mean", seed=0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_extra": max(0, peak - before), "loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}


def head_only(tokens: int, vocab: int, chunked: bool) -> dict:
    """Peak extra memory of the head alone: token log-probs from hidden states and their backward."""
    import torch

    from posttrain.algos.head import head_token_logprobs

    def update(positions: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(0)
        hidden = (torch.randn(2, positions, 256, generator=g) * 0.5).requires_grad_()
        weight = (torch.randn(vocab, 256, generator=g) * 0.05).requires_grad_()
        targets = torch.randint(0, vocab, (2, positions), generator=g)
        nonlocal before
        before = rss_bytes()
        if chunked:
            logp = head_token_logprobs(hidden, weight, None, targets)
        else:
            logp = (hidden @ weight.T).float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
        loss = (logp * torch.tensor([[1.0], [-1.0]])).sum() / logp.numel()
        loss.backward()
        return loss.item(), torch.cat([hidden.grad.flatten(), weight.grad.flatten()]).norm().item()

    before = 0
    update(4)  # the kernels' libraries load on first use: not the head's memory
    loss, grad_norm = update(tokens + 16)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_extra": max(0, peak - before), "loss": loss, "grad_norm": grad_norm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1024,4096,8192", help="completion lengths (default 1024,4096,8192)")
    ap.add_argument("--vocab", default="32000,151936", help="vocabulary sizes (default 32000,151936)")
    ap.add_argument("--head-only", action="store_true",
                    help="the head's log-probs and their backward alone, not a whole update")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # T,V,chunked: run one configuration, print JSON
    args = ap.parse_args()
    if args.one:
        t, v, c = args.one.split(",")
        print(json.dumps((head_only if args.head_only else one)(int(t), int(v), c == "1")))
        return
    gib = 1024 ** 3
    print(f"{'T':>6} {'V':>7} {'full GiB':>9} {'chunked GiB':>12} {'ratio':>7}  loss full / chunked, grad norm full / chunked")
    for v in map(int, args.vocab.split(",")):
        for t in map(int, args.tokens.split(",")):
            need = 3 * 2 * t * v * 4
            if need > 0.8 * available_bytes():
                print(f"{t:>6} {v:>7}  skipped: full logits need ~{need / gib:.1f} GiB, {available_bytes() / gib:.1f} GiB available")
                continue
            out = {}
            for chunked in (False, True):
                cmd = [sys.executable, __file__, "--one", f"{t},{v},{int(chunked)}"] + ["--head-only"] * args.head_only
                r = subprocess.run(cmd, capture_output=True,
                                   text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
                if r.returncode != 0:
                    raise SystemExit(f"T={t} V={v} chunked={chunked} failed:\n{r.stderr[-2000:]}")
                out[chunked] = json.loads(r.stdout.strip().splitlines()[-1])
            full, ch = out[False], out[True]
            print(f"{t:>6} {v:>7} {full['peak_extra'] / gib:>9.2f} {ch['peak_extra'] / gib:>12.2f} "
                  f"{full['peak_extra'] / max(ch['peak_extra'], 1):>6.1f}x  {full['loss']:.6f} / {ch['loss']:.6f}, "
                  f"{full['grad_norm']:.9f} / {ch['grad_norm']:.9f}", flush=True)


if __name__ == "__main__":
    main()
