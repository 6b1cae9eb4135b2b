#!/usr/bin/env bash
# Checks and times the GPU paths on one CUDA device: the rollout engine vs model.generate, the bf16
# engine's mismatch to the float32 trainer, the update's MFU, and `posttrain sft` / `posttrain rl` in
# bf16 for a few steps, on a ~0.38B model
# built locally with random weights (bench/gpu_check.py; docs/distributed.md). Needs torch with
# CUDA, transformers and posttrain's own requirements; downloads nothing.
#   bash scripts/gpu_check.sh [--steps 3] [--prompts 64] [--new 128]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" bench/gpu_check.py "$@"
