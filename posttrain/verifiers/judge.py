"""Judge rewards: an OpenAI-compatible server grades each completion with a rubric.

`Judge` fills the rubric (a template with ``{prompt}``, ``{completion}``, ``{reference}`` and
``{criteria}``; only those four are filled, so other braces, a JSON answer format, stay as written)
for each sample, asks the judge model at ``judge.urls`` over ``/v1/chat/completions``
(temperature 0), and parses its final verdict: whichever comes last of a JSON object with a
``"score"`` field and a ``Score: N`` line. Not the first: a judge often quotes the answer it grades,
and the policy writes that answer. The score over ``max_score`` is the reward; at ``pass_score`` or
above the sample is a PASS, below a MODEL_FAIL.

A judge that cannot grade is never "the model was wrong": a connection error, a non-2xx answer, no
whole answer within ``timeout_s`` (a deadline for the whole grade: httpx's timeout bounds each
read, so a judge dripping its answer would otherwise hold the step), a malformed answer, or one
with no score in range is INFRA_FAIL (``judge_error``, ``judge_timeout``, ``judge_unparseable``),
masked from the gradient and counted. Grades are cached by (prompt,
completion, rubric), so a repeated sample is graded once (``judge/cache_hit_rate``). A batch is
graded ``concurrency`` requests at a time. ``$POSTTRAIN_API_KEY`` goes with every request as a
bearer token, as for rollout servers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import httpx

from posttrain.config import ConfigValueError
from posttrain.outcome import Outcome
from posttrain.rollout.http import auth_headers

DEFAULT_RUBRIC = """You are grading an answer to a task.

Task:
{prompt}

Reference answer (may be empty):
{reference}

Criteria:
{criteria}

Answer to grade:
{completion}

