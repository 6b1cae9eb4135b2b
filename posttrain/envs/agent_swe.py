"""An agent on a SWE-bench-format task (``env.name=agent`` with ``env.options.verdict=swe``): the
agent's shell commands run in posttrain's sandbox, on the episode's own tree, and the verdict is
the task's hidden tests (`posttrain.envs.swe`) on what the agent left.

The agent reaches the sandbox through one more route of its episode's door, ``POST
{base_url}/exec`` with ``{"command": "..."}`` and the episode's key; the answer is ``{"output",
"returncode"}``. Each command is one sandbox job: the task's tree read-only under an overlay, the
episode's changes so far written on it, the command run by ``/bin/sh -c`` in the project's root
with a timeout; the files it changed come back and become the episode's changes. Nothing of the
host is reachable from the command (the sandbox's isolation, `posttrain.sandbox`), and a command
never runs anywhere else: an episode without this verdict has no ``exec`` route (404).

Design choices: the state of the episode is its changed files (as `SweEnv` keeps them), not a
live container, so each command starts a fresh shell (as mini-swe-agent's own environments do:
"every action is executed in a new subshell"); files that are not UTF-8 text, dot-files and
caches a command makes are not kept (the SWE tree leaves them out too). The agent's own return
is ignored for the reward: the hidden tests decide (PASS, or MODEL_FAIL with the F2P/P2P
fractions as ``env/<key>_mean``)."""

from __future__ import annotations

import json

from posttrain.envs.repo import PathError
from posttrain.envs.swe import _WRITE_TREE, SweEnv, tree_job
from posttrain.outcome import Outcome, OutcomeClass

MARK = "@@posttrain-exec@@ "  # the line of the job's stdout that carries its result

# Runs in the sandbox: the episode's tree as it is, the command in a fresh shell at its root, then
# what the command changed (text files) and removed, read back by hashing the tree before and after.
_SHELL = _WRITE_TREE + '''

def _shell(changes, command, timeout):
    import hashlib, json, os, subprocess

    def snapshot():
        seen = {}
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as f:
                        seen[os.path.relpath(path, ROOT)] = hashlib.sha1(f.read()).hexdigest()
                except OSError:
                    pass
        return seen

    _write_tree(changes, ROOT, "", "/tmp/.unused.ini")
    before = snapshot()
    try:
        run = subprocess.run(["/bin/sh", "-c", command], cwd=ROOT, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        output, code = run.stdout.decode("utf-8", "replace"), run.returncode
    except subprocess.TimeoutExpired as e:
        output, code = (e.stdout or b"").decode("utf-8", "replace") + "\\n[timed out after %ss]" % timeout, -1
    after, changed = snapshot(), {}
    for path, digest in after.items():
        if before.get(path) != digest:
            try:
                with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                    changed[path] = f.read()
            except (OSError, UnicodeDecodeError):
                pass
    removed = [p for p in before if p not in after]
    print(MARK + json.dumps({"output": output, "returncode": code, "changed": changed, "removed": removed}))
'''


def shell_program(command: str, timeout_s: float) -> str:
    """For `tree_job`: ``command`` on the episode's tree, its output and changes printed."""
    return f"MARK = {MARK!r}\n" + _SHELL + f"\n_shell(CHANGES, {command!r}, {timeout_s!r})\n"


class SweSandbox:
    """One episode's SWE task: the tree its commands change, and the hidden tests' verdict."""

    def __init__(self, venv: str = "", timeout_s: float = 60.0, max_output_chars: int = 10000):
        self.swe = SweEnv(venv=venv, timeout_s=timeout_s, max_output_chars=max_output_chars)
        self.commands = 0

    def reset(self, example: dict) -> dict:
        """Loads the task; returns what the agent is given: the issue and the repository's name."""
        self.swe.reset(example)
        return {"problem_statement": self.swe.task["problem"], "repo": self.swe.task["repo"],
                "instance_id": example.get("instance_id", "")}

    def execute(self, body: dict) -> dict:
        """The ``exec`` route: run ``body["command"]`` in the sandbox on the episode's tree."""
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            return {"output": "a command is a non-empty string", "returncode": 2}
        self.commands += 1
        swe = self.swe
        files = swe.files()
        job = tree_job(shell_program(command, swe.timeout_s), swe.task["tree"], files, "", swe.timeout_s + 10)
        outcome = swe._run(job)
        lines = [ln for ln in (outcome.detail or "").splitlines() if ln.startswith(MARK)]
        if outcome.cls is not OutcomeClass.PASS or not lines:
            return {"output": swe._clip_end(f"the command did not finish ({outcome.reason}): {outcome.detail}"),
                    "returncode": -1}
        result = json.loads(lines[-1][len(MARK):])
        for path, text in result["changed"].items():
            self._keep(path, text)
        for path in result["removed"]:
            self._keep(path, None)
        return {"output": swe._clip_end(result["output"]), "returncode": result["returncode"]}

    def _keep(self, path: str, text: str | None) -> None:
        try:
            self.swe._put(path, text)
        except (PathError, ValueError):  # a dot-file, a cache, a file too large: not part of the tree
            pass

    def verdict(self) -> tuple[Outcome, dict]:
        """The hidden tests on the tree the agent left, and their F2P/P2P fractions."""
        outcome = self.swe.judge("")
        return outcome, dict(self.swe.fractions)
