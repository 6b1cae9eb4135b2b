"""`ToolEnv`: an environment where the model calls tools until it gives a final answer.

Each model turn either calls tools (one or more ``<tool_call>`` blocks, `posttrain.envs.tools`)
— the runner then shows their results as tool messages and the model goes on — or makes no call,
which is the final answer, judged by `judge`. Subclasses give the tools, the opening messages
and the judge:

    class Weather(ToolEnv):
        def __init__(self, **kw):
            super().__init__([Tool.from_function(forecast)], **kw)
        def prompt(self, example):
            return [{"role": "user", "content": example["prompt"]}]
        def judge(self, text):
            return Outcome.passed() if example_answer in text else Outcome.model_fail("wrong_answer")

Faults (``on_malformed``): a malformed call is the model's fault. With ``continue`` the error is
shown to it as a tool message and the episode goes on (counted in ``tool_errors``); with ``end``
the episode ends as MODEL_FAIL("malformed_tool_call"). A tool that raises shows the error text
to the model (counted) unless it raises `EnvInfraError` / `EnvTaskError`, which end the episode
as INFRA_FAIL / TASK_FAIL.
"""

from __future__ import annotations

from posttrain.envs.base import EnvInfraError, Environment, EnvTaskError, StepResult
from posttrain.envs.tools import MalformedCall, Tool, ToolCall, parse_tool_calls
from posttrain.outcome import Outcome

MALFORMED_POLICIES = ("continue", "end")


class ToolEnv(Environment):
    def __init__(self, tools: list[Tool], *, tools_style: str = "json", on_malformed: str = "continue",
                 max_turns: int | None = None):
        if on_malformed not in MALFORMED_POLICIES:
            raise ValueError(f"on_malformed must be one of {MALFORMED_POLICIES}, got {on_malformed!r}")
        self.tools = list(tools)
        self.by_name = {t.name: t for t in self.tools}
        self.tools_style, self.on_malformed = tools_style, on_malformed
        self.max_turns = max_turns
        self.example: dict = {}

    def prompt(self, example: dict) -> list[dict]:
        """The opening messages (the tools are offered by the runner)."""
        return [{"role": "user", "content": example["prompt"]}]

    def judge(self, text: str) -> Outcome:
        """The verdict on a final answer (a turn with no tool call)."""
        raise NotImplementedError

    def reset(self, example: dict) -> list[dict]:
        self.example = example
        return self.prompt(example)

    def step(self, text: str) -> StepResult:
        try:
            calls = parse_tool_calls(text, self.by_name)
        except MalformedCall as e:
            counts = {"tool_calls": 1, "tool_errors": 1}
            if self.on_malformed == "end":
                return StepResult(done=True, outcome=Outcome.model_fail("malformed_tool_call", detail=str(e)), info=counts)
            return StepResult(observation=[{"role": "tool", "content": f"error: {e}"}], info=counts)
        if not calls:
            outcome = self.judge(text)
            return StepResult(reward=outcome.reward, done=True, outcome=outcome)
        return self.run_calls(calls)

    def run_calls(self, calls: list[ToolCall]) -> StepResult:
        """The parsed ``calls`` run in order, their results as tool messages (never re-parsed from
        text: an argument may hold ``</tool_call>`` once decoded)."""
        results, errors = [], 0
        for call in calls:
            try:
                value = self.by_name[call.name].fn(**call.arguments)
            except (EnvInfraError, EnvTaskError):
                raise
            except Exception as e:  # the model's arguments made the tool fail: show it the error
                errors += 1
                value = f"error: {type(e).__name__}: {e}"
            results.append({"role": "tool", "name": call.name, "content": str(value)})
        return StepResult(observation=results, info={"tool_calls": len(calls), "tool_errors": errors})
