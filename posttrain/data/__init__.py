"""The data path: records on disk -> typed examples -> token ids with loss masks -> batches.

- `records`: load JSONL / Parquet / local HF datasets; SFT, prompt and preference schemas.
- `chat`: render prompts and conversations (chat template or plain text); loss-masked encoding.
- `sft`: tokenize SFT examples and raw text for mid-training.
- `packing`: plan batches (packed or padded) and collate them into `SFTBatch`.
"""
