"""An OpenAI Agents SDK agent, written the library's ordinary way: an ``Agent`` with a
``function_tool``, run by ``Runner``, on a chat-completions model (``OpenAIChatCompletionsModel``,
the SDK's way to use a provider other than OpenAI). Only the client's ``base_url`` / ``api_key``
point at posttrain, read from the environment posttrain sets for a command agent.

    posttrain rl ... env.name=agent env.agent_cmd=".venv-agents/bin/python examples/agents/openai_agents_add.py"

Two runs of one conversation (the SDK's multi-turn way, ``result.to_input_list()``): the task,
then a request to check the answer with the tool. Task (JSON on stdin): {"prompt": ..., "a": int,
"b": int}. Prints its reward as the last line: 1.0 when the last answer holds a + b."""

import json
import os
import sys

from agents import (Agent, MaxTurnsExceeded, ModelBehaviorError, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def main() -> None:
    task = json.loads(sys.stdin.read())
    set_tracing_disabled(True)  # traces go to OpenAI's servers by default; this model is not there
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    agent = Agent(name="adder", instructions="Answer with the add tool's result.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="posttrain", openai_client=client))
    try:
        first = Runner.run_sync(agent, task["prompt"], max_turns=4)
        again = first.to_input_list() + [{"role": "user", "content": "Check it with the add tool."}]
        answer = Runner.run_sync(agent, again, max_turns=4).final_output
    except (MaxTurnsExceeded, ModelBehaviorError):  # the model's doing (endless or malformed calls): reward 0
        answer = ""
    print(json.dumps({"reward": float(str(task["a"] + task["b"]) in str(answer))}))


if __name__ == "__main__":
    main()
