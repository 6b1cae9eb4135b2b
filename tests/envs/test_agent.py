"""``env.name=agent``: a user's agent, written with the official openai client, trained unchanged
through its per-episode endpoint: token-exact rows, new rows where it rewrites its history, every
failure class named, the door, and `posttrain rl` end to end."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import httpx
import pytest
import torch

from posttrain.cli import main
from posttrain.envs.agent import AgentEnv
from posttrain.envs.proxy import endpoint
from posttrain.envs.runner import EpisodeLimits, run_episodes
from posttrain.envs.trajectory import agent_metrics, episodes_to_rollouts
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams, TorchEngine
from tests.envs.agents import COMMAND
from tests.envs.conftest import ScriptedEngine, rl_then_eval
from tests.envs.test_runner import Recorder

AGENTS = "tests.envs.agents"
TASK = {"prompt": "Add 2 and 3.", "a": 2, "b": 3}
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def play(engine, tokenizer, examples, n=1, limits=None, sampling=None, **options):
    return run_episodes(engine, tokenizer, lambda: AgentEnv(**options), examples, n,
                        sampling or SamplingParams(max_new_tokens=40),
                        limits or EpisodeLimits(max_turns=4, max_total_tokens=2048))


def spans(mask: list[int]) -> list[tuple[int, int]]:
    """The maximal runs of 1 in ``mask``: the model's turns in a row."""
    out, k = [], 0
    while k < len(mask):
        if not mask[k]:
            k += 1
            continue
        j = k
        while j < len(mask) and mask[j]:
            j += 1
        out.append((k, j))
        k = j
    return out


def assert_rows_are_what_was_sampled(ro, engine: Recorder) -> int:
    """Each model turn of each row is one engine call: the row up to it is that call's prompt, its
    ids and log-probs are the call's. Returns the number of turns checked."""
    checked = 0
    for r in range(len(ro.completion_ids)):
        ids, full = ro.completion_ids[r], ro.prompt_ids[r] + ro.completion_ids[r]
        for a, b in spans(ro.loss_mask[r]):
            prompt = full[: len(ro.prompt_ids[r]) + a]
            sampled = [(c, lp) for (p, c), lp in zip(engine.calls, engine.logprobs) if p == prompt]
            assert (ids[a:b], ro.logprobs[r][a:b]) in sampled  # one of the samples drawn for that prompt
            checked += 1
    return checked


# ------------------------------------------------------------------------------ token-exact rows
def test_an_openai_client_tool_loop_is_one_row_with_the_tool_results_masked(nano_tokenizer):
    def script(prompt, i):  # a tool call, then the sum once the tool's answer is in the prompt
        return "5" if "<|im_start|>tool\n5<|im_end|>" in prompt else CALL

    engine = Recorder(ScriptedEngine(nano_tokenizer, script))
    (ep,) = play(engine, nano_tokenizer, [TASK], agent=f"{AGENTS}:tool_loop")
    assert ep.outcome.cls is OutcomeClass.PASS, ep.outcome  # the agent got tool_calls, ran add, saw "5"
    assert ep.turns == 3 and len(ep.segments) == 1 and ep.prefix_breaks == 0
    ro, _ = episodes_to_rollouts([ep], SamplingParams())
    assert assert_rows_are_what_was_sampled(ro, engine) == 3
    masked = nano_tokenizer.decode([t for t, m in zip(ro.completion_ids[0], ro.loss_mask[0]) if not m])
    assert "<|im_start|>tool\n5<|im_end|>" in masked and "Use the tool." in masked  # the agent's messages, masked
    assert agent_metrics([ep]) == {"agent/calls": 3.0, "agent/rows": 1.0, "agent/tokens": float(len(ep.segments[0])),
                                   "agent/rerender_breaks": 0}


