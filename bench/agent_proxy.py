"""Episodes per second through the agent endpoint (``env.name=agent``) against the same episodes
through the built-in environment protocol (`posttrain.envs.base.Environment`), side by side.

Both sides run the same conversation: the task's prompt, then ``--calls`` model turns, each reply
followed by a user message "go on (k)"; the reward is whether the last reply holds a letter. The
built-in side is an `Environment` whose ``step`` returns that message; the agent side is a function
written with the official ``openai`` client that calls its episode's endpoint ``--calls`` times and
returns the reward (``agent``: an ``OpenAI`` client made per episode, as most agents do;
``agent_shared``: the same client built on one shared ``httpx.Client``). Same model (the embedded nano one, or ``--engine scripted``: a fixed reply, no
model at all, so the endpoint's own cost is all that differs), same tasks, same sampling seed: the
sides produce the same rows (checked), so the ratio is the endpoint's overhead. Each round runs
every side once; the ratio printed is the median of the rounds' ratios (the load of a shared
machine moves between rounds), with the time each side spent outside ``generate`` (the endpoint,
the client, the environment: what does not depend on the model's speed) and the process's CPU
seconds (its threads, the engine's included): on a busy machine the CPU ratio is the steadier figure.

    .venv/bin/python bench/agent_proxy.py [--episodes 32] [--group 4] [--calls 3] [--rounds 5] [--engine nano|scripted]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

from posttrain.envs.agent import AgentEnv
from posttrain.envs.base import Environment, StepResult
from posttrain.envs.runner import EpisodeLimits, EpisodeRunner
from posttrain.envs.trajectory import episodes_to_rollouts
from posttrain.rollout import SamplingParams
from posttrain.rollout.types import Rollouts

CALLS = 3


def reward_of(text: str) -> float:
    return float(any(c.isalpha() for c in text))


HTTP = httpx.Client(timeout=300)


def agent(task: dict, base_url: str, api_key: str, shared: bool = False) -> float:
    """The agent side: an ordinary openai-client loop (a client of its own per episode, or one
    built on a shared HTTP client: creating an ``OpenAI`` client loads the TLS certificates, about
    30 ms of CPU, even for a plain-HTTP endpoint)."""
    llm = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, **({"http_client": HTTP} if shared else {}))
    messages, text = [{"role": "user", "content": task["prompt"]}], ""
    for k in range(CALLS):
        text = llm.chat.completions.create(model="m", messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on ({k + 1})"}]
    return reward_of(text)


def agent_shared(task: dict, base_url: str, api_key: str) -> float:
    return agent(task, base_url, api_key, shared=True)


class Builtin(Environment):
    """The built-in side: the same conversation as an `Environment`."""

    def reset(self, example: dict) -> list[dict]:
        self.k = 0
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, text: str) -> StepResult:
        self.k += 1
        if self.k < CALLS:
            return StepResult(observation=[{"role": "user", "content": f"go on ({self.k})"}])
        return StepResult(reward=reward_of(text), done=True)


class Fixed:
    """An engine answering every prompt with the same few tokens (no model): the endpoint's cost alone."""

    version = 0

    def __init__(self, tokenizer):
        self.ids = tokenizer("ok, done", add_special_tokens=False)["input_ids"] + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts, n, sampling):
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        return Rollouts(prompt_idx=rows, prompt_ids=[list(prompts[i]) for i in rows], completion_ids=[self.ids] * len(rows),
                        logprobs=[[-0.5] * len(self.ids)] * len(rows), finish_reason=["eos"] * len(rows),
                        policy_version=[0] * len(rows), sampling=sampling,
                        truncated_logprobs=[[-0.5] * len(self.ids)] * len(rows))


class Timed:
    """The engine, its time in ``generate`` summed (to tell the endpoint's cost from the model's)."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, 0.0

    @property
    def version(self):
        return self.engine.version

    def generate(self, prompts, n, sampling):
        t0 = time.perf_counter()
        try:
            return self.engine.generate(prompts, n, sampling)
        finally:
            self.seconds += time.perf_counter() - t0


def run_side(make_env, engine, tokenizer, examples, group, sampling):
    """``(seconds, seconds in generate, CPU seconds of the process, episodes)`` of one round."""
    limits = EpisodeLimits(max_turns=CALLS + 1, max_total_tokens=4096, step_timeout_s=120)
    timed, t0, c0 = Timed(engine), time.perf_counter(), time.process_time()
    episodes = EpisodeRunner(timed, tokenizer, make_env, limits).run(examples, group, sampling)
    return time.perf_counter() - t0, timed.seconds, time.process_time() - c0, episodes


def main() -> None:
    global CALLS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per round and side (default 32)")
    ap.add_argument("--group", type=int, default=4, help="episodes per task, G (default 4)")
    ap.add_argument("--calls", type=int, default=3, help="model calls per episode (default 3)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each running every side once (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--engine", choices=("nano", "scripted"), default="nano")
    args = ap.parse_args()
    CALLS = args.calls

    from transformers import AutoTokenizer

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny
    from posttrain.rollout import TorchEngine

    quiet_transformers()
    model_dir = build_tiny(Path(tempfile.mkdtemp(prefix="agent-proxy-")), "nano", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = TorchEngine(str(model_dir), tokenizer=tokenizer) if args.engine == "nano" else Fixed(tokenizer)
    examples = [{"prompt": f"Task {i}: say something."} for i in range(args.episodes // args.group)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=7)
    sides = {"builtin": Builtin, "agent": lambda: AgentEnv(agent="__main__:agent", timeout_s=300),
             "agent_shared": lambda: AgentEnv(agent="__main__:agent_shared", timeout_s=300)}
    times: dict[str, list[float]] = {name: [] for name in sides}
    gen: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    run_side(sides["agent"], engine, tokenizer, examples[:1], 1, sampling)  # warm: the endpoint, the imports
    for _ in range(args.rounds):
        rows = {}
        for name, make in sides.items():
            seconds, generating, cpu_s, episodes = run_side(make, engine, tokenizer, examples, args.group, sampling)
            gen[name].append(generating)
            cpu[name].append(cpu_s)
            assert all(e.outcome.is_reward and e.turns == CALLS for e in episodes), [e.outcome for e in episodes]
            times[name].append(seconds)
            ro, _ = episodes_to_rollouts(episodes, sampling)
            rows[name] = (ro.prompt_ids, ro.completion_ids, ro.loss_mask, ro.logprobs)
        assert rows["agent"] == rows["builtin"] == rows["agent_shared"], "the sides did not produce the same rows"
    n = len(examples) * args.group
    print(f"engine={args.engine} episodes={n} calls/episode={CALLS} max_new_tokens={args.max_new_tokens} "
          f"rounds={args.rounds} (same rows on every side: checked)")
    for name, t in times.items():
        outside = [a - b for a, b in zip(t, gen[name])]
        print(f"  {name:13s} {n / statistics.median(t):8.1f} episodes/s   (median {statistics.median(t):.3f} s per "
              f"round, {statistics.median(outside):.3f} s of it outside generate; {statistics.median(cpu[name]):.3f} "
              f"CPU s)")
    for name in ("agent", "agent_shared"):  # paired by round: the load on a shared machine moves between rounds
        ratios = [b / a for a, b in zip(times[name], times["builtin"])]
        print(f"  {name} / builtin = {statistics.median(ratios):.2f}x episodes/s (median of the rounds' ratios; "
              f"min {min(ratios):.2f}, max {max(ratios):.2f}); CPU s per episode: "
              f"{statistics.median(cpu['builtin']) / statistics.median(cpu[name]):.2f}x")

if __name__ == "__main__":
    main()
