"""Code-test verifier: reward 1 iff every test passes in the sandbox (`posttrain.sandbox`).

An example carries its tests next to the prompt, in either sandbox form:

- function-call: ``tests`` (defining ``check(candidate)``), ``entry_point`` and an optional trusted
  ``prelude`` (helpers the tests call, imports the prompt shows; run on the verdict side too);
- stdin/stdout: ``io``, a list of ``{"stdin", "stdout"}``;
- pytest: ``tests`` (a pytest module) and ``module`` (the name it imports the program as);

and optionally ``program_prefix`` / ``program_suffix`` around the code (published formats,
`posttrain.data.formats`, which also sets ``task_error`` on a task broken as published: TASK_FAIL).

The program is taken from the completion (`posttrain.verifiers.basic.extract_code`) past a closed
``<think>`` trace when there is one, as evalplus' ``sanitize`` takes it: the longest syntactically
valid code, whatever fences and prose surround it; for function-call tasks only the imports and
the definitions the entry point needs (top-level example calls and ``__main__`` blocks dropped);
stdin programs and pytest-imported modules keep their top-level statements.
For function-call tasks a program that defines ``entry_point`` is put after the
prelude; one that does not is read as the continuation of the prelude (HumanEval style, where
the prompt ends inside the function and the model writes its body).

Outcomes: the sandbox's classes pass through unchanged, so INFRA_FAIL (a worker died and retries
ran out) is masked from the gradient by the RL loop, never scored 0. An example without tests is
TASK_FAIL; a completion with no code is MODEL_FAIL/format.

All callers in a process share one pool, started on first use and closed at exit. ``configure``
sets its limits and where it runs: in this process (``runtime="local"``, or ``cfg.replicas`` 0),
or on ``cfg.replicas`` sandbox actors of a Ray cluster (``runtime="ray"``: the verifier farm,
`posttrain.distributed.farm`, with the same interface and the same outcomes). If the machine
cannot run the sandbox, or a circuit breaker trips, the exception propagates and stops the run:
there is no weaker fallback.
"""

from __future__ import annotations

import atexit
import dataclasses
import re
import threading
from typing import TYPE_CHECKING

from posttrain.distributed.cluster import RayConfig
from posttrain.errors import UserError
from posttrain.outcome import Outcome
from posttrain.sandbox.pool import Job, SandboxPool
from posttrain.sandbox.records import to_job
from posttrain.sandbox.worker import SandboxConfig
from posttrain.verifiers.basic import after_trace, extract_code

if TYPE_CHECKING:
    from posttrain.distributed.farm import VerifierFarm

_LOCK = threading.Lock()
_STATE: dict = {"pool": None, "settings": (SandboxConfig(), "local", None)}


def configure(cfg: SandboxConfig, runtime: str = "local", ray: RayConfig | None = None) -> None:
    """Limits and placement of the shared pool. A running pool with other settings is closed; the
    next use starts one with these."""
    settings = (cfg, runtime, ray)
    with _LOCK:
        if settings == _STATE["settings"]:
            return
        _STATE["settings"] = settings
    close()


def sandbox_python() -> str:
    """The interpreter the shared pool's sandboxes run."""
    return _STATE["settings"][0].python


def shared_pool(site_packages: str = "") -> SandboxPool | VerifierFarm:
    """The process's pool; with ``site_packages``, the pool (same settings) whose sandboxes also
    bind that folder read-only (`SandboxConfig.site_packages`), one per folder."""
    key = "pool" if not site_packages else ("site", site_packages)
    with _LOCK:
        if _STATE.get(key) is None:
            cfg, runtime, ray = _STATE["settings"]
            if site_packages:
                cfg = dataclasses.replace(cfg, site_packages=site_packages)
            if runtime == "ray" and cfg.replicas:
                from posttrain.distributed.farm import VerifierFarm

                ray = ray or RayConfig()
                _STATE[key] = VerifierFarm(cfg, ray.address, ray.num_cpus)
            else:
                _STATE[key] = SandboxPool(cfg)
        return _STATE[key]


