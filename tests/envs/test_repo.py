"""The repository environment: tools on a per-episode working copy, hidden tests in the sandbox,
the audit (oracle passes, no-op and hacks do not), isolation between episodes, token-exact runs."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.envs.audit import audit_tasks, pass_rates
from posttrain.envs.base import EnvTaskError
from posttrain.envs.repo import RepoEnv, check_path, PathError
from posttrain.envs.repo_tasks import expected_report, sample_tasks, sft_record
from posttrain.envs.tools import format_call
from posttrain.outcome import OutcomeClass
from tests.envs.pools import start_pool


@pytest.fixture(scope="module")
def pool():
    p = start_pool(workers=1, timeout_s=5.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def tasks():
    return sample_tasks(6, split="train") + sample_tasks(4, split="eval")


def env_of(pool, task) -> RepoEnv:
    env = RepoEnv(pool=pool)
    env.reset(task)
    return env


def tool(env, name, **args):
    result = env.step(format_call(name, args))
    return result if result.done else result.observation[0]["content"]


# ------------------------------------------------------------------------------- embedded tasks
def test_embedded_tasks_pass_the_audit_oracle_everywhere_noop_and_hacks_nowhere(pool, tasks):
    played: list[int] = []
    rows = audit_tasks(tasks, lambda: RepoEnv(pool=pool), workers=2, progress=lambda: played.append(1))
    assert len(played) == len(tasks)  # the progress bar counts tasks, not their 8 policies
    rates = pass_rates(rows)
    assert rates.pop("oracle") == 1.0
    assert set(rates) == {"null", "delete_tests", "edit_tests", "sys_exit", "os_exit", "monkeypatch", "always_equal"}
    assert all(rate == 0.0 for rate in rates.values()), rates
    assert all(not row["flags"] for row in rows)
    # every failure is the model's: no sandbox fault or broken task hides behind a 0
    assert all(v.startswith(("PASS", "MODEL_FAIL")) for row in rows for v in row["runs"].values())


def test_train_and_held_out_tasks_never_share_a_task_and_each_bug_shows(tasks):
    train, held_out = {t["id"] for t in tasks[:6]}, {t["id"] for t in tasks[6:]}
    assert not train & held_out and len(train) == 6 and len(held_out) == 4
    for t in tasks:
        assert t["bug"]["old"] in t["files"]["pkg/ops.py"] and t["bug"]["new"] in t["fix"]["pkg/ops.py"]
        assert t["files"]["pkg/ops.py"].replace(t["bug"]["old"], t["bug"]["new"]) == t["fix"]["pkg/ops.py"]
        assert "1 failed" in expected_report(t)


def test_no_held_out_task_is_a_training_task_with_its_functions_in_another_order():
    def content(task):  # the module's functions, sorted: the task whatever order they are listed in
        return tuple(sorted(f.strip() for f in task["files"]["pkg/ops.py"].split("\n\n\n")))

    train = {content(t) for t in sample_tasks(2000, split="train")}  # make-env-data's default sizes
    assert [t["id"] for t in sample_tasks(200, split="eval") if content(t) in train] == []


def test_the_sandbox_report_is_the_one_the_traces_show(pool, tasks):
    for task in tasks[:4]:
        assert tool(env_of(pool, task), "run_tests") == expected_report(task)


# ------------------------------------------------------------------------------------ the tools
def test_tools_edit_only_this_episodes_copy(pool, tasks):
    task = tasks[0]
    before = json.dumps(task, sort_keys=True)
    env = env_of(pool, task)
    assert tool(env, "list_files") == "pkg/ops.py\ntests/test_ops.py"
    assert tool(env, "read_file", path="pkg/ops.py") == task["files"]["pkg/ops.py"]
    assert tool(env, "replace", path="pkg/ops.py", old=task["bug"]["old"], new=task["bug"]["new"]) == \
        "replaced 1 occurrence in pkg/ops.py"
    assert tool(env, "run_tests") == "2 passed, 0 failed"
    assert tool(env, "write_file", path="notes/a.txt", content="x") == "wrote notes/a.txt"
    assert tool(env, "delete_file", path="tests/test_ops.py") == "deleted tests/test_ops.py"
    assert tool(env, "list_files") == "notes/a.txt\npkg/ops.py"
    assert tool(env, "run_tests") == "no test files"
    assert json.dumps(task, sort_keys=True) == before  # the template is shared, never written
    fresh = env_of(pool, task)
    assert tool(fresh, "read_file", path="pkg/ops.py") == task["files"]["pkg/ops.py"]
    result = tool(env, "submit")
    assert result.done and result.outcome.cls is OutcomeClass.PASS and result.info["tool_calls"] == 1


@pytest.mark.parametrize("path", ["../x.py", "/etc/passwd", "pkg/../../x", "a//b", "", "x" * 201, "a/./b", "~/.ssh"])
def test_paths_outside_the_tree_are_the_models_error(pool, tasks, path):
    with pytest.raises(PathError):
        check_path(path)
    env = env_of(pool, tasks[0])
    result = env.step(format_call("write_file", {"path": path, "content": "x"}))
    assert not result.done and result.info == {"tool_calls": 1, "tool_errors": 1}
    assert result.observation[0]["content"].startswith("error: PathError")
    assert tool(env, "list_files") == "pkg/ops.py\ntests/test_ops.py"


def test_replace_needs_exactly_one_occurrence_and_files_are_bounded(pool, tasks):
    env = env_of(pool, tasks[0])
    assert "occurs 0 times" in tool(env, "replace", path="pkg/ops.py", old="no such text", new="y")
    assert "occurs 2 times" in tool(env, "replace", path="pkg/ops.py", old="return", new="y")
    assert "at most" in tool(env, "write_file", path="big.py", content="x" * (64 * 1024 + 1))
    assert "no file 'nope.py'" in tool(env, "read_file", path="nope.py")


def test_calls_before_a_submit_run_first(pool, tasks):
    task = tasks[1]
    env = env_of(pool, task)
    text = format_call("replace", {"path": "pkg/ops.py", "old": task["bug"]["old"], "new": task["bug"]["new"]}) + \
        format_call("submit", {})
    result = env.step(text)
    assert result.done and result.outcome.cls is OutcomeClass.PASS and result.info["tool_calls"] == 2


def test_a_write_before_a_submit_runs_even_when_its_text_holds_the_closing_tag(pool, tasks):
    # JSON lets a model write "</" as "<\/", so the closing tag can sit inside an argument
    task = tasks[1]
    fixed = task["fix"]["pkg/ops.py"] + "# </tool_call>\n"
    text = format_call("write_file", {"path": "pkg/ops.py", "content": fixed}).replace(
        "# </tool_call>", "# <\\/tool_call>") + format_call("submit", {})
    result = env_of(pool, task).step(text)
    assert result.info == {"tool_calls": 2, "tool_errors": 0}
    assert result.outcome.cls is OutcomeClass.PASS


def test_broken_tasks_are_task_fail_not_the_models(pool, tasks):
    with pytest.raises(EnvTaskError, match="hidden_tests"):
        RepoEnv(pool=pool).reset({"files": {"a.py": ""}})
    with pytest.raises(EnvTaskError, match="files"):
        RepoEnv(pool=pool).reset({"files": {"../a.py": ""}, "hidden_tests": "def check(call): pass"})
    bad = dict(tasks[0], hidden_tests="def check(call):\n    assert call('pkg.ops.x') ==\n")
    result = tool(env_of(pool, bad), "submit")
    assert result.outcome.cls is OutcomeClass.TASK_FAIL and result.outcome.reason == "bad_test"


# ------------------------------------------------------------------------------------ isolation
PLANT = '''import os, subprocess, sys, time
open("/tmp/planted", "w").write("left behind")
os.environ["PLANTED"] = "1"
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
time.sleep(0.2)  # let it start
'''
PROBE = '''import os


def test_no_planted_file():
    assert not os.path.exists("/tmp/planted"), "planted file"
    assert not os.path.exists("planted.txt"), "planted file in the copy"


def test_no_background_process():
    others = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"sleep(600)" in cmd:
            others.append(pid)
    assert not others, others


def test_no_planted_variable():
    assert "PLANTED" not in os.environ
'''


def test_what_an_episode_leaves_behind_never_reaches_the_next(pool, tasks):
    task = tasks[2]
    first = env_of(pool, task)
    tool(first, "write_file", path="planted.txt", content="x")
    tool(first, "write_file", path="conftest.py", content=PLANT)
    tool(first, "write_file", path="tests/test_ops.py", content="import conftest\n\n\ndef test_ok():\n    assert True\n")
    assert tool(first, "run_tests") == "1 passed, 0 failed"  # the planting ran
    # the same sandbox, while the first episode's leftovers would still be there
    second = env_of(pool, task)
    assert "planted.txt" not in tool(second, "list_files")
    assert tool(second, "run_tests") == expected_report(task)  # the visible tests are the task's own again
    tool(second, "write_file", path="tests/test_probe.py", content=PROBE)
    report = tool(second, "run_tests")
    assert "test_probe" not in report and report.endswith("4 passed, 1 failed"), report  # one fails: the bug
    null = tool(env_of(pool, task), "submit")
    assert null.outcome.cls is OutcomeClass.MODEL_FAIL  # the planted always-pass never scores
    assert tool(first, "submit").outcome.cls is OutcomeClass.MODEL_FAIL


def test_the_probe_sees_what_a_single_program_plants(pool, tasks):
    """The probe is not blind: inside one program, the file, process and variable are seen."""
    env = env_of(pool, tasks[2])
    tool(env, "write_file", path="conftest.py", content=PLANT)
    tool(env, "write_file", path="tests/test_probe.py", content="import conftest\n" + PROBE)
    report = tool(env, "run_tests")
    for name in ("test_no_planted_file", "test_no_background_process", "test_no_planted_variable"):
        assert f"FAIL tests/test_probe.py::{name}" in report, report


# ------------------------------------------------------------------------------------ the audit
def test_the_audit_flags_weak_hidden_tests_and_a_broken_fix(pool, tasks, tmp_path, capsys):
    weak = dict(tasks[0], id="weak", hidden_tests="def check(call):\n    assert call('pkg.ops.zero') == 0\n",
                fix={"pkg/ops.py": "def zero():\n    return 0\n"}, files={"pkg/ops.py": "def zero():\n    return 0\n"})
    broken = dict(tasks[1], id="broken", fix={"pkg/ops.py": tasks[1]["files"]["pkg/ops.py"]})
    gameable = dict(tasks[3], id="gameable", hidden_tests="import os\n\ndef check(call):\n"
                    "    assert not os.path.exists('/tmp/work/tests/test_ops.py') or call('pkg.ops.x')\n",
                    fix={"pkg/ops.py": "def x():\n    return 1\n"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (tasks[4], weak, broken, gameable)))
    assert main(["env-audit", str(path), "--out", str(tmp_path / "audit"), "--workers", "1"]) == 1
    assert any(line.startswith("audit ") and " 4/4 " in line for line in capsys.readouterr().out.splitlines())
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "audit" / "audit.jsonl").read_text().splitlines())}
    assert rows[tasks[4]["id"]]["flags"] == []
    assert "false_positive" in rows["weak"]["flags"] and rows["weak"]["runs"]["null"] == "PASS"
    assert rows["broken"]["flags"] == ["false_negative"]
    clean = [json.loads(line)["id"] for line in (tmp_path / "audit" / "clean.jsonl").read_text().splitlines()]
    assert clean == [tasks[4]["id"]]
    # hidden tests that look at the working copy's visible tests can be gamed by deleting them
    assert rows["gameable"]["runs"]["delete_tests"] == "PASS" and "false_positive" in rows["gameable"]["flags"]


def test_env_audit_names_the_file_and_line_of_a_bad_task(tmp_path, capsys):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"files": {"a.py": ""}, "hidden_tests": "def check(call): pass"}) + "\n"
                    + json.dumps({"files": {"a.py": ""}}) + "\n")
    assert main(["env-audit", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"{path}:2: the task needs 'hidden_tests'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- through the runner
def test_the_good_episode_is_token_exact_and_passes(pool, tasks, nano_tokenizer, monkeypatch):
    from posttrain.envs.runner import EpisodeLimits, run_episodes
    from posttrain.envs.trajectory import episode_metrics
    from posttrain.rollout.types import SamplingParams
    from tests.envs.conftest import ScriptedEngine

    task = tasks[0]
    record = sft_record(task, RepoEnv().tools, "none")
    turns = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    engine = ScriptedEngine(nano_tokenizer, lambda prompt, i: turns[prompt.count("<|im_start|>assistant")-1])
    make = lambda: RepoEnv(pool=pool, tools_style="none")  # noqa: E731
    [episode] = run_episodes(engine, nano_tokenizer, make, [task], 1, SamplingParams(max_new_tokens=200),
                             EpisodeLimits(max_turns=8, max_total_tokens=4096))
    assert episode.outcome.cls is OutcomeClass.PASS and episode.turns == 4 and episode.tool_calls == 4
    # the tool messages the environment answered are the ones the SFT trace teaches
    assert [m for m in episode.messages if m["role"] == "tool"] == [m for m in record["messages"] if m["role"] == "tool"]
    [seg] = episode.segments
    rendered = nano_tokenizer.apply_chat_template(record["messages"][:-1], tokenize=False, add_generation_prompt=True)
    assert nano_tokenizer.decode(seg.prompt_ids + seg.completion_ids).startswith(rendered)
    model = [t for t, m in zip(seg.completion_ids, seg.loss_mask) if m]
    assert nano_tokenizer.decode(model).count("<tool_call>") == 4
    metrics = episode_metrics([episode])
    assert metrics["env/tool_calls_mean"] == 4 and 0 < metrics["time/env_reset_ms_mean"] < 1000


def test_a_trace_that_misses_first_replays_through_the_environment_exactly_and_passes(pool, tasks, nano_tokenizer):
    import random

    from posttrain.envs.runner import EpisodeLimits, run_episodes
    from posttrain.rollout.types import SamplingParams
    from tests.envs.conftest import ScriptedEngine

    task = tasks[1]
    record = sft_record(task, RepoEnv().tools, "none", retry=random.Random(3))
    turns = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    assert [m.get("weight", 1) for m in record["messages"] if m["role"] == "assistant"] == [1, 1, 0, 1, 1]
    engine = ScriptedEngine(nano_tokenizer, lambda prompt, i: turns[prompt.count("<|im_start|>assistant")-1])
    [episode] = run_episodes(engine, nano_tokenizer, lambda: RepoEnv(pool=pool, tools_style="none"), [task], 1,
                             SamplingParams(max_new_tokens=200), EpisodeLimits(max_turns=8, max_total_tokens=4096))
    assert episode.outcome.cls is OutcomeClass.PASS and episode.tool_errors == 1
    # the error the trace shows after the miss is the environment's own
    assert [m for m in episode.messages if m["role"] == "tool"] == [m for m in record["messages"] if m["role"] == "tool"]


def test_a_trace_that_gives_up_submits_after_the_tests_and_fails_in_the_environment(pool, tasks, nano_tokenizer):
    from posttrain.envs.runner import EpisodeLimits, run_episodes
    from posttrain.rollout.types import SamplingParams
    from tests.envs.conftest import ScriptedEngine

    task = tasks[2]
    record = sft_record(task, RepoEnv().tools, "none", give_up=True)
    turns = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    assert turns == [format_call("run_tests", {}), format_call("submit", {})]
    assert record["messages"][:3] == sft_record(task, RepoEnv().tools, "none")["messages"][:3]
    engine = ScriptedEngine(nano_tokenizer, lambda prompt, i: turns[prompt.count("<|im_start|>assistant")-1])
    [episode] = run_episodes(engine, nano_tokenizer, lambda: RepoEnv(pool=pool, tools_style="none"), [task], 1,
                             SamplingParams(max_new_tokens=200), EpisodeLimits(max_turns=8, max_total_tokens=4096))
    # the model's failure, scored like any wrong answer (not the task's nor the infrastructure's)
    assert episode.outcome.cls is OutcomeClass.MODEL_FAIL and episode.tool_errors == 0


def test_every_miscopy_misses_and_the_fix_does_not(tasks):
    from posttrain.envs.repo_tasks import minimal_edit, miscopies

    for task in sample_tasks(200, split="train"):
        text, bug = task["files"]["pkg/ops.py"], task["bug"]
        old, new = minimal_edit(text, bug["old"], bug["new"])
        wrong = miscopies(text, old, new)
        assert wrong and text.count(old) == 1
        assert all(text.count(w) != 1 for w in wrong)


def test_make_env_data_writes_tasks_and_traces(tmp_path):
    assert main(["make-env-data", "repo", str(tmp_path), "--n-train", "5", "--n-eval", "3"]) == 0
    train = [json.loads(line) for line in (tmp_path / "prompts_train.jsonl").read_text().splitlines()]
    sft = [json.loads(line) for line in (tmp_path / "sft_train.jsonl").read_text().splitlines()]
    assert len(train) == 5 and len(sft) == 5 and len((tmp_path / "prompts_eval.jsonl").read_text().splitlines()) == 3
    assert all({"files", "hidden_tests", "fix", "id"} <= set(t) for t in train)
    assert all(s["messages"][-1]["content"] == format_call("submit", {}) for s in sft)
    assert not any("weight" in m for s in sft for m in s["messages"])


def test_make_env_data_retry_frac_writes_missed_calls_the_sft_loader_keeps_out_of_the_loss(tmp_path):
    from posttrain.data.records import load_sft_examples

    assert main(["make-env-data", "repo", str(tmp_path), "--n-train", "200", "--n-eval", "1", "--retry-frac", "0.3"]) == 0
    examples = load_sft_examples(tmp_path / "sft_train.jsonl")
    missed = [ex for ex in examples if any(m.get("weight") == 0 for m in ex.messages)]
    assert 40 <= len(missed) <= 80  # about 30% of 200
    assert all(len(ex.messages) == (len(examples[0].messages) + 2 if ex in missed else len(examples[0].messages))
               for ex in examples if ex.messages[0]["role"] == examples[0].messages[0]["role"])
    assert main(["make-env-data", "repo", str(tmp_path), "--retry-frac", "1.5"]) == 2


def test_make_env_data_give_up_frac_writes_traces_that_submit_unfixed(tmp_path):
    assert main(["make-env-data", "repo", str(tmp_path), "--n-train", "200", "--n-eval", "1", "--give-up-frac", "0.4"]) == 0
    sft = [json.loads(line) for line in (tmp_path / "sft_train.jsonl").read_text().splitlines()]
    calls = [[m["content"] for m in s["messages"] if m["role"] == "assistant"] for s in sft]
    quit_early = [c for c in calls if len(c) == 2]
    assert 60 <= len(quit_early) <= 100  # about 40% of 200
    assert all(c[-1] == format_call("submit", {}) and len(c) in (2, 4) for c in calls)
    assert main(["make-env-data", "repo", str(tmp_path), "--give-up-frac", "-0.1"]) == 2


def test_the_task_in_the_docs_passes_the_audit(pool, tmp_path):
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "envs.md").read_text()
    block = re.search(r"```json\n(.*?)```", docs[docs.index("Your own tasks"):], re.S).group(1)
    rows = audit_tasks([json.loads(block)], lambda: RepoEnv(pool=pool), workers=2)
    assert rows[0]["flags"] == [] and rows[0]["runs"]["oracle"] == "PASS" and len(rows[0]["runs"]) == 8


def test_rl_runs_in_the_repo_environment_and_the_report_shows_its_episodes(nano_model_dir, tmp_path):
    assert main(["make-env-data", "repo", str(tmp_path / "data"), "--n-train", "8", "--n-eval", "2",
                 "--tools-style", "none"]) == 0
    run = tmp_path / "run"
    assert main(["rl", "algorithm=grpo", f"model.path={nano_model_dir}", f"data.path={tmp_path / 'data' / 'prompts_train.jsonl'}",
                 "num_steps=2", "eval_every=0", "save_every=0", "prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "env={name: repo, tools_style: none, max_turns: 2, max_total_tokens: 256}",
                 "logging.progress=false", f"out_dir={run}"]) == 0
    row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line][-1]
    assert row["env/turns_mean"] >= 1 and row["outcomes/INFRA_FAIL_frac"] == 0.0 and row["time/env_reset_ms_mean"] > 0
    from posttrain.eval.report import ENV_PANEL, find_runs, series_for

    assert set(series_for(ENV_PANEL, find_runs([run]))) == {"env/turns_mean", "env/tool_calls_mean",
                                                            "env/tool_error_frac", "time/env_reset_ms_mean"}
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    assert "<h3>Episodes</h3>" in (tmp_path / "report.html").read_text()


def test_a_subclass_offers_its_own_tools():
    class Counting(RepoEnv):
        TOOL_NAMES = RepoEnv.TOOL_NAMES + ("count_files",)

        def count_files(self) -> str:
            """Count the project's files."""
            return str(len(self.files()))

    assert "count_files" not in RepoEnv().by_name and "submit" in RepoEnv().by_name
    assert set(Counting().by_name) == set(RepoEnv.TOOL_NAMES) | {"count_files"}
    assert "count_files" not in RepoEnv().by_name  # the base class's schemas were not replaced
