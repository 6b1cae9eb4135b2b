#!/usr/bin/env bash
# Sets up posttrain on a fresh machine: system packages (bubblewrap for the code sandbox),
# a virtual environment in .venv, the CPU build of torch pinned in constraints.txt, and the
# package with its extras. Safe to run again: it skips what is already done.
#   scripts/setup.sh            runtime + test extras
#   EXTRAS=test,bench scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${EXTRAS:-test}"
PY="${PYTHON:-python3}"

if ! command -v bwrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "[setup] installing bubblewrap (code sandbox)"
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    $SUDO apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "[setup] WARNING: bubblewrap not found and apt-get unavailable: the code sandbox will refuse to run" >&2
  fi
fi

stamp=".venv/.posttrain-setup"
want="$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-16)-$EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]"
echo "$want" > "$stamp"
echo "[setup] ready: .venv/bin/posttrain"
