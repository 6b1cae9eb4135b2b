"""The OpenAI-compatible wire format: request parsing and validation, response bodies.

Every request body is checked field by field before anything reaches the engine. A bad field is an
`APIError` (HTTP 4xx) whose body is OpenAI's error object::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": "invalid_value"}}

Fields OpenAI defines that this server does not implement (penalties, ``logit_bias``, ``echo``,
streaming, ...) are accepted only at their neutral value (``presence_penalty: 0``, ``stream: false``,
...), so a client never silently gets something other than what it asked for; any other value, and
any field nobody defines, is a 400 naming it.

Log-probs: ``token_logprobs`` are the engine's ``logprob_kind = "full_temperature_scaled"`` values,
``log_softmax(logits / T)`` over the whole vocabulary (``log_softmax(logits)`` for greedy), the
quantity a trainer recomputes. The extension ``truncated_logprobs`` carries the log-prob under the
top-k/top-p distribution the token was actually drawn from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from posttrain.rollout.types import Rollouts, SamplingParams

MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI-style error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 500: "internal_server_error", 503: "service_unavailable"}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


# ------------------------------------------------------------------------------ typed field access

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def get_int(body: dict, key: str, default, *, lo: int | None = None, hi: int | None = None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():  # 2.0 from a client that only has doubles
        v = int(v)
    if not _is_int(v):
        raise bad(f"{key} must be an integer, got {v!r}", key, "invalid_type")
    if lo is not None and v < lo:
        raise bad(f"{key} must be >= {lo}, got {v}", key)
    if hi is not None and v > hi:
        raise bad(f"{key} must be <= {hi}, got {v}", key)
    return v


def get_float(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not _is_number(v):
        raise bad(f"{key} must be a finite number, got {v!r}", key, "invalid_type")
    return float(v)


def get_bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{key} must be true or false, got {v!r}", key, "invalid_type")
    return v


def get_str(body: dict, key: str, default: str | None) -> str | None:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad(f"{key} must be a string, got {type(v).__name__}", key, "invalid_type")
    return v


# Fields OpenAI (or vLLM) defines that we accept only at their neutral value: name -> test.
def _neutral_zero(v) -> bool:
    return v is None or (_is_number(v) and v == 0)


_NEUTRAL = {
    "stream": lambda v: v in (None, False),
    "stream_options": lambda v: v is None,
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: v in (None, ""),
    "presence_penalty": _neutral_zero,
    "frequency_penalty": _neutral_zero,
    "repetition_penalty": lambda v: v is None or (_is_number(v) and v == 1),
    "min_p": _neutral_zero,
    "min_tokens": _neutral_zero,
    "logit_bias": lambda v: v in (None, {}),
    "stop_token_ids": lambda v: v in (None, []),
    "skip_special_tokens": lambda v: v in (None, True),
    "user": lambda v: v is None or isinstance(v, str),
    # chat only
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: v is None or isinstance(v, bool),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none", "auto"),
    "metadata": lambda v: v is None or isinstance(v, dict),
    "store": lambda v: v in (None, False),
}

_SAMPLING_FIELDS = {"model", "n", "temperature", "top_p", "top_k", "max_tokens", "stop", "seed",
                    "logprobs", "return_token_ids", "ignore_eos", "include_stop_str_in_output"}
COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "best_of"}
CHAT_FIELDS = _SAMPLING_FIELDS | {"messages", "top_logprobs", "max_completion_tokens", "add_generation_prompt",
                                  "chat_template_kwargs"}


def check_fields(body: dict, known: set[str]) -> None:
    for key, value in body.items():
        if key in known:
            continue
        test = _NEUTRAL.get(key)
        if test is None:
            raise bad(f"unknown field {key!r}", key, "unknown_parameter")
        if not test(value):
            raise bad(f"{key}={value!r} is not supported by this server (only its default)", key,
                      "unsupported_parameter")


# ------------------------------------------------------------------------------ parsed requests

@dataclass
class GenerateRequest:
    """A validated completion or chat request, ready for the engine."""

    prompts: list[list[int]]
    n: int
    sampling: SamplingParams
    logprobs: bool
    return_token_ids: bool
    include_stop_str: bool
    top_logprobs: int = 0
    stop_strings: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return len(self.prompts) * self.n


@dataclass
class Limits:
    """What the loaded model and the server accept."""

    vocab_size: int
    max_model_len: int
    max_samples_per_request: int


def check_model(body: dict, served_name: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad(f"model must be a string, got {type(model).__name__}", "model", "invalid_type")
    if model != served_name:
        raise APIError(404, f"The model `{model}` does not exist; this server serves `{served_name}`.",
                       param="model", code="model_not_found")


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
"""A stop list is checked against every sampled token's tail: bounded, like the rest of a request."""