def test_rows_from_the_engine_are_its_sampled_ids_and_logprobs_and_the_trainer_agrees(nano_model_dir, nano_tokenizer):
    from transformers import AutoModelForCausalLM

    engine = Recorder(TorchEngine(str(nano_model_dir), tokenizer=nano_tokenizer))
    episodes = play(engine, nano_tokenizer, [TASK, {**TASK, "prompt": "Add 4 and 1.", "a": 4, "b": 1}], n=2,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=6, seed=1), agent=f"{AGENTS}:tool_loop")
    assert all(e.outcome.is_reward and e.turns == 3 for e in episodes), [e.outcome for e in episodes]
    ro, _ = episodes_to_rollouts(episodes, SamplingParams(temperature=1.0))
    assert assert_rows_are_what_was_sampled(ro, engine) == 12
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir, torch_dtype=torch.float32).eval()
    for r in range(len(ro.completion_ids)):
        full, p = ro.prompt_ids[r] + ro.completion_ids[r], len(ro.prompt_ids[r])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
        trainer = [logp[p + k - 1, t].item() for k, t in enumerate(ro.completion_ids[r])]
        diffs = [abs(a - b) for a, b, m in zip(trainer, ro.logprobs[r], ro.loss_mask[r]) if m]
        assert max(diffs) < 1e-4, max(diffs)


def test_an_agent_that_rewrites_its_history_gets_a_new_row_counted_and_aligned(nano_tokenizer):
    engine = Recorder(ScriptedEngine(nano_tokenizer, lambda prompt, i: f"reply {prompt.count('<|im_start|>')}"))
    (ep,) = play(engine, nano_tokenizer, [TASK], agent=f"{AGENTS}:rewriting")
    assert ep.turns == 4 and len(ep.segments) == 2 and ep.prefix_breaks == 1
    ro, rows = episodes_to_rollouts([ep], SamplingParams())
    assert rows == [0, 0] and assert_rows_are_what_was_sampled(ro, engine) == 4
    second = nano_tokenizer.decode(ro.prompt_ids[1])
    assert "Summary: the user asked twice." in second and TASK["prompt"] not in second
    assert [len(spans(m)) for m in ro.loss_mask] == [2, 2]
    assert agent_metrics([ep])["agent/rerender_breaks"] == 1 and agent_metrics([ep])["agent/rows"] == 2.0


@pytest.mark.parametrize("agent, refused, turns", [("parallel", 0.0, 2), ("parallel_no_retry", 1.0, 1)])
def test_two_calls_in_flight_get_a_row_each_or_a_409_never_mixed(nano_tokenizer, agent, refused, turns):
    def script(prompt, i):  # the first answer takes a while: the second call surely arrives meanwhile
        time.sleep(0.5 if prompt.count("(") == 1 and not sleeps else 0.0)
        sleeps.append(1)
        return "ok"

    sleeps: list = []
    engine = Recorder(ScriptedEngine(nano_tokenizer, script))
    (ep,) = play(engine, nano_tokenizer, [TASK], agent=f"{AGENTS}:{agent}")
    assert ep.outcome.is_reward and ep.scores == {"refused": refused}, (ep.outcome, ep.scores)
    assert ep.turns == turns and len(ep.segments) == turns  # each answered call is a row of its own
    ro, _ = episodes_to_rollouts([ep], SamplingParams())
    assert assert_rows_are_what_was_sampled(ro, engine) == turns
    prompts = [nano_tokenizer.decode(p) for p in ro.prompt_ids]
    assert all(p.count("Add 2 and 3. (") == 1 for p in prompts)  # each row holds one call's messages only


def test_a_rewrite_where_rows_are_not_split_is_infra_fail_history_rewritten(nano_tokenizer, scripted):
    limits = EpisodeLimits(max_turns=4, max_total_tokens=2048, split_on_prefix_break=False)
    (ep,) = play(scripted(lambda prompt, i: "ok"), nano_tokenizer, [TASK], limits=limits, agent=f"{AGENTS}:rewriting")
    assert (ep.outcome.cls, ep.outcome.reason) == (OutcomeClass.INFRA_FAIL, "history_rewritten")


def test_many_agents_connecting_at_once_all_reach_the_endpoint(nano_tokenizer, scripted):
    """A step's agents all start, and connect, at the same moment."""
    episodes = play(scripted(lambda prompt, i: "5"), nano_tokenizer, [TASK] * 4, n=16, agent=f"{AGENTS}:tool_loop")
    assert [e.outcome.cls for e in episodes] == [OutcomeClass.PASS] * 64, {e.outcome.detail for e in episodes}


