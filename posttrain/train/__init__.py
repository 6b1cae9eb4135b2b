"""Trainers for dataset-driven stages: SFT / mid-training, DPO, reward models."""
