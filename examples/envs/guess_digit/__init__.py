"""Guess the digit, as a verifiers (v1) environment: a Taskset of typed tasks scored by a
``@vf.reward``, and a Harness whose chat loop calls the model through the endpoint verifiers
hands it, answering each wrong guess with higher / lower. Copy this package to start your own.

    bash scripts/setup.sh verifiers      # .venv-verifiers, where this package is imported
    PYTHONPATH=examples/envs posttrain rl examples/grpo_verifiers_guess.yaml

posttrain runs it in .venv-verifiers (``env.name: verifiers:guess_digit``); each model call of the
harness is one model turn of posttrain's engine, and the reward is read off the episode's trace.
A record of ``data.path`` is a task's data: ``{"prompt": "...", "secret": 3}``.
"""

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes import ProgramResult

DIGITS = [str(d) for d in range(10)]


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(self.data.secret))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):  # the taskset's own tasks, for records {"task_idx": i}
        return [GuessTask(GuessData(prompt="Guess a digit.", secret=(7 * i + 3) % 10), self.config.task)
                for i in range(8)]


class GuessHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False  # the chat loop runs in-process: no program to install
    EXECUTES_CODE = False
    MAX_GUESSES = 3

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        messages = [{"role": "user", "content": data.prompt + " Answer with one digit from 0 to 9."}]
        try:
            for _ in range(self.MAX_GUESSES):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
                text = reply.choices[0].message.content or ""
                # the reply goes back exactly as sampled: a history the harness rewrites no longer
                # matches the tokens trained on, and posttrain masks the episode (INFRA_FAIL)
                messages.append({"role": "assistant", "content": text})
                guess = text.strip()
                if guess == str(data.secret):
                    break
                feedback = ("higher" if int(guess) < data.secret else "lower") if guess in DIGITS else "not a digit"
                messages.append({"role": "user", "content": feedback})
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["GuessTaskset", "GuessHarness"]
