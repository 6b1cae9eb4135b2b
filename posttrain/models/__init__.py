"""Models: loading causal LMs and tokenizers, LoRA, the embedded tiny models."""
