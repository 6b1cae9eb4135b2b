"""Agent libraries from PyPI, unchanged, trained through the agent endpoint: each example agent of
examples/agents/ runs as ``env.agent_cmd`` with ``.venv-agents``'s interpreter (the library lives
there; posttrain's environment does not import it). For each: its rows are the ids and log-probs
the engine sampled (and the trainer's log-probs on them agree), its tool loop runs through the
endpoint's ``tool_calls``, and ``posttrain rl`` trains it for two steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.envs.agent import AgentEnv
from posttrain.envs.runner import EpisodeLimits, run_episodes
from posttrain.envs.trajectory import episodes_to_rollouts
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams, TorchEngine
from tests.envs.test_agent import assert_rows_are_what_was_sampled, play, spans
from tests.envs.test_runner import Recorder

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-agents" / "bin" / "python"
EXAMPLES = ROOT / "examples" / "agents"
LIBS = {"smolagents": "smolagents_add.py", "openai-agents": "openai_agents_add.py"}
TOOL_RESULT = {"smolagents": "Observation:\n5", "openai-agents": "<|im_start|>tool\n5<|im_end|>"}
TASK = {"prompt": "Add 2 and 3 with the add tool.", "a": 2, "b": 3}

pytestmark = [pytest.mark.agents,
              pytest.mark.skipif(not PYTHON.exists(), reason="needs .venv-agents (bash scripts/setup.sh agents)")]


def command(lib: str) -> str:
    return f"{PYTHON} {EXAMPLES / LIBS[lib]}"


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def trainer_logprobs(model_dir, ro) -> float:
    """The largest |trainer - sampler| log-prob over the model's tokens of every row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    worst = 0.0
    for r in range(len(ro.completion_ids)):
        full, p = ro.prompt_ids[r] + ro.completion_ids[r], len(ro.prompt_ids[r])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
        for k, (t, lp, m) in enumerate(zip(ro.completion_ids[r], ro.logprobs[r], ro.loss_mask[r])):
            if m:
                worst = max(worst, abs(logp[p + k - 1, t].item() - lp))
    return worst


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_rows_are_what_the_engine_sampled_and_the_trainer_agrees(lib, nano_model_dir, nano_tokenizer):
    engine = Recorder(TorchEngine(str(nano_model_dir), tokenizer=nano_tokenizer))
    episodes = play(engine, nano_tokenizer, [TASK], n=1, agent_cmd=command(lib), timeout_s=120,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=1),
                    limits=EpisodeLimits(max_turns=8, max_total_tokens=4096))
    assert all(e.outcome.is_reward for e in episodes), [e.outcome for e in episodes]
    assert all(e.turns >= 2 for e in episodes), [e.turns for e in episodes]  # the library's loop called again
    ro, _ = episodes_to_rollouts(episodes, SamplingParams(temperature=1.0))
    assert assert_rows_are_what_was_sampled(ro, engine) == sum(e.turns for e in episodes)
    assert trainer_logprobs(nano_model_dir, ro) < 1e-4


