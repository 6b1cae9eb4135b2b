"""A smolagents agent, written the library's ordinary way (its quick start's shape): a tool, a model
on an OpenAI-compatible server, ``agent.run(task)``. Only the model's ``api_base`` / ``api_key``
point at posttrain, read from the environment posttrain sets for a command agent.

    posttrain rl ... env.name=agent env.agent_cmd=".venv-agents/bin/python examples/agents/smolagents_add.py"

Task (JSON on stdin): {"prompt": ..., "a": int, "b": int}. Prints its reward as the last line:
1.0 when the final answer holds a + b."""

import json
import os
import sys

from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool


@tool
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def main() -> None:
    task = json.loads(sys.stdin.read())
    model = OpenAIServerModel(model_id="posttrain", api_base=os.environ["OPENAI_BASE_URL"],
                              api_key=os.environ["OPENAI_API_KEY"])
    # max_steps=2: two steps, then the agent asks the model for its final answer (three calls)
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=2, verbosity_level=LogLevel.OFF)
    answer = agent.run(task["prompt"])
    print(json.dumps({"reward": float(str(task["a"] + task["b"]) in str(answer))}))


if __name__ == "__main__":
    main()
