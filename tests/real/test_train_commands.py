"""`posttrain sft`, `dpo` and `rm` on SmolLM2-135M-Instruct: a few steps each on a handful of records.

Each run goes through the command's entry point (`posttrain.cli.main`) in this process and is
judged by what it wrote: SFT's loss falls on the records it trains on (full and LoRA, chat template,
loss on the assistant replies only), DPO's and the reward model's held-out loss falls and their
margin grows on the pairs they train on. The SFT loss mask is checked token by token against the
ChatML assistant span on this tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.cli import main

pytestmark = pytest.mark.real

CHATS = [("What is the capital of France?", "The capital of France is Paris."),
         ("Name a primary colour.", "Red is a primary colour."),
         ("What is 2 + 3?", "2 + 3 = 5."),
         ("Write a Python expression for the square of x.", "x ** 2")]

PAIRS = [("What is 7 + 5?", "7 + 5 = 12.", "7 + 5 = 13."),
         ("What is the capital of Italy?", "The capital of Italy is Rome.", "The capital of Italy is Madrid."),
         ("Is 9 an even number?", "No, 9 is odd.", "Yes, 9 is even."),
         ("What is 6 times 4?", "6 times 4 is 24.", "6 times 4 is 26.")]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def chat_file(tmp_path_factory):
    records = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
               for q, a in CHATS]
    return write_jsonl(tmp_path_factory.mktemp("sft") / "chats.jsonl", records)


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory):
    records = [{"prompt": q, "chosen": c, "rejected": r} for q, c, r in PAIRS]
    return write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", records)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def common(model_dir, out: Path, steps: int) -> list[str]:
    return [f"model.path={model_dir}", f"num_steps={steps}", "optim.warmup_steps=0", "optim.schedule=constant",
            "logging.progress=false", f"out_dir={out}"]


def test_the_sft_loss_mask_is_the_chatml_assistant_span(smollm2):
    """Targets are exactly the reply's tokens and the ``<|im_end|>`` that closes it: what follows
    ``<|im_start|>assistant\\n`` in the template, up to and with its ``<|im_end|>``; the system
    prompt SmolLM2's template adds, the user turn and the assistant header are context."""
    from posttrain.data.records import SFTExample
    from posttrain.data.sft import tokenize_sft

    _, tok = smollm2
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for q, a in CHATS:
        messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        (ex,) = tokenize_sft([SFTExample(messages=messages)], tok, max_len=256, use_chat_template=True)
        ids = ex.input_ids
        starts = [i for i in range(len(ids)) if ids[i:i + len(header)] == header]
        assert len(starts) == 1 and ids.count(im_start) == 3  # system, user, assistant
        begin = starts[0] + len(header)
        end = ids.index(im_end, begin) + 1
        assert ex.loss_mask == [0] * begin + [1] * (end - begin) + [0] * (len(ids) - end)
        assert tok.decode(ids[begin:end - 1]) == a


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_loss_falls_on_chat_records(smollm2_dir, chat_file, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=16", "optim.lr=2e-3"] if lora else ["optim.lr=1e-4"]
    out = tmp_path / "run"
    assert main(["sft", *common(smollm2_dir, out, 4), f"data.path={chat_file}", "data.max_len=128",
                 "data.tokens_per_batch=512", "data.use_chat_template=true", "data.mode=sft",
                 "eval_every=0", "save_every=0", *extra]) == 0
    losses = [r["loss"] for r in rows(out)]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], losses
    assert (out / "checkpoints" / "step-4").is_dir()


def test_dpo_margin_grows_on_its_pairs(smollm2_dir, pairs_file, tmp_path):
    out = tmp_path / "dpo"
    assert main(["dpo", *common(smollm2_dir, out, 3), f"data.path={pairs_file}", f"data.eval_path={pairs_file}",
                 "data.max_len=96", "batch_pairs=4", "micro_batch_pairs=4", "optim.lr=5e-5", "beta=0.1",
                 "eval_every=3"]) == 0
    evals = [r for r in rows(out) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 3]
    first, last = evals
    assert first["eval/rewards/margin"] == pytest.approx(0.0, abs=1e-3)  # the policy is its reference
    assert last["eval/rewards/margin"] > 0.5 and last["eval/loss"] < first["eval/loss"]
    assert last["eval/rewards/accuracy"] >= first["eval/rewards/accuracy"]


def test_rm_loss_falls_and_margin_grows_on_its_pairs(smollm2_dir, pairs_file, tmp_path):
    out = tmp_path / "rm"
    assert main(["rm", *common(smollm2_dir, out, 3), f"data.path={pairs_file}", f"data.eval_path={pairs_file}",
                 "data.max_len=96", "batch_pairs=4", "micro_batch_pairs=4", "optim.lr=1e-4",
                 "eval_every=3"]) == 0
    evals = [r for r in rows(out) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 3]
    first, last = evals
    assert last["eval/loss"] < first["eval/loss"] and last["eval/margin"] > first["eval/margin"]
    assert last["eval/accuracy"] >= first["eval/accuracy"]
