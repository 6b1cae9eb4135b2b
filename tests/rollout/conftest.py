"""Fixtures for the rollout tests: a tiny random Llama and a one-character-per-token tokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS_ID = 2


def make_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=EOS_ID, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model


class CharTokenizer:
    """Token i <-> the character U+0100+i; token 2 is EOS (a special token, skipped on request)."""

    eos_token_id = EOS_ID

    def __len__(self) -> int:
        return 128

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(0x100 + i) for i in ids if not (skip_special_tokens and i == EOS_ID))

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 0x100 for c in text]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return make_model()


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


# Prompts of different lengths, none containing EOS.
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33, 34], [40, 41]]
