"""``env.name=agent`` with ``verdict=swe`` (`posttrain.envs.agent_swe`), without an agent library: an
openai-client agent that runs its shell commands through its episode's ``exec`` route. The commands
run in the sandbox on the episode's tree, and the task's hidden tests give the verdict."""

from __future__ import annotations

from pathlib import Path

import httpx
from openai import OpenAI

from posttrain.envs.agent import AgentEnv
from posttrain.envs.runner import EpisodeLimits, run_episodes
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams
from tests.envs.swe_project import FIX, make_record

FIXED = FIX["src/calc/ops.py"]


def shell_agent(task: dict, base_url: str, api_key: str) -> float:
    """Asks the model once, then runs three commands: one that leaves a file, one that looks
    outside the project, one that writes the fix. Its own reward is always 0."""
    OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": task["problem_statement"]}])
    assert set(task) == {"problem_statement", "repo", "instance_id"}  # never the fix or the hidden tests
    for command in ("echo made-here > made_by_agent.txt && cat made_by_agent.txt",
                    f"ls {Path.cwd()} 2>&1; echo exit=$?",
                    f"cat > src/calc/ops.py <<'PY'\n{FIXED}PY"):
        reply = httpx.post(base_url + "/exec", json={"command": command},
                           headers={"authorization": f"Bearer {api_key}"}, timeout=120).json()
        OUTPUTS.append(reply["output"])
    return 0.0


OUTPUTS: list[str] = []


def test_commands_run_in_the_sandbox_on_the_episodes_tree_and_the_hidden_tests_judge(nano_tokenizer, scripted,
                                                                                      tmp_path):
    record, envs = make_record(tmp_path), []

    def make():
        envs.append(AgentEnv(agent=f"{__name__}:shell_agent", verdict="swe", timeout_s=120))
        return envs[-1]

    OUTPUTS.clear()
    (ep,) = run_episodes(scripted(lambda prompt, i: "ok"), nano_tokenizer, make, [record], 1,
                         SamplingParams(max_new_tokens=8), EpisodeLimits(max_turns=2, max_total_tokens=2048,
                                                                         step_timeout_s=120))
    assert ep.outcome.cls is OutcomeClass.PASS and ep.outcome.reward == 1.0, ep.outcome  # the hidden tests, not 0
    assert OUTPUTS[0] == "made-here\n" and "No such file or directory" in OUTPUTS[1]  # posttrain's folder is not there
    changes = envs[0].sandbox.swe.changes
    assert changes["made_by_agent.txt"] == "made-here\n" and changes["src/calc/ops.py"] == FIXED
    assert not (Path(record["repo_path"]) / "made_by_agent.txt").exists() and not Path("made_by_agent.txt").exists()
