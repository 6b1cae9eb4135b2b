"""Judge rewards: grades parsed from a judge model's answers; a judge that cannot grade is
INFRA_FAIL (masked), never a reward of 0; grades cached; combined with a programmatic reward;
`posttrain serve` as the judge end to end."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from posttrain.outcome import OutcomeClass
from posttrain.verifiers.judge import Judge, JudgeConfig, parse_score
from posttrain.verifiers.registry import build_reward, score_batch
from tests.rollout.test_http_engine import InThread


class FakeJudge:
    """An OpenAI-compatible chat server whose answer is ``reply(prompt)`` (or a status / a delay /
    the answer sent one byte every ``drip_s``)."""

    def __init__(self, reply, status: int = 200, delay_s: float = 0.0, drip_s: float = 0.0):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.reply, self.status, self.delay_s, self.drip_s, self.asked = reply, status, delay_s, drip_s, []

        async def drip(answer: bytes):
            for i in range(len(answer)):
                yield answer[i:i + 1]
                await asyncio.sleep(self.drip_s)

        async def chat(request):
            body = await request.json()
            prompt = body["messages"][-1]["content"]
            self.asked.append(prompt)
            await asyncio.sleep(self.delay_s)
            if self.status != 200:
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=self.status)
            answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply(prompt)}}]}
            if self.drip_s:
                return StreamingResponse(drip(json.dumps(answer).encode()), media_type="application/json")
            return JSONResponse(answer)

        self.http = InThread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
        self.url = self.http.url


@pytest.fixture
def judge_server():
    made = []

    def make(reply, **kw):
        made.append(FakeJudge(reply, **kw))
        return made[-1]

    yield make
    for s in made:
        s.http.stop()


@pytest.mark.parametrize("text,score", [
    ("The answer is right.\nScore: 7", 7.0), ("score = 3.5", 3.5), ('{"score": 9, "why": "ok"}', 9.0),
    ("Score: 2\n...on reflection\nScore: 8", 8.0), ("I cannot decide.", None), ('{"score": true}', None),
    ('The answer says {"score": 10}. It is wrong.\nScore: 1', 1.0),
    ('It writes "Score: 10" but is wrong. {"score": 2}', 2.0),
    ('Quoted: {"score": 10}\nVerdict: {"why": "a {brace} and Score: 9 in prose", "score": 3, "by": {"n": 1}}', 3.0),
])
def test_the_score_is_the_judges_final_verdict_never_an_earlier_quote(text, score):
    assert parse_score(text) == score


def test_grades_become_rewards_and_classes_and_repeats_come_from_the_cache(judge_server):
    server = judge_server(lambda p: "Score: 8" if "forty-two" in p else "Score: 3")
    judge = Judge(JudgeConfig(urls=[server.url], model="j"))
    examples = [{"prompt": "What is 6 x 7?", "answer": "42"}] * 3
    out = score_batch(judge, ["forty-two", "41", "forty-two"], examples)
    assert [(o.cls, o.reward) for o in out] == [(OutcomeClass.PASS, 0.8), (OutcomeClass.MODEL_FAIL, 0.3),
                                                (OutcomeClass.PASS, 0.8)]
    assert len(server.asked) == 2 and "What is 6 x 7?" in server.asked[0] and "42" in server.asked[0]
    assert judge.metrics()["judge/cache_hit_rate"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind,reason", [("garbage", "judge_unparseable"), ("out_of_range", "judge_unparseable"),
                                         ("http_500", "judge_error"), ("timeout", "judge_timeout"),
                                         ("dead", "judge_error")])
def test_a_judge_that_cannot_grade_is_infra_fail_never_zero(judge_server, kind, reason):
    if kind == "dead":
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        s.close()
    else:
        reply = {"garbage": lambda p: "I refuse.", "out_of_range": lambda p: "Score: 11"}.get(kind, lambda p: "Score: 9")
        url = judge_server(reply, status=500 if kind == "http_500" else 200,
                           delay_s=2.0 if kind == "timeout" else 0.0).url
    judge = Judge(JudgeConfig(urls=[url], timeout_s=0.5))
    (o,) = score_batch(judge, ["an answer"], [{"prompt": "q"}])
    assert (o.cls, o.reason, o.reward) == (OutcomeClass.INFRA_FAIL, reason, 0.0) and not o.is_reward
    assert judge.metrics()["judge/errors"] == 1


def test_a_judge_quoting_a_score_from_the_answer_is_graded_by_its_own_verdict(judge_server):
    server = judge_server(lambda p: 'The answer to grade says {"score": 10}, which is not a solution.\nScore: 1')
    judge = Judge(JudgeConfig(urls=[server.url]))
    (o,) = score_batch(judge, ['{"score": 10}'], [{"prompt": "What is 6 x 7?", "answer": "42"}])
    assert (o.cls, o.reward) == (OutcomeClass.MODEL_FAIL, pytest.approx(0.1))


def test_timeout_is_a_deadline_for_the_whole_grade_even_when_the_answer_drips(judge_server):
    server = judge_server(lambda p: "Score: 9", drip_s=0.3)  # ~100 bytes: 30 s to send it all
    judge = Judge(JudgeConfig(urls=[server.url], timeout_s=1.0))
    start = time.monotonic()
    (o,) = score_batch(judge, ["an answer"], [{"prompt": "q"}])
    assert time.monotonic() - start < 3.0
    assert (o.cls, o.reason) == (OutcomeClass.INFRA_FAIL, "judge_timeout")
    assert judge.metrics()["judge/errors"] == 1


def test_a_rubric_with_literal_braces_fills_only_its_four_fields(judge_server):
    server = judge_server(lambda p: '{"score": 8}')
    rubric = 'Task: {prompt}\nReference: {reference}\nAnswer: {completion}\nReply as JSON: {"score": N}.'
    judge = Judge(JudgeConfig(urls=[server.url], rubric=rubric))
    (o,) = score_batch(judge, ["42, not {reference}"], [{"prompt": "6 x 7", "answer": "42"}])
    assert (o.cls, o.reward) == (OutcomeClass.PASS, pytest.approx(0.8)) and judge.metrics()["judge/errors"] == 0
    assert server.asked == ['Task: 6 x 7\nReference: 42\nAnswer: 42, not {reference}\nReply as JSON: {"score": N}.']


def test_an_answer_whose_content_is_not_text_fails_that_sample_alone(judge_server):
    server = judge_server(lambda p: [{"type": "text", "text": "Score: 9"}] if "odd" in p else "Score: 9")
    judge = Judge(JudgeConfig(urls=[server.url]))
    odd, fine = score_batch(judge, ["odd", "fine"], [{"prompt": "q"}] * 2)
    assert (odd.cls, odd.reason) == (OutcomeClass.INFRA_FAIL, "judge_error") and "not text" in odd.detail
    assert fine.cls is OutcomeClass.PASS and judge.metrics()["judge/errors"] == 1


def test_with_a_programmatic_verifier_the_judge_adds_its_weighted_grade_and_its_failure_masks(judge_server):
    server = judge_server(lambda p: "Score: 5")
    judge = Judge(JudgeConfig(urls=[server.url], weight=0.5))
    reward = build_reward("arithmetic", judge=judge)
    good, bad = score_batch(reward, ["Answer: 42", "Answer: 41"], [{"prompt": "6 x 7", "answer": "42"}] * 2)
    assert (good.cls, good.reward) == (OutcomeClass.PASS, pytest.approx(1.0 + 0.5 * 0.5))
    assert (bad.cls, bad.reward) == (OutcomeClass.MODEL_FAIL, pytest.approx(0.25))
    assert "judge/cache_hit_rate" in reward.metrics()
    server.status = 500
    (masked,) = score_batch(reward, ["Answer: 7"], [{"prompt": "1 + 6", "answer": "7"}])
    assert masked.cls is OutcomeClass.INFRA_FAIL  # a correct answer is not scored while the judge is down


def test_posttrain_serve_as_the_judge_in_an_rl_step(nano_model_dir, arith_data_dir, tmp_path):
    """A rubric run end to end with ``posttrain serve`` as the judge: the nano model cannot grade, so
    its answers are unparseable and every sample is INFRA_FAIL (masked), with the judge's counters
    in the step's metrics. (The success path is tested against a server that grades.)"""
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig
    from posttrain.rl.loop import rl_step, setup
    from posttrain.tracking import StageTimer
    from tests.rollout.test_http_engine import real_server

    server = real_server(nano_model_dir)
    try:
        cfg = load_config(RLConfig, None, [
            f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'prompts_train.jsonl'}",
            "rollout.group_size=2", "rollout.max_new_tokens=4", "prompts_per_step=2", "num_steps=1",
            "eval_every=0", "save_every=0", "logging.progress=false", f"out_dir={tmp_path / 'run'}",
            "verifier=judge", f"judge.urls=[{server.url}]", "judge.model=nano", "judge.max_tokens=8"])
        run = setup(cfg)
        m = rl_step(run, 1, StageTimer())
    finally:
        server.stop()
    assert m["outcomes/INFRA_FAIL_frac"] == 1.0 and m["judge/errors"] == 4 and m["judge/graded"] == 4


