"""Reinforcement learning: the sync controller (``loop.py``), the trainer side (``policy.py``),
batches, diagnostics and prompt sampling. Read ``loop.py`` top to bottom for one RL step."""