def scripts():
    """Per library, a model that calls ``add`` first and answers 5 once the tool's 5 is in its prompt."""
    def smolagents(prompt, i):  # a ToolCallingAgent ends with its final_answer tool
        return call("final_answer", answer="5") if "5" in prompt.split("Add 2 and 3")[-1] else call("add", a=2, b=3)

    def openai_agents(prompt, i):
        return "5" if "<|im_start|>tool\n5<|im_end|>" in prompt else call("add", a=2, b=3)

    return {"smolagents": smolagents, "openai-agents": openai_agents}


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_the_librarys_tool_loop_runs_through_the_endpoint(lib, nano_tokenizer, scripted):
    engine = Recorder(scripted(scripts()[lib]))
    (ep,) = play(engine, nano_tokenizer, [TASK], agent_cmd=command(lib), timeout_s=120,
                 limits=EpisodeLimits(max_turns=8, max_total_tokens=4096))
    assert ep.outcome.cls is OutcomeClass.PASS, ep.outcome  # the library ran add and saw its 5
    ro, _ = episodes_to_rollouts([ep], SamplingParams())
    assert assert_rows_are_what_was_sampled(ro, engine) == ep.turns >= 2
    # the tool's result reached the model in the library's own message (masked, or in a new row's
    # prompt where the library re-rendered its history): the model's next turn conditioned on it
    seen = [nano_tokenizer.decode(ro.prompt_ids[r] + [t for t, m in zip(ro.completion_ids[r], ro.loss_mask[r]) if not m])
            for r in range(len(ro.loss_mask))]
    assert any(TOOL_RESULT[lib] in text for text in seen), seen
    assert len(ro.loss_mask) == 1 + ep.prefix_breaks and all(spans(m) for m in ro.loss_mask)
    print(lib, "turns", ep.turns, "rows", len(ro.loss_mask), "breaks", ep.prefix_breaks)


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_posttrain_rl_trains_the_librarys_agent(lib, nano_model_dir, tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Add {a} and {b} with the add tool.", "a": a, "b": b}) + "\n"
                            for a, b in ((1, 2), (3, 4))))
    assert main(["rl", "algorithm=grpo", f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=2",
                 "save_every=0", "eval_every=0", "prompts_per_step=1", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "env.name=agent", f"env.agent_cmd={command(lib)}",
                 "env.max_turns=8", "env.max_total_tokens=4096", "env.agent_timeout_s=120",
                 "logging.progress=false", f"out_dir={tmp_path / 'run'}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/calls"] >= 2 and r["outcomes/INFRA_FAIL_frac"] == 0.0, r
        assert r["mismatch/logprob_abs_diff_max"] < 1e-4


# ------------------------------------------------------------------ mini-swe-agent on a SWE task
MINI_SWE = f"{PYTHON} {EXAMPLES / 'mini_swe_agent_sandbox.py'}"


@pytest.fixture
def swe_record(tmp_path):
    from tests.envs.swe_project import make_record

    return make_record(tmp_path)


def bash(command: str) -> str:
    return call("bash", command=command)


def play_swe(engine, tokenizer, record, envs: list, sampling=None):
    def make():
        envs.append(AgentEnv(agent_cmd=MINI_SWE, verdict="swe", timeout_s=180))
        return envs[-1]

    return run_episodes(engine, tokenizer, make, [record], 1, sampling or SamplingParams(max_new_tokens=40),
                        EpisodeLimits(max_turns=6, max_total_tokens=8192))


def test_mini_swe_agents_commands_run_in_the_sandbox_on_the_episodes_tree(nano_tokenizer, scripted, swe_record):
    from tests.envs.swe_project import FIX

    fixed = FIX["src/calc/ops.py"]
    commands = [bash("echo made-here > made_by_agent.txt && cat made_by_agent.txt && ls /work 2>&1 | head -3"),
                bash(f"cat > src/calc/ops.py <<'PY'\n{fixed}PY"),
                bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]
    engine, envs = Recorder(scripted(lambda prompt, i: commands[min(prompt.count("<|im_start|>tool"), 2)])), []
    (ep,) = play_swe(engine, nano_tokenizer, swe_record, envs)
    # the hidden tests judged the tree the commands left: the fix makes them pass, while the
    # agent's own printed reward is 0
    assert ep.outcome.cls is OutcomeClass.PASS and ep.outcome.reward == 1.0, ep.outcome
    assert ep.turns == 3 and envs[0].sandbox.commands == 3
    changes = envs[0].sandbox.swe.changes
    assert changes["made_by_agent.txt"] == "made-here\n" and changes["src/calc/ops.py"] == fixed
    # the file exists only in the episode's tree: not in the task's repository, not where posttrain runs
    assert not (Path(swe_record["repo_path"]) / "made_by_agent.txt").exists() and not Path("made_by_agent.txt").exists()
    ro, _ = episodes_to_rollouts([ep], SamplingParams())
    assert assert_rows_are_what_was_sampled(ro, engine) == 3
    seen = "".join(nano_tokenizer.decode(p) for p in ro.prompt_ids) + nano_tokenizer.decode(
        [t for r in range(len(ro.loss_mask)) for t, m in zip(ro.completion_ids[r], ro.loss_mask[r]) if not m])
    assert "made-here" in seen  # the command's output came back to the model
    assert "No such file or directory" in seen  # the host's /work is not in the sandbox


def test_mini_swe_agent_unsolved_is_judged_by_the_hidden_tests(nano_tokenizer, scripted, swe_record):
    engine, envs = Recorder(scripted(lambda prompt, i: bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))), []
    (ep,) = play_swe(engine, nano_tokenizer, swe_record, envs)
    assert (ep.outcome.cls, ep.outcome.reason) == (OutcomeClass.MODEL_FAIL, "wrong_answer"), ep.outcome
    assert (ep.scores["fail_to_pass"], ep.scores["pass_to_pass"]) == (0.0, 1.0)  # the hidden tests' fractions


def test_mini_swe_agent_rows_are_what_the_engine_sampled(nano_model_dir, nano_tokenizer, swe_record):
    engine, envs = Recorder(TorchEngine(str(nano_model_dir), tokenizer=nano_tokenizer)), []
    (ep,) = play_swe(engine, nano_tokenizer, swe_record, envs,
                     sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    assert ep.outcome.is_reward and ep.turns >= 2, ep.outcome  # format errors: the agent asked again
    ro, _ = episodes_to_rollouts([ep], SamplingParams(temperature=1.0))
    assert assert_rows_are_what_was_sampled(ro, engine) == ep.turns
    assert trainer_logprobs(nano_model_dir, ro) < 1e-4


def test_posttrain_rl_trains_mini_swe_agent_on_swe_tasks(nano_model_dir, swe_record, tmp_path):
    data = tmp_path / "swe.jsonl"
    data.write_text(json.dumps(swe_record) + "\n" + json.dumps({**swe_record, "instance_id": "calc__calc-2"}) + "\n")
    assert main(["rl", "algorithm=grpo", f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=2",
                 "save_every=0", "eval_every=0", "prompts_per_step=1", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "env.name=agent", f"env.agent_cmd={MINI_SWE}", "env.options.verdict=swe",
                 "env.max_turns=6", "env.max_total_tokens=8192", "env.agent_timeout_s=180",
                 "logging.progress=false", f"out_dir={tmp_path / 'run'}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # every episode judged by the hidden tests: nothing masked, P2P kept passing
        assert row["agent/calls"] >= 2 and row["outcomes/INFRA_FAIL_frac"] == 0.0, row
        assert row["env/pass_to_pass_mean"] == 1.0 and row["mismatch/logprob_abs_diff_max"] < 1e-4