# ---------------------------------------------------------------------------------- outcomes
@pytest.mark.parametrize("agent, options, cls, reason", [
    ("raises_first", {}, "INFRA_FAIL", "agent_error"),
    ("never_calls", {}, "INFRA_FAIL", "no_model_call"),
    ("hangs", {"timeout_s": 1}, "INFRA_FAIL", "agent_timeout"),
    ("raises_after_a_call", {}, "INFRA_FAIL", "agent_error"),
    ("says_yes", {}, "INFRA_FAIL", "bad_reward"),
    ("calls_forever", {"max_calls": 2}, "MODEL_FAIL", "max_turns"),
    ("streaming", {}, "MODEL_FAIL", "format"),
])
def test_each_way_an_agent_ends_has_its_named_outcome(nano_tokenizer, scripted, agent, options, cls, reason):
    t0 = time.monotonic()
    episodes = play(scripted(lambda prompt, i: "hello"), nano_tokenizer, [TASK], n=2, agent=f"{AGENTS}:{agent}",
                    limits=EpisodeLimits(max_turns=8, max_total_tokens=2048), **options)
    assert time.monotonic() - t0 < 20  # a hanging agent is cut at its deadline, not waited for
    assert [(e.outcome.cls.value, e.outcome.reason) for e in episodes] == [(cls, reason)] * 2, \
        [e.outcome for e in episodes]
    if agent == "streaming":  # its dict: the reward, its reason and its scores
        assert episodes[0].outcome.reward == 0.25 and episodes[0].scores == {"letters": 5.0}


@pytest.fixture
def command(tmp_path):
    path = tmp_path / "agent.py"
    path.write_text(COMMAND)
    return f"{sys.executable} {path}"


def test_a_command_agent_gets_its_url_and_key_and_its_reward_is_its_last_line(nano_tokenizer, scripted, command):
    (ep,) = play(scripted(lambda prompt, i: "hi"), nano_tokenizer, [TASK], agent_cmd=command)
    assert ep.outcome.cls is OutcomeClass.PASS and ep.turns == 2, ep.outcome


def test_a_command_that_fails_or_hangs_is_infra_fail_and_a_hanging_one_is_killed(nano_tokenizer, scripted, command,
                                                                                tmp_path):
    pidfile = tmp_path / "pid"
    episodes = play(scripted(lambda prompt, i: "hi"), nano_tokenizer, [{**TASK, "exit": 3}, {**TASK, "hang": str(pidfile)}],
                    agent_cmd=command, timeout_s=5)
    assert [(e.outcome.cls.value, e.outcome.reason) for e in episodes] == [("INFRA_FAIL", "agent_exit"),
                                                                          ("INFRA_FAIL", "agent_timeout")]
    assert "exit status 3" in episodes[0].outcome.detail and "a crash of its own" in episodes[0].outcome.detail
    pid = int(pidfile.read_text())
    for _ in range(50):  # the process group was killed at the deadline
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hanging agent {pid} is still running")