def _stop_list(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("stop must be a string or a list of strings", "stop", "invalid_type")
    if any(s == "" for s in stop):
        raise bad("stop strings must not be empty", "stop")
    if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise bad(f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters each", "stop")
    return list(dict.fromkeys(stop))


def _sampling(body: dict, max_tokens: int) -> SamplingParams:
    temperature = get_float(body, "temperature", 1.0)
    if temperature < 0:
        raise bad(f"temperature must be >= 0, got {temperature}", "temperature")
    top_p = get_float(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = get_int(body, "top_k", 0, lo=-1)
    seed = get_int(body, "seed", None)
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), max_new_tokens=max_tokens,
                          stop=_stop_list(body), seed=seed, ignore_eos=get_bool(body, "ignore_eos", False))


def _check_prompts(prompts: list[list[int]], limits: Limits, max_tokens: int | None) -> None:
    for i, p in enumerate(prompts):
        if not p:
            raise bad(f"prompt {i} is empty (no tokens)", "prompt")
        bad_ids = [t for t in p if not 0 <= t < limits.vocab_size]
        if bad_ids:
            raise bad(f"prompt {i} has token ids outside [0, {limits.vocab_size}): {bad_ids[:5]}", "prompt")
        need = len(p) + (max_tokens or 1)
        if need > limits.max_model_len:
            raise bad(f"This model's maximum context length is {limits.max_model_len} tokens. However, prompt {i} "
                      f"has {len(p)} tokens and {max_tokens or 1} completion tokens were requested "
                      f"({need} in all).", "max_tokens" if max_tokens else "prompt", "context_length_exceeded")


def _check_samples(count: int, limits: Limits) -> None:
    if count > limits.max_samples_per_request:
        raise bad(f"{count} samples requested (prompts x n); this server takes at most "
                  f"{limits.max_samples_per_request} per request", "n")


def parse_prompt(value, tokenize) -> list[list[int]]:
    """OpenAI's four prompt shapes: str | list[int] | list[str] | list[list[int]]."""
    if isinstance(value, str):
        return [tokenize(value)]
    if not isinstance(value, list) or not value:
        raise bad("prompt must be a string, a list of token ids, a list of strings or a list of token-id lists "
                  "(and not empty)", "prompt", "invalid_type")
    if all(_is_int(v) for v in value):
        return [list(value)]
    if all(isinstance(v, str) for v in value):
        return [tokenize(v) for v in value]
    if all(isinstance(v, list) for v in value):
        for i, row in enumerate(value):
            if not all(_is_int(t) for t in row):
                raise bad(f"prompt {i} must be a list of integer token ids", "prompt", "invalid_type")
        return [list(row) for row in value]
    raise bad("prompt mixes types: use one of str, list[int], list[str], list[list[int]]", "prompt", "invalid_type")


def parse_completion(body: dict, limits: Limits, tokenize) -> GenerateRequest:
    check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body:
        raise bad("prompt is required", "prompt", "missing_required_parameter")
    n = get_int(body, "n", 1, lo=1)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise bad("best_of other than n is not supported", "best_of", "unsupported_parameter")
    max_tokens = get_int(body, "max_tokens", 16, lo=1)
    logprobs = get_int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    sampling = _sampling(body, max_tokens)
    prompts = parse_prompt(body["prompt"], tokenize)
    _check_samples(len(prompts) * n, limits)
    _check_prompts(prompts, limits, max_tokens)
    return GenerateRequest(prompts=prompts, n=n, sampling=sampling, logprobs=logprobs is not None,
                           top_logprobs=logprobs or 0, return_token_ids=get_bool(body, "return_token_ids", False),
                           include_stop_str=get_bool(body, "include_stop_str_in_output", False),
                           stop_strings=sampling.stop)


# SGLang's native /generate, as far as a rollout client uses it: one prompt of token ids, one sample,
# and the prompt's own log-probs from ``logprob_start_len``.
NATIVE_FIELDS = {"input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "stream", "rid"}
NATIVE_SAMPLING_FIELDS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "ignore_eos", "n",
                          "sampling_seed"}


@dataclass
class NativeRequest:
    """A validated ``/generate`` request: ``logprob_start_len`` -1 asks for no prompt log-probs."""

    req: GenerateRequest
    logprob_start_len: int
    rid: str | None


def parse_native(body: dict, limits: Limits) -> NativeRequest:
    unknown = sorted(set(body) - NATIVE_FIELDS)
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}", unknown[0], "unknown_parameter")
    for key, neutral in (("stream", False), ("top_logprobs_num", 0)):
        if body.get(key) not in (None, neutral):
            raise bad(f"{key}={body[key]!r} is not supported by this server (only {neutral!r})", key,
                      "unsupported_parameter")
    ids = body.get("input_ids")
    if ids is None:
        raise bad("input_ids is required (token ids; text prompts go to /v1/completions)", "input_ids",
                  "missing_required_parameter")
    if not isinstance(ids, list) or not ids or not all(_is_int(t) for t in ids):
        raise bad("input_ids must be a non-empty list of integer token ids (one prompt)", "input_ids", "invalid_type")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise bad("sampling_params must be an object", "sampling_params", "invalid_type")
    unknown = sorted(set(sp) - NATIVE_SAMPLING_FIELDS)
    if unknown:
        raise bad(f"unknown field sampling_params.{unknown[0]}", f"sampling_params.{unknown[0]}", "unknown_parameter")
    if get_int(sp, "n", 1, lo=1) != 1:
        raise bad("sampling_params.n > 1 is not supported on /generate here; use /v1/completions", "n",
                  "unsupported_parameter")
    max_tokens = get_int(sp, "max_new_tokens", 128, lo=1)
    seed = get_int(sp, "sampling_seed", None)
    sampling = _sampling({k: v for k, v in sp.items() if k != "sampling_seed"} | {"seed": seed}, max_tokens)
    _check_prompts([ids], limits, max_tokens)
    start = get_int(body, "logprob_start_len", -1, lo=-1, hi=len(ids) - 1)
    req = GenerateRequest(prompts=[list(ids)], n=1, sampling=sampling,
                          logprobs=get_bool(body, "return_logprob", False), return_token_ids=True,
                          include_stop_str=False, stop_strings=sampling.stop)
    return NativeRequest(req=req, logprob_start_len=start if req.logprobs else -1, rid=get_str(body, "rid", None))

