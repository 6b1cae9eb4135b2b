#!/usr/bin/env bash
# Tasks from real projects' own test suites (docs/envs.md, "Tasks from real projects"):
# download each project's source distribution once (PyPI), make SWE-bench-format tasks from it,
# audit them (gold patch passes; null and every forgery fail), and keep the clean ones.
#   bash examples/swe/make_tasks.sh runs/swe-data            # all three projects
#   MAX_TASKS=10 bash examples/swe/make_tasks.sh runs/swe-data six
# The three chosen have small suites that need nothing but pytest: inflection (455 tests),
# six (test_six.py), toolz (its own tests package). Network is used only by `pip download`.
set -euo pipefail
OUT=${1:-runs/swe-data}
shift || true
PROJECTS=${*:-"inflection==0.5.1 six==1.17.0 toolz==1.2.0"}
MAX_TASKS=${MAX_TASKS:-20}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT/sdists"
for spec in $PROJECTS; do
  name=${spec%%==*}
  ls "$OUT"/sdists/"${name}"-*.tar.gz >/dev/null 2>&1 || \
    "$PY" -m pip download --no-binary :all: --no-deps "$spec" -d "$OUT/sdists"
  sdist=$(ls "$OUT"/sdists/"${name}"-*.tar.gz | head -1)
  "$PY" -m posttrain make-env-data swe "$OUT/$name" --from "$sdist" --max-tasks "$MAX_TASKS"
  cat "$OUT/$name"/tasks_train.jsonl "$OUT/$name"/tasks_eval.jsonl > "$OUT/$name/tasks_all.jsonl"
  "$PY" -m posttrain env-audit "$OUT/$name/tasks_all.jsonl" --out "$OUT/$name/audit" --timeout 120 || true
done