# ---------------------------------------------------------------------------------- the door
def post(path: str, key: str | None = None, **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(endpoint().url + path, headers=headers, timeout=10, **kw)


def test_the_door_keys_paths_sizes_and_counts():
    e = endpoint()
    assert e.server.server_address[0] == "127.0.0.1"  # loopback by default
    a, chan_a = e.open(key="key-a", max_calls=1, max_request_bytes=2000)
    b, _ = e.open(key="key-b")
    route = "/ep/{}/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert post(route.format(a), "key-b", json=body).status_code == 401  # another episode's key
    assert post(route.format(a), json=body).status_code == 401  # no key
    assert post(route.format(a[:-1] + "0" if a[-1] != "0" else a[:-1] + "1"), "key-a", json=body).status_code == 404
    assert post(route.format(a), "key-a", content=b"x" * 2001).status_code == 413
    got = {}
    first = threading.Thread(target=lambda: got.update(r=post(route.format(a), "key-a", json=body)))
    first.start()
    kind, pending = chan_a.events.get(timeout=10)
    assert kind == "request" and pending.body["messages"] == body["messages"]
    assert post(route.format(a), "key-a", json=body).status_code == 409  # one at a time
    pending.reply("hello")
    first.join(10)
    assert got["r"].status_code == 200 and got["r"].json()["choices"][0]["message"]["content"] == "hello"
    assert post(route.format(a), "key-a", json=body).status_code == 429  # max_calls=1
    assert chan_a.events.get(timeout=1)[0] == "limit"  # the episode learns it ran out of calls
    for path in ("/v1/load_weights", f"/ep/{a}/v1/load_weights", f"/ep/{a}/v1/weights", "/v1/chat/completions",
                 f"/ep/{a}/v1/../../v1/models", "/health", f"/ep/{a}/v1/chat/completions/x",
                 f"/ep/{a}/v1/exec"):  # no commands: this episode has no sandbox
        assert post(path, "key-a", json={}).status_code == 404, path
        assert httpx.get(e.url + path, headers={"authorization": "Bearer key-a"}, timeout=10).status_code == 404, path
    assert httpx.get(e.url + f"/ep/{b}/v1/models", headers={"authorization": "Bearer key-a"}).status_code == 401
    e.close(a)
    assert post(route.format(a), "key-a", json=body).status_code == 404  # a closed episode's door is gone
    e.close(b)


def test_the_exec_route_runs_only_for_an_episode_with_a_sandbox_and_its_key():
    e = endpoint()
    a, chan_a = e.open(key="key-a")
    ran = []
    chan_a.executor = lambda body: ran.append(body["command"]) or {"output": "ok", "returncode": 0}
    route = f"/ep/{a}/v1/exec"
    assert post(route, "key-b", json={"command": "ls"}).status_code == 401 and ran == []
    assert post(route, json={"command": "ls"}).status_code == 401 and ran == []
    reply = post(route, "key-a", json={"command": "ls"})
    assert reply.status_code == 200 and reply.json() == {"output": "ok", "returncode": 0} and ran == ["ls"]
    assert post(route, "key-a", content=b"{").status_code == 400
    e.close(a)
    assert post(route, "key-a", json={"command": "ls"}).status_code == 404 and ran == ["ls"]


def test_the_exec_route_runs_no_more_commands_than_the_call_bound():
    e = endpoint()
    a, chan = e.open(key="k", max_calls=2)
    ran = []
    chan.executor = lambda body: ran.append(body["command"]) or {"output": "", "returncode": 0}
    codes = [post(f"/ep/{a}/v1/exec", "k", json={"command": f"echo {i}"}).status_code for i in range(3)]
    assert codes == [200, 200, 429] and ran == ["echo 0", "echo 1"]


def test_an_unknown_verdict_is_refused():
    with pytest.raises(ValueError, match="verdict"):
        AgentEnv(agent=f"{AGENTS}:tool_loop", verdict="tests")


# -------------------------------------------------------------------------------- posttrain rl
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_posttrain_rl_trains_an_agent(nano_model_dir, tmp_path, mode):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Add {a} and {b}.", "a": a, "b": b}) + "\n"
                            for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))))
    extra = ["mode=async", "max_staleness=1", "asynchrony.self_test=false"] if mode == "async" else []
    assert main(["rl", "algorithm=grpo", f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=2",
                 "save_every=0", "eval_every=0", "prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=4", "env.name=agent", f"env.agent={AGENTS}:tool_loop",
                 "env.max_total_tokens=400", "logging.progress=false", f"out_dir={tmp_path / 'run'}", *extra]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 4 episodes a step; a turn the untrained model ends with <|endoftext|>, which the template
        # does not write there, re-renders differently and starts a row of its own: rows and breaks agree
        assert r["agent/calls"] == 3.0 and r["agent/rows"] == 1.0 + r["agent/rerender_breaks"] / 4
        assert r["outcomes/INFRA_FAIL_frac"] == 0.0 and r["mismatch/logprob_abs_diff_max"] < 1e-4


def test_held_out_eval_and_posttrain_eval_run_an_agent(nano_model_dir, tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Add {a} and 1.", "a": a, "b": 1}) + "\n" for a in range(4)))
    env = "{name: agent, agent: '" + AGENTS + ":tool_loop', max_total_tokens: 400}"
    last, result = rl_then_eval(nano_model_dir, data, env, tmp_path)
    assert last["eval/heldout/greedy/agent/calls"] == 3.0 and "eval/heldout/greedy/pass@1" in last
    assert result["num_problems"] == 4 and result["env"]["env/turns_mean"] == 3.0


@pytest.mark.parametrize("override, needle", [
    ([], "env.agent"),
    (["env.agent=nosuch_module:run"], "nosuch_module"),
    (["env.agent_cmd=/no/such/program"], "/no/such/program"),
])
def test_bad_agent_settings_are_one_line_and_exit_2(nano_model_dir, tmp_path, capsys, override, needle):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert main(["rl", f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=1", "env.name=agent",
                 *override, "logging.progress=false", f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