Think briefly, then end with one line of the form "Score: N", N an integer from 0 to 10."""

_SCORE_LINE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FIELD = re.compile(r"\{(prompt|completion|reference|criteria)\}")


@dataclasses.dataclass(kw_only=True)
class JudgeConfig:
    urls: list[str] = dataclasses.field(default_factory=list)
    """OpenAI-compatible servers of the judge model (posttrain serve, vLLM, ...); empty = no judge."""
    model: str = ""
    """The model name sent in each request (the server's served name)."""
    rubric: str = DEFAULT_RUBRIC
    """The grading prompt: {prompt}, {completion}, {reference} and {criteria} are filled in; any other
    braces are sent as written (no doubling needed)."""
    criteria: str = "Correct, complete, and clearly stated."
    """What the rubric's {criteria} says (an example's own ``criteria`` field wins)."""
    max_score: float = 10.0
    """The top of the scale the rubric asks for; reward = score / max_score."""
    pass_score: float = 7.0
    """Scores at or above this are PASS, below it MODEL_FAIL (with the scaled reward)."""
    weight: float = 1.0
    """With another verifier: the judge's reward weight added to it (verifier: judge = the judge alone)."""
    timeout_s: float = 60.0
    """Deadline of one grade, all of it (connecting, the judge thinking, reading its answer); past
    it the sample is INFRA_FAIL (judge_timeout)."""
    max_tokens: int = 256
    """Most tokens the judge may write per grade."""
    concurrency: int = 8
    """Grades requested at once."""

    def __post_init__(self):
        if not all(u.startswith(("http://", "https://")) for u in self.urls):
            raise ConfigValueError("urls", f"each must start with http:// or https://, got {self.urls}")
        if self.max_score <= 0:
            raise ConfigValueError("max_score", "must be > 0")
        if not 0 <= self.pass_score <= self.max_score:
            raise ConfigValueError("pass_score", "must be between 0 and max_score")
        for key in ("timeout_s", "max_tokens", "concurrency"):
            if getattr(self, key) <= 0:
                raise ConfigValueError(key, "must be > 0")
        for field in ("{completion}",):
            if field not in self.rubric:
                raise ConfigValueError("rubric", f"must contain {field}")


class _Ungraded(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class Judge:
    """The verifier ``(completion, example) -> Outcome`` of a judge model (module docstring)."""

    __name__ = "judge"

    def __init__(self, cfg: JudgeConfig, api_key: str | None = None):
        if not cfg.urls:
            raise ConfigValueError("urls", "the judge needs at least one server, e.g. [http://localhost:8000]")
        self.cfg = cfg
        self._client = httpx.Client(timeout=cfg.timeout_s, headers=auth_headers(api_key),
                                    limits=httpx.Limits(max_connections=cfg.concurrency))
        self._cache: dict[str, float] = {}
        self._lock = threading.Lock()
        self._next = 0
        self.stats = {"graded": 0, "cache_hits": 0, "errors": 0}

    def __call__(self, completion: str, example: dict) -> Outcome:
        return self.batch([completion], [example])[0]

    def batch(self, completions: list[str], examples: list[dict]) -> list[Outcome]:
        """Each distinct filled rubric is graded once (a group's identical samples, a cached one:
        not at all), ``concurrency`` grades at a time."""
        prompts = [self._fill(c, e) for c, e in zip(completions, examples)]
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        with self._lock:
            todo = {k: p for k, p in zip(keys, prompts) if k not in self._cache}
            self.stats["graded"] += len(todo)
            self.stats["cache_hits"] += len(keys) - len(todo)
        with ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            graded = dict(zip(todo, pool.map(self._try_grade, todo.values())))
        with self._lock:
            self._cache |= {k: v for k, v in graded.items() if not isinstance(v, _Ungraded)}
            self.stats["errors"] += sum(isinstance(v, _Ungraded) for v in graded.values())
            return [self._outcome(graded[k] if k in graded else self._cache[k]) for k in keys]

    def metrics(self) -> dict:
        """``judge/*`` counters so far: grades asked, cache hit rate, grades that failed."""
        asked = self.stats["graded"] + self.stats["cache_hits"]
        return {"judge/cache_hit_rate": self.stats["cache_hits"] / asked if asked else 0.0,
                "judge/errors": self.stats["errors"], "judge/graded": self.stats["graded"]}

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------------------------------

    def _fill(self, completion: str, example: dict) -> str:
        fields = {"prompt": _text(example.get("prompt", "")), "completion": str(completion),
                  "reference": str(example.get("answer", example.get("reference", ""))),
                  "criteria": str(example.get("criteria", self.cfg.criteria))}
        # one pass, named fields only: the rubric's other braces stay literal, and a completion
        # that writes "{reference}" is not filled in with the reference
        return _FIELD.sub(lambda m: fields[m.group(1)], self.cfg.rubric)

    def _try_grade(self, prompt: str):
        """The score of ``prompt``, or the `_Ungraded` why not, by ``timeout_s`` from now. The grade
        runs on a thread of its own so the wait is a deadline; left behind, it stops itself at its
        next read of the answer (`_post`)."""
        deadline = time.monotonic() + self.cfg.timeout_s
        done: Future = Future()
        threading.Thread(target=self._grade_into, args=(prompt, deadline, done), daemon=True,
                         name="judge-grade").start()
        try:
            return done.result(timeout=self.cfg.timeout_s)
        except FutureTimeout:
            return _Ungraded("judge_timeout", f"no grade within {self.cfg.timeout_s:g} s")

    def _grade_into(self, prompt: str, deadline: float, done: Future) -> None:
        try:
            done.set_result(self._grade(prompt, deadline))
        except _Ungraded as e:
            done.set_result(e)
        except Exception as e:  # a surprise in one answer is that sample's failure, never its batch's
            done.set_result(_Ungraded("judge_error", f"{type(e).__name__}: {e}"))

    def _outcome(self, score) -> Outcome:
        if isinstance(score, _Ungraded):
            return Outcome.infra_fail(score.reason, str(score))
        reward = score / self.cfg.max_score
        if score >= self.cfg.pass_score:
            return Outcome.passed(reward=reward)
        return Outcome.model_fail("judged_below_pass", reward=reward, detail=f"judge score {score:g}")

    def _grade(self, prompt: str, deadline: float) -> float:
        with self._lock:
            url = self.cfg.urls[self._next % len(self.cfg.urls)]
            self._next += 1
        body = {"model": self.cfg.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0, "max_tokens": self.cfg.max_tokens}
        status, raw = self._post(url, body, deadline)
        if status != 200:
            raise _Ungraded("judge_error", f"{url}: HTTP {status}: {raw[:200]}")
        try:
            text = json.loads(raw)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Ungraded("judge_error", f"{url}: malformed answer: {raw[:200]}") from None
        if not isinstance(text, str):
            raise _Ungraded("judge_error", f"{url}: the answer's content is {type(text).__name__}, not text")
        score = parse_score(text)
        if score is None or not 0 <= score <= self.cfg.max_score:
            raise _Ungraded("judge_unparseable", f"no score in 0..{self.cfg.max_score:g} in the judge's answer: "
                                                 f"{text[-200:]!r}")
        return score

    def _post(self, url: str, body: dict, deadline: float) -> tuple[int, str]:
        """Status and text of the judge's answer, read chunk by chunk so that it is cut at ``deadline``."""
        timeout = max(deadline - time.monotonic(), 0.01)  # no single read outlives the deadline by much
        try:
            with self._client.stream("POST", f"{url.rstrip('/')}/v1/chat/completions", json=body,
                                     timeout=timeout) as r:
                raw = bytearray()
                for chunk in r.iter_bytes():
                    if time.monotonic() > deadline:
                        raise _Ungraded("judge_timeout", f"{url}: no whole answer within {self.cfg.timeout_s:g} s")
                    raw += chunk
                return r.status_code, raw.decode("utf-8", "replace")
        except httpx.TimeoutException:
            raise _Ungraded("judge_timeout", f"{url}: no grade within {self.cfg.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise _Ungraded("judge_error", f"{url}: {type(e).__name__}: {e}") from None


def parse_score(text: str) -> float | None:
    """The judge's final verdict: whichever ends last of a JSON object's ``"score"`` and a
    ``Score: N`` line. Earlier ones may be quoted from the answer under grade."""
    found = [(m.end(), float(m.group(1))) for m in _SCORE_LINE.finditer(text)] + list(_json_scores(text))
    return max(found)[1] if found else None


def _json_scores(text: str):
    """``(end, score)`` of each JSON object in ``text`` with a numeric ``"score"`` (nested ones too)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        value = obj.get("score") if isinstance(obj, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield end, float(value)


def _text(prompt) -> str:
    """A prompt as text: a chat prompt's messages one per line."""
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return str(prompt)