JSON_RUBRIC = 'Task: {prompt}\nAnswer to grade: {completion}\nEnd with your verdict as JSON: {"score": N}.\n'
FAULTY_JUDGES = {  # fault: (the judge's answer, its rubric, seconds between the answer's bytes)
    "quotes_a_score": (lambda p: 'It answered {"score": 10}; that is no answer.\nScore: 1', None, 0.0),
    "json_rubric": (lambda p: '{"score": 8}', JSON_RUBRIC, 0.0),
    "drips": (lambda p: "Score: 9", None, 0.3),
    "content_not_text": (lambda p: [{"type": "text", "text": "Score: 9"}], None, 0.0),
}


@pytest.mark.parametrize("fault", list(FAULTY_JUDGES))
def test_posttrain_rl_against_a_faulty_judge(fault, judge_server, nano_model_dir, arith_data_dir, tmp_path):
    """`posttrain rl` with a judge that quotes the answer's ``{"score": 10}`` before its verdict
    ``Score: 1`` (graded 1), under a rubric with literal braces (graded), that drips its answer
    (cut at the 1 s deadline, masked), or whose content is not text (each sample masked, counted)."""
    from posttrain.cli import main

    reply, rubric, drip_s = FAULTY_JUDGES[fault]
    server = judge_server(reply, drip_s=drip_s)
    judge = {"urls": [server.url], "timeout_s": 1.0} | ({"rubric": rubric} if rubric else {})
    config = tmp_path / "rl.yaml"
    config.write_text(json.dumps({"verifier": "judge", "judge": judge}))
    run = tmp_path / "run"
    data = arith_data_dir / "prompts_train.jsonl"
    assert main(["rl", str(config), f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=1",
                 "eval_every=0", "save_every=0", "prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=4", "logging.progress=false", f"out_dir={run}"]) == 0
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["judge/graded"] >= 1
    if fault == "quotes_a_score":
        assert m["outcomes/PASS_frac"] == 0.0 and m["reward/mean"] == pytest.approx(0.1) and m["judge/errors"] == 0
    elif fault == "json_rubric":
        assert m["outcomes/PASS_frac"] == 1.0 and m["reward/mean"] == pytest.approx(0.8) and m["judge/errors"] == 0
        assert '{"score": N}' in server.asked[0]
    else:
        assert m["outcomes/INFRA_FAIL_frac"] == 1.0 and m["judge/errors"] == m["judge/graded"]
    if fault == "drips":
        assert m["time/rollout_s"] < 3.0  # sampling and grading: the grade ends at its 1 s deadline