def _message_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                          "messages", "invalid_type")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages", "invalid_type")


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty list", "messages", "invalid_type")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string role", "messages", "invalid_type")
        msg = {k: v for k, v in m.items() if isinstance(v, str) and k != "content"}
        msg["content"] = _message_text(m.get("content"), i)
        out.append(msg)
    return out


def parse_chat(body: dict, limits: Limits, render) -> GenerateRequest:
    """``render(messages, add_generation_prompt, template_kwargs) -> token ids``."""
    check_fields(body, CHAT_FIELDS)
    if "messages" not in body:
        raise bad("messages is required", "messages", "missing_required_parameter")
    messages = parse_messages(body["messages"])
    n = get_int(body, "n", 1, lo=1)
    max_tokens = get_int(body, "max_completion_tokens", None, lo=1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", None, lo=1)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool) and not (_is_int(logprobs) and logprobs >= 0):
        raise bad("logprobs must be true or false", "logprobs", "invalid_type")
    top_logprobs = get_int(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise bad("chat_template_kwargs must be an object", "chat_template_kwargs", "invalid_type")
    prompt = render(messages, get_bool(body, "add_generation_prompt", True), template_kwargs)
    if max_tokens is None:  # as vLLM: whatever room the context leaves
        max_tokens = max(limits.max_model_len - len(prompt), 1)
    sampling = _sampling(body, max_tokens)
    _check_samples(n, limits)
    _check_prompts([prompt], limits, max_tokens)
    return GenerateRequest(prompts=[prompt], n=n, sampling=sampling,
                           logprobs=logprobs is not None and logprobs is not False, top_logprobs=top_logprobs,
                           return_token_ids=get_bool(body, "return_token_ids", False),
                           include_stop_str=get_bool(body, "include_stop_str_in_output", False),
                           stop_strings=sampling.stop)


# ------------------------------------------------------------------------------ responses

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def _strip_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The engine cuts texts right after the stop string; OpenAI's text ends before it."""
    hits = [s for s in stops if text.endswith(s)]
    if not hits:
        return text, None
    s = max(hits, key=len)
    return text[: len(text) - len(s)], s


@dataclass
class Choice:
    """One sample, ready to be written in either response shape."""

    text: str
    finish_reason: str
    stop_reason: str | None
    token_ids: list[int]
    prompt_token_ids: list[int]
    logprobs: list[float]
    truncated_logprobs: list[float]
    policy_version: int


def choices_of(r: Rollouts, req: GenerateRequest) -> list[Choice]:
    texts = r.texts if r.texts is not None else [""] * len(r)
    out = []
    for i in range(len(r)):
        text, stop_reason = texts[i], None
        if r.finish_reason[i] == "stop":
            stripped, stop_reason = _strip_stop(text, req.stop_strings)
            if not req.include_stop_str:
                text = stripped
        out.append(Choice(text=text, finish_reason=FINISH[r.finish_reason[i]], stop_reason=stop_reason,
                          token_ids=r.completion_ids[i], prompt_token_ids=r.prompt_ids[i], logprobs=r.logprobs[i],
                          truncated_logprobs=(r.truncated_logprobs[i] if r.truncated_logprobs is not None
                                              else [0.0] * len(r.completion_ids[i])),
                          policy_version=r.policy_version[i]))
    return out


def usage(req: GenerateRequest, choices: list[Choice]) -> dict:
    prompt = sum(len(p) for p in req.prompts)
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(*, rid: str, created: int, model: str, req: GenerateRequest, choices: list[Choice],
                    token_text) -> dict:
    items = []
    for i, c in enumerate(choices):
        item = {"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason, "policy_version": c.policy_version}
        if req.logprobs:
            tokens = [token_text(t) for t in c.token_ids]
            offsets, pos = [], 0
            for tok in tokens:
                offsets.append(pos)
                pos += len(tok)
            item["logprobs"] = {"tokens": tokens, "token_logprobs": c.logprobs, "top_logprobs": None,
                                "text_offset": offsets}
        items.append(item | extensions(c, req))
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": items,
            "usage": usage(req, choices)}


def extensions(c: Choice, req: GenerateRequest) -> dict:
    """The fields both routes add to OpenAI's choice: truncated log-probs and the token ids."""
    out = {"truncated_logprobs": c.truncated_logprobs} if req.logprobs else {}
    if req.return_token_ids:
        out |= {"token_ids": c.token_ids, "prompt_token_ids": c.prompt_token_ids}
    return out


def chat_body(*, rid: str, created: int, model: str, req: GenerateRequest, choices: list[Choice], token_text) -> dict:
    items = []
    for i, c in enumerate(choices):
        item = {"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason, "policy_version": c.policy_version}
        if req.logprobs:
            tokens = [token_text(t) for t in c.token_ids]
            item["logprobs"] = {
                "content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8")), "top_logprobs": []}
                            for tok, lp in zip(tokens, c.logprobs)],
                # the completions shape too, so one client reads both endpoints the same way
                "tokens": tokens, "token_logprobs": c.logprobs,
            }
        items.append(item | extensions(c, req))
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": items,
            "usage": usage(req, choices)}


def native_body(*, rid: str, native: NativeRequest, choice: Choice, prompt_logprobs: list[float] | None,
                weight_version: str) -> dict:
    """SGLang's ``/generate`` answer. ``prompt_logprobs[t - 1]`` is log p(prompt[t] | prompt[:t]);
    log-prob entries are ``[logprob, token_id, null]``, the first prompt entry's logprob null."""
    prompt = native.req.prompts[0]
    if choice.finish_reason == "length":
        finish = {"type": "length", "length": len(choice.token_ids)}
    else:  # the stop string matched, else the EOS id
        finish = {"type": "stop", "matched": choice.stop_reason if choice.stop_reason is not None
                  else choice.token_ids[-1]}
    meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(prompt),
            "completion_tokens": len(choice.token_ids), "weight_version": weight_version}
    if native.req.logprobs:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(choice.logprobs, choice.token_ids)]
    start = native.logprob_start_len
    if start >= 0:
        meta["input_token_logprobs"] = [[None, prompt[start], None]] + [
            [prompt_logprobs[t - 1], prompt[t], None] for t in range(start + 1, len(prompt))]
    return {"text": choice.text, "output_ids": choice.token_ids, "meta_info": meta}
