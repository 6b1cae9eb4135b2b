#!/usr/bin/env bash
# Makes .venv-agents: the agent libraries users write agents with (smolagents, the OpenAI Agents
# SDK, mini-swe-agent), pinned in scripts/agents-requirements.txt, in an environment of their own.
# An agent runs as a command (env.agent_cmd) with this interpreter, beside the user's code, and
# reaches posttrain only through its base_url (docs/agents.md): posttrain imports none of them.
# No torch here. Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
REQS=scripts/agents-requirements.txt
ENV=.venv-agents
stamp="$ENV/.posttrain-agents"
want="$(sha1sum "$REQS" | cut -c1-16)"
if [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; then
  exit 0
fi
echo "[setup] making $ENV ($(grep -v '^#' "$REQS" | tr '\n' ' ')); about a minute"
[ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$ENV/bin/python" -m pip install -q -r "$REQS"
"$ENV/bin/python" -c "import smolagents, agents, minisweagent; print('[setup] smolagents', smolagents.__version__, \
'openai-agents, mini-swe-agent', minisweagent.__version__, 'in $ENV')"
echo "$want" >> "$stamp"
