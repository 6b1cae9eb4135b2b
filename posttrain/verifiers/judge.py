"""Judge rewards: an OpenAI-compatible server grades each completion with a rubric.

`Judge` fills the rubric (a template with ``{prompt}``, ``{completion}``, ``{reference}`` and
``{criteria}``) for each sample, asks the judge model at ``judge.urls`` over
``/v1/chat/completions`` (temperature 0), and parses a score from its answer: a JSON object with a
``"score"`` field, or else the last ``Score: N`` line. The score over ``max_score`` is the reward;
at ``pass_score`` or above the sample is a PASS, below a MODEL_FAIL.

A judge that cannot grade is never "the model was wrong": a connection error, a non-2xx answer, a
timeout, or an answer with no score in range is INFRA_FAIL (``judge_error``, ``judge_timeout``,
``judge_unparseable``), masked from the gradient and counted. Grades are cached by (prompt,
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
from concurrent.futures import ThreadPoolExecutor

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


@dataclasses.dataclass(kw_only=True)
class JudgeConfig:
    urls: list[str] = dataclasses.field(default_factory=list)
    """OpenAI-compatible servers of the judge model (posttrain serve, vLLM, ...); empty = no judge."""
    model: str = ""
    """The model name sent in each request (the server's served name)."""
    rubric: str = DEFAULT_RUBRIC
    """The grading prompt: {prompt}, {completion}, {reference} and {criteria} are filled in."""
    criteria: str = "Correct, complete, and clearly stated."
    """What the rubric's {criteria} says (an example's own ``criteria`` field wins)."""
    max_score: float = 10.0
    """The top of the scale the rubric asks for; reward = score / max_score."""
    pass_score: float = 7.0
    """Scores at or above this are PASS, below it MODEL_FAIL (with the scaled reward)."""
    weight: float = 1.0
    """With another verifier: the judge's reward weight added to it (verifier: judge = the judge alone)."""
    timeout_s: float = 60.0
    """Longest wait for one grade; past it the sample is INFRA_FAIL (judge_timeout)."""
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
        return self.cfg.rubric.format(prompt=_text(example.get("prompt", "")), completion=completion,
                                      reference=str(example.get("answer", example.get("reference", ""))),
                                      criteria=example.get("criteria", self.cfg.criteria))

    def _try_grade(self, prompt: str):
        try:
            return self._grade(prompt)
        except _Ungraded as e:
            return e

    def _outcome(self, score) -> Outcome:
        if isinstance(score, _Ungraded):
            return Outcome.infra_fail(score.reason, str(score))
        reward = score / self.cfg.max_score
        if score >= self.cfg.pass_score:
            return Outcome.passed(reward=reward)
        return Outcome.model_fail("judged_below_pass", reward=reward, detail=f"judge score {score:g}")

    def _grade(self, prompt: str) -> float:
        with self._lock:
            url = self.cfg.urls[self._next % len(self.cfg.urls)]
            self._next += 1
        body = {"model": self.cfg.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0, "max_tokens": self.cfg.max_tokens}
        try:
            r = self._client.post(f"{url.rstrip('/')}/v1/chat/completions", json=body)
        except httpx.TimeoutException:
            raise _Ungraded("judge_timeout", f"{url}: no grade within {self.cfg.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise _Ungraded("judge_error", f"{url}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise _Ungraded("judge_error", f"{url}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            text = r.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Ungraded("judge_error", f"{url}: malformed answer: {r.text[:200]}") from None
        score = parse_score(text)
        if score is None or not 0 <= score <= self.cfg.max_score:
            raise _Ungraded("judge_unparseable", f"no score in 0..{self.cfg.max_score:g} in the judge's answer: "
                                                 f"{text[-200:]!r}")
        return score


def parse_score(text: str) -> float | None:
    """The score in a judge's answer: a JSON object's ``"score"``, else the last ``Score: N``."""
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            value = json.loads(match.group(0)).get("score")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    found = _SCORE_LINE.findall(text)
    return float(found[-1]) if found else None


def _text(prompt) -> str:
    """A prompt as text: a chat prompt's messages one per line."""
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return str(prompt)
