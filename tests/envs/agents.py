"""Agents the agent-environment tests run (``env.agent=tests.envs.agents:<name>``): written as users
write them, with the official ``openai`` client and nothing of posttrain."""

from __future__ import annotations

import json
import time

from openai import OpenAI

ADD = {"type": "function", "function": {"name": "add", "description": "a + b",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}}


def client(base_url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def tool_loop(task: dict, base_url: str, api_key: str) -> float:
    """Three model calls with the ``add`` tool offered: tool calls are run and answered with ``tool``
    messages, a reply without one gets "Use the tool." — each call extends the previous one. The
    reward: 1 when the last reply holds the sum, else 0."""
    llm, messages, text = client(base_url, api_key), [{"role": "user", "content": task["prompt"]}], ""
    for _ in range(3):
        reply = llm.chat.completions.create(model="posttrain", messages=messages, tools=[ADD])
        message = reply.choices[0].message
        text = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Use the tool."})
    return float(str(task["a"] + task["b"]) in text)


def streaming(task: dict, base_url: str, api_key: str) -> dict:
    """Two streamed calls; the reward as a dict with a score of its own."""
    llm, messages = client(base_url, api_key), [{"role": "user", "content": task["prompt"]}]
    for _ in range(2):
        chunks = llm.chat.completions.create(model="posttrain", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    return {"reward": 0.25, "reason": "format", "scores": {"letters": float(sum(ch.isalpha() for ch in text))}}


def rewriting(task: dict, base_url: str, api_key: str) -> float:
    """Four calls: the second extends the first; the third drops the history for a summary (a
    rewrite: a new row); the fourth extends the third."""
    llm = client(base_url, api_key)
    messages = [{"role": "user", "content": task["prompt"]}]
    for k in range(4):
        reply = llm.chat.completions.create(model="posttrain", messages=messages).choices[0].message.content
        if k == 1:
            messages = [{"role": "system", "content": "Summary: the user asked twice."},
                        {"role": "user", "content": "Answer now."}]
        else:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"turn {k}"}]
    return 0.0


def raises_first(task, base_url, api_key):
    raise RuntimeError("the agent's own bug")


def never_calls(task, base_url, api_key):
    return 1.0


def hangs(task, base_url, api_key):
    time.sleep(30)
    return 1.0


def raises_after_a_call(task, base_url, api_key):
    client(base_url, api_key).chat.completions.create(model="posttrain", messages=[{"role": "user", "content": "hi"}])
    raise KeyError("a tool server went away")


def says_yes(task, base_url, api_key):
    client(base_url, api_key).chat.completions.create(model="posttrain", messages=[{"role": "user", "content": "hi"}])
    return "yes"


def calls_forever(task, base_url, api_key):
    """Calls until refused (the call bound), then returns 1.0 as if nothing happened."""
    llm, messages = client(base_url, api_key), [{"role": "user", "content": "hi"}]
    try:
        for k in range(50):
            text = llm.chat.completions.create(model="posttrain", messages=messages).choices[0].message.content
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more {k}"}]
    except Exception:  # noqa: BLE001 - the refusal
        pass
    return 1.0


def parallel(task: dict, base_url: str, api_key: str, retries: int = 2) -> dict:
    """Two calls in flight at once (two threads, one client): the endpoint answers one and
    refuses the other with 409, which the openai client retries (``retries``) once the first is
    answered. Scores: how many calls ended refused."""
    import threading

    import openai

    llm = OpenAI(base_url=base_url, api_key=api_key, max_retries=retries, timeout=60)
    start, replies, refused = threading.Barrier(2), [], []

    def ask(k: int) -> None:
        start.wait()
        try:
            messages = [{"role": "user", "content": f"{task['prompt']} ({k})"}]
            replies.append(llm.chat.completions.create(model="posttrain", messages=messages).choices[0].message.content)
        except openai.ConflictError:
            refused.append(k)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"reward": float(len(replies) == 2), "scores": {"refused": float(len(refused))}}


def parallel_no_retry(task: dict, base_url: str, api_key: str) -> dict:
    return parallel(task, base_url, api_key, retries=0)


COMMAND = '''
import json, os, sys

task = json.loads(sys.stdin.read())
if task.get("exit"):
    print("a crash of its own", file=sys.stderr)
    sys.exit(task["exit"])
if task.get("hang"):
    import time
    print(os.getpid(), file=open(task["hang"], "w"), flush=True)
    time.sleep(60)
from openai import OpenAI

llm = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": task["prompt"]}]
for _ in range(2):
    text = llm.chat.completions.create(model="posttrain", messages=messages).choices[0].message.content
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
print("some log line")
print(json.dumps({"reward": 1.0 if os.environ["POSTTRAIN_BASE_URL"] == os.environ["OPENAI_BASE_URL"] else 0.0}))
'''
