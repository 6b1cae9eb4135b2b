#!/usr/bin/env bash
# Makes .venv-tinker: the official `tinker` SDK (Thinking Machines) in an environment of its own, to
# drive `posttrain tinker-serve` the way a user's loop does (docs/tinker.md). The SDK pins nothing
# that clashes today, but a client belongs beside the user's code, not posttrain's: a separate venv
# proves the server speaks the wire format, not a shared import. No torch here: clients send numpy
# arrays. Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VERSION="${TINKER_VERSION:-0.38.0}"
ENV=.venv-tinker
stamp="$ENV/.posttrain-tinker"
if [ -f "$stamp" ] && grep -qxF "$VERSION" "$stamp"; then
  exit 0
fi
echo "[setup] making $ENV (tinker $VERSION); about a minute"
[ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$ENV/bin/python" -m pip install -q "tinker==$VERSION"
"$ENV/bin/python" -c "import tinker; print('[setup] tinker', tinker.__version__, 'in $ENV')"
echo "$VERSION" >> "$stamp"
