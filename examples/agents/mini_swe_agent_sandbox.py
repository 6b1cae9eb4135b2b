"""mini-swe-agent on a SWE task, its shell commands run in posttrain's sandbox.

The agent is mini-swe-agent's own ``DefaultAgent`` with its ``mini.yaml`` configuration and its
``LitellmModel``, written the way its Python quick start shows; only the model's ``api_base`` /
``api_key`` point at posttrain, and the environment is ``PosttrainSandbox`` below instead of
``LocalEnvironment``: it implements mini-swe-agent's ``Environment`` protocol (``execute``,
``get_template_vars``, ``serialize``) by sending each command to the episode's ``exec`` route,
where posttrain runs it in its sandbox on the episode's copy of the repository. No command runs on
this machine.

    posttrain rl ... data.path=swe_tasks.jsonl env.name=agent env.options.verdict=swe \\
        env.agent_cmd=".venv-agents/bin/python examples/agents/mini_swe_agent_sandbox.py"

Task (JSON on stdin): {"problem_statement": ..., "repo": ...}. The reward is the task's hidden
tests, run by posttrain after the episode; the line this prints is not used for it."""

import json
import os
import platform
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list online
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # its banner would go to stdout, where the reward line is

import httpx  # noqa: E402
import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class PosttrainSandbox:
    """mini-swe-agent's ``Environment``: each command runs in posttrain's sandbox on the episode's tree."""

    def __init__(self, base_url: str, api_key: str, timeout: float = 120.0, env: dict | None = None):
        self.url, self.timeout = base_url.rstrip("/") + "/exec", timeout
        self.http = httpx.Client(headers={"authorization": f"Bearer {api_key}"}, timeout=timeout)
        self.env = env or {}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        command = action.get("command", "")
        if self.env:  # the configuration's variables (PAGER=cat, ...), as LocalEnvironment sets them
            command = " ".join(f"{k}={json.dumps(v)}" for k, v in self.env.items()) + " ; " + command
        reply = self.http.post(self.url, json={"command": command})
        reply.raise_for_status()
        output = {**reply.json(), "exception_info": ""}
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs) -> dict:
        return {**platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment_type": f"{__name__}.{type(self).__name__}"}}}


def main() -> None:
    task = json.loads(sys.stdin.read())
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    config["agent"].update(step_limit=int(os.environ.get("MSWEA_STEP_LIMIT", "4")), mode="yolo")
    base_url, api_key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    model_config = config.get("model", {})
    model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}), "api_base": base_url, "api_key": api_key}
    model = LitellmModel(model_name="openai/posttrain", cost_tracking="ignore_errors", **model_config)
    env = PosttrainSandbox(base_url, api_key, env=config.get("environment", {}).get("env"))
    agent = DefaultAgent(model, env, **config["agent"])
    result = agent.run(task["problem_statement"])
    print(json.dumps({"reward": 0.0, "exit_status": result.get("exit_status", "")}))


if __name__ == "__main__":
    main()
