"""`posttrain eval` on code benchmarks: HumanEval and JSONL code tasks judged in the sandbox."""

from __future__ import annotations

import json

import pytest

from posttrain.config import load_config
from posttrain.errors import UserError
from posttrain.eval.results import read_samples
from posttrain.eval.runner import EvalConfig, load_problems, run_eval
from posttrain.rollout.types import Rollouts, SamplingParams
from posttrain.sandbox.records import humaneval_records
from posttrain.sandbox.worker import probe
from posttrain.tasks.toy_code import write_toy_code

pytestmark = pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")


class OracleEngine:
    """Answers each prompt with a scripted completion (looked up by the prompt text)."""

    def __init__(self, tokenizer, answers: dict[str, str]):
        self.tokenizer, self.answers = tokenizer, answers

    def generate(self, prompts, n, sampling):
        texts = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            texts.append(next(a for p, a in self.answers.items() if p.strip() in text))
        idx = [i for i in range(len(prompts)) for _ in range(n)]
        ids = [self.tokenizer(texts[i], add_special_tokens=False)["input_ids"] for i in idx]
        return Rollouts(prompt_idx=idx, prompt_ids=[prompts[i] for i in idx], completion_ids=ids,
                        logprobs=[[0.0]] * len(idx), finish_reason=["eos"] * len(idx), policy_version=[0] * len(idx),
                        sampling=SamplingParams(), texts=[texts[i] for i in idx])


@pytest.fixture(scope="module")
def tokenizer(nano_model_dir):
    from posttrain.models.hf import load_tokenizer

    return load_tokenizer(nano_model_dir)


def config(out, *overrides):
    return load_config(EvalConfig, None, [f"out_dir={out}", "model=oracle", "use_chat_template=false",
                                          'profiles=[{"name": "greedy", "max_new_tokens": 8}]', *overrides])


def test_humaneval_benchmark(tmp_path, tokenizer):
    recs = humaneval_records()[:12]
    # Canonical bodies for even problems, a body that returns None for odd ones.
    answers = {r["prelude"]: (r["reference"][len(r["prelude"]):] if i % 2 == 0 else "    return None\n")
               for i, r in enumerate(recs)}
    cfg = config(tmp_path, 'benchmarks=[{"kind": "humaneval", "num_problems": 12}]')
    (result,) = run_eval(cfg, engine=OracleEngine(tokenizer, answers), tokenizer=tokenizer, show_progress=False)
    assert result.benchmark == "humaneval" and result.num_problems == 12
    assert result.outcomes == {"PASS": 6, "MODEL_FAIL": 6, "TASK_FAIL": 0, "INFRA_FAIL": 0}
    assert result.pass_at_k[0].mean == pytest.approx(0.5)
    samples = read_samples(tmp_path / "samples" / "humaneval.greedy.jsonl")
    assert [s.outcome for s in samples] == ["PASS", "MODEL_FAIL"] * 6


def test_humaneval_on_the_verifier_farm_judges_like_in_process(tmp_path, tokenizer, ray_cluster):
    from posttrain.verifiers import code

    recs = humaneval_records()[:8]
    answers = {r["prelude"]: (r["reference"][len(r["prelude"]):] if i % 2 == 0 else "    return None\n")
               for i, r in enumerate(recs)}
    bench = 'benchmarks=[{"kind": "humaneval", "num_problems": 8}]'
    outcomes = {}
    for where, extra in (("local", []), ("farm", ["runtime=ray", "sandbox.replicas=2", "sandbox.cpus=1"])):
        cfg = config(tmp_path / where, bench, *extra)
        run_eval(cfg, engine=OracleEngine(tokenizer, answers), tokenizer=tokenizer, show_progress=False)
        samples = read_samples(tmp_path / where / "samples" / "humaneval.greedy.jsonl")
        outcomes[where] = [(s.outcome, s.reward) for s in samples]
        assert type(code.shared_pool()).__name__ == ("VerifierFarm" if where == "farm" else "SandboxPool")
    code.configure(code.SandboxConfig())
    assert outcomes["farm"] == outcomes["local"] == [("PASS", 1.0), ("MODEL_FAIL", 0.0)] * 4


def test_jsonl_code_benchmark(tmp_path, tokenizer):
    files = write_toy_code(tmp_path / "data", n_train=0, n_eval=6)
    recs = [json.loads(x) for x in files["eval"].read_text().splitlines()]
    answers = {r["prompt"]: r["completion"] for r in recs[:3]} | {r["prompt"]: "def f(x):\n    return x\n"
                                                                   for r in recs[3:]}
    cfg = config(tmp_path / "out", f'benchmarks=[{{"kind": "code", "path": "{files["prompts_eval"]}"}}]')
    (result,) = run_eval(cfg, engine=OracleEngine(tokenizer, answers), tokenizer=tokenizer, show_progress=False)
    samples = read_samples(tmp_path / "out" / "samples" / "code.greedy.jsonl")
    assert len({r["prompt"] for r in recs}) == 6  # distinct functions
    assert [s.outcome for s in samples] == ["PASS"] * 3 + ["MODEL_FAIL"] * 3
    assert result.outcomes["PASS"] == 3
    assert result.outcomes["INFRA_FAIL"] == result.outcomes["TASK_FAIL"] == 0


def test_code_records_need_tests(tmp_path):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps({"prompt": "def f():", "test": "assert f() == 1"}) + "\n")
    cfg = config(tmp_path / "out", f'benchmarks=[{{"kind": "code", "path": "{path}"}}]')
    with pytest.raises(UserError, match=r"code\.jsonl:1: a code problem needs 'tests' and 'entry_point'"):
        load_problems(cfg.benchmarks[0], 0)
