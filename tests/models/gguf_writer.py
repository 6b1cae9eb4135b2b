"""Write a Hugging Face Llama folder as a GGUF file the way llama.cpp's converter lays it out (rotary
rows of q/k permuted, tensors under llama.cpp's names, a GPT-2-style BPE tokenizer in the metadata),
so the conversion back is tested against weights and a tokenizer known exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LAYER_NAMES = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
               ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
               ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")]


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary layout of a q or k projection (transformers' GGUF reader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tokenizer, model_dir: str | Path, out: str | Path, *, tied: bool = False) -> Path:
    """``model`` (a LlamaForCausalLM) and its ``tokenizer`` from ``model_dir`` as GGUF file ``out``;
    ``tied``: no output.weight (the reader ties lm_head to the embedding)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    _add_tokenizer(w, tokenizer, model_dir)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight"
              for i in range(c.num_hidden_layers) for hf, g in LAYER_NAMES}
    if not tied:
        names["lm_head.weight"] = "output.weight"
    state = model.state_dict()
    for hf, name in names.items():
        t = state[hf].float().numpy()
        if ".attn_q." in name or ".attn_k." in name:
            t = permute(t, c.num_attention_heads if ".attn_q." in name else c.num_key_value_heads)
        w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def _add_tokenizer(w, tokenizer, model_dir) -> None:
    spec = json.loads(Path(model_dir, "tokenizer.json").read_text())
    vocab = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in spec["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in special else 1 for t in vocab])  # 3: control, 1: normal
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_bos_token_id(tokenizer.eos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(tokenizer.chat_template)
