"""Model paths: a model that is neither a local folder nor on the hub is one line naming the setting,
exit 2, nothing written, whether the hub answers, cannot be reached, or is switched off."""

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from posttrain.errors import UserError
from posttrain.models.hf import check_model_path, load_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MISSING = "runs/tiny-model"  # the examples' model before `posttrain make-tiny`: one "/", so maybe a hub id


class _NoSuchRepo(http.server.BaseHTTPRequestHandler):
    """Answers every file request as the hub does for a repository it does not have."""

    def _answer(self):
        self.send_response(401)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub_without_repo():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hub_env(hub: str, hf_home: Path) -> dict:
    """mode -> environment: the hub answers (without the repo), cannot be reached, or is off."""
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    base["HF_HOME"] = str(hf_home)  # a hub cache holding only what a case lays out in it
    return {"missing": {**base, "HF_ENDPOINT": hub},
            "unreachable": {**base, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"},
            "offline": {**base, "HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "1"}}


REASON = {"missing": "has no model runs/", "unreachable": "could not be reached",
          "offline": "HF_HUB_OFFLINE is set"}

# Runs each case's command in one process per hub mode, in the case's own fresh folder, with file
# descriptor 2 sent to a file of its own: the hub settings are read when huggingface_hub is
# imported, so a mode needs a process, but its cases can share it (a torch import each is seconds).
DRIVER = """
import json, os, sys, tempfile, traceback
from posttrain.cli import main
results = {}
for name, cwd, args in json.loads(sys.argv[1]):
    os.chdir(cwd)
    sys.stderr.flush()
    saved, log = os.dup(2), tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    os.dup2(saved, 2)
    log.seek(0)
    results[name] = {"returncode": code, "stderr": log.read().decode()}
print(json.dumps(results))
"""


def newcomer_folder(root: Path) -> Path:
    """A fresh folder with the examples and nothing built."""
    work = root / "work"
    shutil.copytree(EXAMPLES, work / "examples")
    return work


def _cases(nano_model_dir, arith_data_dir) -> dict[str, tuple[str, list]]:
    """case -> (hub mode, command line)."""
    rl_with_a_model = ["rl", "examples/grpo_arith.yaml", f"model.path={nano_model_dir}",
                       f"data.path={arith_data_dir / 'prompts_train.jsonl'}", "data.eval_path="]
    cases = {f"sft-{mode}": (mode, ["sft", "examples/sft_arith.yaml"]) for mode in REASON}
    for command, config, mode in TRAINING:
        cases[f"{command}-{mode}"] = (mode, [command, f"examples/{config}", f"model.path={MISSING}"])
    for mode in ("missing", "offline"):
        cases[f"eval-{mode}"] = (mode, ["eval", f"model={MISSING}", "out_dir=runs/eval", "--no-progress"])
    for setting, extra, mode in SECOND_MODELS:
        cases[setting] = (mode, [*rl_with_a_model, f"{setting}=acme/ref-model", *extra])
    cases["teacher.path"] = ("offline", ["distill", "examples/distill_arith.yaml", f"model.path={nano_model_dir}",
                                         "teacher.path=runs/teacher"])
    cases["cached-hub-id"] = ("offline", ["sft", "examples/sft_arith.yaml", "model.path=acme/nano"])
    return cases


TRAINING = [("rl", "grpo_arith.yaml", "missing"), ("dpo", "dpo_arith.yaml", "unreachable"),
            ("rm", "rm_arith.yaml", "offline"), ("distill", "distill_arith.yaml", "missing")]
SECOND_MODELS = [("kl.ref_path", [], "unreachable"), ("reward_model.path", ["algorithm=ppo"], "missing")]


@pytest.fixture(scope="module")
def runs(hub_without_repo, nano_model_dir, arith_data_dir, tmp_path_factory):
    """case -> {"returncode", "stderr", "work": the folder it ran in}."""
    root = tmp_path_factory.mktemp("hub-cases")
    envs = _hub_env(hub_without_repo, root / "hf-home")
    _cache_as_hub_model(nano_model_dir, root / "hf-home", "acme/nano")
    cases, out = _cases(nano_model_dir, arith_data_dir), {}
    for mode in REASON:
        mine = [(name, str(newcomer_folder(root / name)), args) for name, (m, args) in cases.items() if m == mode]
        proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(mine)], env=envs[mode],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for name, result in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            out[name] = {**result, "work": root / name / "work"}
    return out


def assert_one_line_error(result: dict, key: str, value: str, mode: str):
    assert result["returncode"] == 2, result["stderr"]
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1, result["stderr"]
    assert "Traceback" not in result["stderr"]
    assert f"{key}={value}: not a local folder" in lines[0]
    assert REASON[mode] in lines[0], lines[0]


def nothing_written(result: dict) -> bool:
    return sorted(p.name for p in result["work"].iterdir()) == ["examples"]


@pytest.mark.parametrize("mode", ["missing", "unreachable", "offline"])
def test_sft_example_before_make_tiny(mode, runs):
    r = runs[f"sft-{mode}"]
    assert_one_line_error(r, "model.path", MISSING, mode)
    assert str(r["work"] / MISSING) in r["stderr"]  # the local folder that was tried
    assert nothing_written(r)  # no run directory


@pytest.mark.parametrize("command, config, mode", TRAINING)
def test_training_commands_name_model_path(command, config, mode, runs):
    r = runs[f"{command}-{mode}"]
    assert_one_line_error(r, "model.path", MISSING, mode)
    assert nothing_written(r)


@pytest.mark.parametrize("mode", ["missing", "offline"])
def test_eval_names_model(mode, runs):
    r = runs[f"eval-{mode}"]
    assert_one_line_error(r, "model", MISSING, mode)
    assert nothing_written(r)


@pytest.mark.parametrize("setting, extra, mode", SECOND_MODELS)
def test_rl_second_models_name_their_key(setting, extra, mode, runs):
    r = runs[setting]
    assert r["returncode"] == 2, r["stderr"]
    assert r["stderr"].strip().startswith(f"posttrain rl: error: {setting}=acme/ref-model: not a local folder")
    assert len(r["stderr"].strip().splitlines()) == 1
    assert nothing_written(r)


def test_distill_teacher_path(runs):
    r = runs["teacher.path"]
    assert_one_line_error(r, "teacher.path", "runs/teacher", "offline")
    assert nothing_written(r)


def _cache_as_hub_model(model_dir: Path, hf_home: Path, repo: str) -> None:
    """Lay ``model_dir`` out in the hub cache the way a download of ``repo`` leaves it."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, root / "snapshots" / commit)


def test_cached_hub_model_loads_offline(runs):
    """A hub id in the local cache needs no hub: the run gets past the model to the (missing) data."""
    r = runs["cached-hub-id"]
    assert r["returncode"] == 2, r["stderr"]
    assert "runs/arith-data/train.jsonl" in r["stderr"] and "model.path" not in r["stderr"]


# ------------------------------------------------------------------------------ in process

def test_local_paths_are_not_hub_ids(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^model.path=org/name: model folder has no config.json$"):
        check_model_path("org/name")  # exists locally: a folder, never a hub id
    with pytest.raises(UserError, match=r"^teacher.path=./x/y: model folder does not exist$"):
        check_model_path("./x/y", "teacher.path")
    with pytest.raises(UserError, match=r"^model.path: no model given"):
        check_model_path("")


def test_tokenizer_error_names_the_key(nano_model_dir, tmp_path):
    broken = tmp_path / "no-tokenizer"
    broken.mkdir()
    shutil.copy(nano_model_dir / "config.json", broken / "config.json")
    with pytest.raises(UserError, match=r"^ref_path=.*no-tokenizer: could not load the tokenizer"):
        load_tokenizer(str(broken), "ref_path")


def test_eval_of_a_folder_without_weights(nano_model_dir, tmp_path, capsys):
    from posttrain.cli import main

    broken = tmp_path / "no-weights"
    shutil.copytree(nano_model_dir, broken, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    assert main(["eval", f"model={broken}", f"out_dir={tmp_path / 'out'}", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posttrain eval: error: model={broken}: could not load the model: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, data", [("sft", "train.jsonl"), ("dpo", "pairs_train.jsonl"),
                                           ("rm", "pairs_train.jsonl")])
def test_a_tokenizer_without_a_chat_template_is_one_line_exit_2(command, data, nano_model_dir, arith_data_dir,
                                                                  tmp_path, capsys):
    from posttrain.cli import main

    model = tmp_path / "no-template"
    shutil.copytree(nano_model_dir, model)
    (model / "chat_template.jinja").unlink()
    out = tmp_path / "out"
    args = [f"model.path={model}", f"data.path={arith_data_dir / data}", f"out_dir={out}", "logging.progress=false"]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"model.path={model}: the tokenizer has no chat template" in err
    assert "data.use_chat_template" in err and not out.exists()