def farm_metrics() -> dict:
    """The verifier farm's counters so far as ``farm/<key>`` (actor deaths, retries, timeouts, ...),
    or nothing when programs are judged in this process."""
    pool = _STATE["pool"]
    if pool is None or isinstance(pool, SandboxPool):
        return {}
    return {f"farm/{k}": v for k, v in pool.stats.items() if "/" not in k}


def close() -> None:
    with _LOCK:
        pools = [_STATE.pop(k) for k in list(_STATE) if k == "pool" or type(k) is tuple]
        _STATE["pool"] = None
    for pool in pools:
        if pool is not None:
            pool.close()


atexit.register(close)


def build_job(completion: str, example: dict) -> Job | Outcome:
    """The sandbox job for one completion, or the Outcome when there is nothing to run."""
    if example.get("task_error"):  # broken as published (e.g. private tests that do not decode)
        return Outcome.task_fail("bad_test", str(example["task_error"]))
    if "module" in example or "program_suffix" in example or "program_prefix" in example:
        return _task_job(_program_of(completion, example), example)
    if "io" in example:
        io = example["io"]
        if not isinstance(io, list) or not io or not all(isinstance(c, dict) and "stdin" in c and "stdout" in c
                                                        for c in io):
            return Outcome.task_fail("bad_test", "'io' must be a non-empty list of {stdin, stdout}")
        code = extract_code(completion, whole=True)  # a stdin program's top-level statements are the program
        if not code.strip():
            return Outcome.model_fail("format", detail="no code in the completion")
        return Job(code, io=tuple((str(c["stdin"]), str(c["stdout"])) for c in io))
    tests, entry = example.get("tests"), example.get("entry_point")  # data fields, not config
    if not isinstance(tests, str) or not isinstance(entry, str) or not tests.strip() or not entry:
        return Outcome.task_fail("no_tests", "the example needs 'tests' and 'entry_point' (or 'io')")
    code, answer = extract_code(completion, entry), after_trace(completion)
    prelude = example.get("prelude") or ""
    if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        program = f"{prelude}\n\n{code}\n" if prelude else code
    elif prelude and answer.strip():
        program = prelude + answer  # the body of the function the prelude opens
    elif code.strip():
        program = code
    else:
        return Outcome.model_fail("format", detail="no code in the completion")
    timeout_s = example.get("timeout_s")  # the task's own bound (evalplus: room for its per-input limits)
    return Job(program, entry, tests, prelude, timeout_s=timeout_s if isinstance(timeout_s, (int, float)) else None)


def _program_of(completion: str, example: dict) -> str:
    """The code of a task judged as a whole program: a module a pytest suite imports or a stdin
    program keeps its top-level statements; a function a suffix calls is sanitized for its entry
    point (none when the task names a synthetic one: every definition is kept)."""
    entry = example.get("entry_point")
    if "module" in example or "io" in example or not isinstance(entry, str):
        return extract_code(completion, whole=True)
    return extract_code(completion, None if entry.startswith("__posttrain") else entry)


def _task_job(code: str, example: dict) -> Job | Outcome:
    """A task whose program is the completion's code as a whole, inside the task's own prefix and
    suffix: pytest modules (KodCode) and LiveCodeBench's problems."""
    if not code.strip():
        return Outcome.model_fail("format", detail="no code in the completion")
    rec = {k: example[k] for k in ("tests", "module", "entry_point", "prelude", "io", "compare",
                                   "program_prefix", "program_suffix", "timeout_s") if k in example}
    try:
        return to_job({**rec, "program": code}, f"task {example.get('id', '?')}")
    except UserError as e:
        return Outcome.task_fail("bad_test", str(e))


def verify_batch(completions: list[str], examples: list[dict]) -> list[Outcome]:
    """Judge many completions at once (in parallel on the shared pool)."""
    built = [build_job(c, e) for c, e in zip(completions, examples, strict=True)]
    jobs = [b for b in built if isinstance(b, Job)]
    judged = iter(shared_pool().run(jobs) if jobs else [])
    return [next(judged) if isinstance(b, Job) else b for b in built]


def verify(completion: str, example: dict) -> Outcome:
    """Reward 1.0 iff every test passes."""
    return verify_batch([completion], [example])[0]
