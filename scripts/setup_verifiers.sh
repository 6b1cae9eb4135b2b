#!/usr/bin/env bash
# Makes .venv-verifiers: Prime Intellect's `verifiers` library in an environment of its own.
# Its requirements (openai<3, mcp==2.0.0, anthropic, prime-*, renderers, ...) do not fit beside
# posttrain's (openai 3), and a verifiers environment runs in a process of its own anyway: posttrain
# starts `posttrain/envs/vf_driver.py` with this interpreter (env.name=verifiers:<taskset>,
# docs/envs.md). No torch is installed here. Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VERSION="${VERIFIERS_VERSION:-0.4.0}"
ENV=.venv-verifiers
stamp="$ENV/.posttrain-verifiers"
if [ -f "$stamp" ] && grep -qxF "$VERSION" "$stamp"; then
  exit 0
fi
echo "[setup] making $ENV (verifiers $VERSION); about a minute"
[ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$ENV/bin/python" -m pip install -q "verifiers==$VERSION"
"$ENV/bin/python" -c "import verifiers.v1, verifiers; print('[setup] verifiers', verifiers.__version__, 'in $ENV')"
echo "$VERSION" >> "$stamp"
