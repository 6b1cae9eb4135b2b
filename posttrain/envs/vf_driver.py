"""The verifiers side of ``env.name=verifiers:<taskset>``: a process in ``.venv-verifiers`` that
holds one verifiers v1 environment and runs its episodes on request.

Run as ``.venv-verifiers/bin/python vf_driver.py SPEC_JSON`` by `posttrain.envs.vf_env` (never
imported by posttrain: it needs only the standard library and ``verifiers``). SPEC_JSON is
``{"taskset": id, "taskset_options": {...}, "env_options": {...}}``; the environment is built the
way verifiers' own entry points build it (``resolve_env_config`` then ``load_environment``) and
held inside ``env.serving()`` (its interception server and shared tool servers), as
``vf-eval`` and verifiers' ``EnvServer`` (what prime-rl runs) hold it.

Protocol: JSON lines. The driver writes ``{"ready": true}`` (or ``{"ready": false, "error": ...}``)
once, then reads requests from stdin:

- ``{"op": "run", "id": ..., "task": {...} | null, "task_idx": int | null, "base_url": ...,
  "model": ...}``: one episode (``env.run_slot``) of the task (``task``: task data validated into
  the taskset's ``TaskData`` type, as ``EnvServer`` does for prime-rl; ``task_idx``: the taskset's
  own task at that index), its model calls sent to ``base_url`` (an OpenAI-compatible endpoint,
  verifiers' ``EvalClientConfig``). The reply, when the episode ends: ``{"id", "ok", "errors",
  "is_timeout", "traces": [{"reward", "rewards", "ok", "stop_condition", "is_timeout",
  "errors", "replies"}]}``, or ``{"id", "task_error": ...}`` when the task does not validate;
- ``{"op": "cancel", "id": ...}``: abandon that episode (no reply).

The driver exits when stdin closes (posttrain is gone). Everything but the protocol goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading


def _errors(errors) -> list[dict]:
    return [{"type": e.type, "message": str(e.message)[-2000:], "status_code": e.status_code} for e in errors]


def _summary(episode) -> dict:
    traces = [{"reward": float(t.reward), "ok": bool(t.ok), "stop_condition": t.stop_condition,
               "is_timeout": bool(t.is_timeout), "errors": _errors(t.errors),
               "rewards": {k: (None if r is None else r.value) for k, r in t.rewards.items()},
               "replies": [m.content for m in t.assistant_messages]} for t in episode.traces]
    return {"ok": bool(episode.ok), "errors": _errors(episode.errors),
            "is_timeout": bool(getattr(episode, "is_timeout", False)), "traces": traces}


class Driver:
    def __init__(self, spec: dict, out):
        self.spec, self.out = spec, out
        self.running: dict[str, asyncio.Task] = {}
        self.tasks = None

    def write(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def load(self) -> None:
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config

        raw = {"taskset": {"id": self.spec["taskset"], **self.spec.get("taskset_options", {})},
               **self.spec.get("env_options", {})}
        self.env = load_environment(resolve_env_config(raw))
        task_cls = type(self.env.taskset).task_type()
        self.task_cls, self.data_cls = task_cls, task_cls.data_type()

    def task(self, req: dict):
        if req.get("task_idx") is not None:
            if self.tasks is None:  # the taskset's own tasks (loading may read a dataset): once
                self.tasks = list(self.env.taskset)
            return self.tasks[int(req["task_idx"])]
        return self.task_cls(self.data_cls.model_validate(req["task"]), self.env.config.taskset.task)

    async def run(self, req: dict) -> None:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig

        rid = req["id"]
        try:
            try:
                task = self.task(req)
            except Exception as e:  # noqa: BLE001 - a bad task is the task's fault, reported
                self.write({"id": rid, "task_error": f"{type(e).__name__}: {e}"})
                return
            ctx = ModelContext(model=req.get("model", "posttrain"),
                               client=EvalClientConfig(base_url=req["base_url"], api_key_var="POSTTRAIN_VERIFIERS_KEY"))
            (slot,) = self.env.slots(task)
            episode = await self.env.run_slot(slot, ctx)
            self.write({"id": rid, **_summary(episode)})
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - verifiers records rollout failures; this is the rest
            self.write({"id": rid, "ok": False, "is_timeout": False, "traces": [],
                        "errors": [{"type": type(e).__name__, "message": str(e)[-2000:], "status_code": None}]})
        finally:
            self.running.pop(rid, None)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue = asyncio.Queue()

        def read() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)

        threading.Thread(target=read, daemon=True).start()
        async with self.env.serving():
            self.write({"ready": True})
            while (line := await lines.get()) is not None:
                if not line.strip():
                    continue
                req = json.loads(line)
                if req.get("op") == "cancel":
                    task = self.running.pop(req["id"], None)
                    if task is not None:
                        task.cancel()
                elif req.get("op") == "run":
                    self.running[req["id"]] = asyncio.create_task(self.run(req))
            for task in list(self.running.values()):
                task.cancel()


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # prints and logs from the environment go to stderr, never into the protocol
    sys.stdout = sys.stderr
    driver = Driver(json.loads(sys.argv[1]), out)
    try:
        driver.load()
    except Exception as e:  # noqa: BLE001 - reported as one line to posttrain
        driver.write({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    asyncio.run(driver.serve())


if __name__ == "__main__":
    main()
