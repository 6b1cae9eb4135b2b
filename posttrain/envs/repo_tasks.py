"""The embedded repository tasks: a small package with one seeded bug, its tests, its fix.

Each task is a package ``pkg`` with a module ``ops.py`` of two (or more) small functions drawn from a
catalogue (add a constant, scale, count the items above a bound, clamp, take a prefix, test
divisibility; each with its own constant), one of which carries a seeded one-line bug (the
constant off by one, or a wrong operator). ``tests/test_ops.py`` (visible) has one assert per
function and fails on the buggy one; the hidden tests (``check(call)``) try four inputs of every
function, so a fix that breaks another function does not pass either. ``fix`` is the correct
``ops.py`` (the audit's oracle). Every generated task is checked here when it is made: the correct
module passes all its tests and the buggy one fails a visible and a hidden test.

Train and held-out tasks never share a (catalogue choice, bug, constants) combination: a task's
split is a hash of that combination with the functions in sorted order (`content_key`), so the
same module with its functions listed the other way round is never a held-out task. `sft_record` writes the trace of a good episode (run the tests, read
the module, replace the buggy line, submit) for a warm start by `posttrain sft`, with the tool
outputs exactly as `posttrain.envs.repo` prints them; some traces can first miss with a
``replace`` and recover (the missed call kept out of the loss).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from posttrain.envs.repo import DEFAULT_PROMPT, report_line
from posttrain.envs.tools import format_call, with_tools_message

# name -> (body with K, parameter, bugs (body with K), visible input, hidden inputs)
CATALOGUE: dict[str, tuple[str, str, tuple[str, ...], object, tuple]] = {
    "add_k": ("return x + K", "x", ("return x - K", "return x + K + 1"), 2, (0, 5, -3, 11)),
    "scale": ("return x * K", "x", ("return x + K", "return x * (K + 1)"), 3, (0, 1, -2, 7)),
    "count_above": ("return sum(1 for v in xs if v > K)", "xs",
                    ("return sum(1 for v in xs if v >= K)", "return sum(1 for v in xs if v < K)"),
                    "[1, K, K + 1, K + 5]", ("[]", "[K]", "[K - 1, K, K + 2]", "[0, K + 1, K + 9, 2]")),
    "clamp": ("return max(0, min(x, K))", "x", ("return max(0, min(x, K - 1))", "return min(0, max(x, K))"),
              "K + 4", (-5, 0, 1, "K + 1")),
    "take": ("return xs[:K]", "xs", ("return xs[:K - 1]", "return xs[K:]"),
             "list(range(10))", ("[]", "[1, 2]", "list(range(K + 3))", "list(range(20))")),
    "is_multiple": ("return x % K == 0", "x", ("return x % K == 1", "return x % (K + 1) == 0"),
                    "K * 3", (0, 1, "K", "K * 7 + 1")),
}
HELD_OUT_FRAC = 0.2
_SALT = "posttrain-repo-v1"


def _expr(value, k: int) -> str:
    """A test input as source, with the function's constant substituted."""
    return str(value).replace("K", str(k)) if isinstance(value, str) else repr(value)


def _source(name: str, body: str, k: int) -> str:
    param = CATALOGUE[name][1]
    return f"def {name}({param}):\n    {body.replace('K', str(k))}\n"


def _evaluate(source: str, name: str, arg_src: str):
    ns: dict = {}
    exec(source, ns)  # our own generated code
    try:
        return ns[name](eval(arg_src, {}))
    except Exception as e:  # a buggy body may raise
        return e


def content_key(names: tuple[str, ...], buggy: int, bug: int, ks: tuple[int, ...]) -> str:
    """What a task is whatever order its functions are listed in: each function with its constant
    (and the bug, on the buggy one), sorted. The split hashes this, not the id, which has the order."""
    parts = (f"{n}={k}" + (f"!{bug}" if i == buggy else "") for i, (n, k) in enumerate(zip(names, ks)))
    return "/".join(sorted(parts))


def split_of(key: str) -> str:
    digest = hashlib.sha256(f"{_SALT}:{key}".encode()).digest()
    return "eval" if int.from_bytes(digest[:4], "big") / 2**32 < HELD_OUT_FRAC else "train"


def make_task(names: tuple[str, ...], buggy: int, bug: int, ks: tuple[int, ...]) -> dict | None:
    """One task, or None when the bug does not show on the visible and the hidden inputs, or when
    the buggy line is not the only one of its kind in the module (no ``replace`` could name it)."""
    correct = "\n\n".join(_source(n, CATALOGUE[n][0], k) for n, k in zip(names, ks))
    bugged = "\n\n".join(_source(n, CATALOGUE[n][2][bug] if i == buggy else CATALOGUE[n][0], k)
                     for i, (n, k) in enumerate(zip(names, ks)))
    visible = ["from pkg.ops import " + ", ".join(names) + "\n"]
    hidden = ["def check(call):\n"]
    seen_visible = seen_hidden = False
    for i, (name, k) in enumerate(zip(names, ks)):
        arg = _expr(CATALOGUE[name][3], k)
        want = _evaluate(correct, name, arg)
        visible.append(f"\n\ndef test_{name}():\n    assert {name}({arg}) == {want!r}, {name}({arg})\n")
        seen_visible |= i == buggy and _evaluate(bugged, name, arg) != want
        for x in CATALOGUE[name][4]:
            arg = _expr(x, k)
            want = _evaluate(correct, name, arg)
            hidden.append(f"    assert call('pkg.ops.{name}', {arg}) == {want!r}\n")
            seen_hidden |= i == buggy and _evaluate(bugged, name, arg) != want
    k = str(ks[buggy])
    old = f"    {CATALOGUE[names[buggy]][2][bug].replace('K', k)}"  # the buggy line, and its fix
    new = f"    {CATALOGUE[names[buggy]][0].replace('K', k)}"
    if not (seen_visible and seen_hidden) or bugged.count(old + "\n") != 1:
        return None
    task_id = f"repo/{'-'.join(names)}/{buggy}{bug}/{'-'.join(map(str, ks))}"
    return {"id": task_id, "prompt": DEFAULT_PROMPT,
            "files": {"pkg/ops.py": bugged, "tests/test_ops.py": "".join(visible)},
            "hidden_tests": "".join(hidden), "fix": {"pkg/ops.py": correct},
            "bug": {"path": "pkg/ops.py", "old": old, "new": new}}


def minimal_edit(text: str, old: str, new: str) -> tuple[str, str]:
    """The shortest whole-word span of the line ``old`` (and its counterpart in ``new``) that covers
    the change, occurs once in ``text`` and leaves something to write: what a good ``replace`` call
    sends (less to copy than the whole line)."""
    a, b = old.split(" "), new.split(" ")
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    lo, hi_a, hi_b = p, len(a) - s, len(b) - s
    while True:
        span_a, span_b = " ".join(a[lo:hi_a]), " ".join(b[lo:hi_b])
        if span_a.strip() and span_b.strip() and text.count(span_a) == 1:
            return span_a, span_b
        if lo > 0 and a[lo - 1]:
            lo -= 1
        elif hi_a < len(a):
            hi_a, hi_b = hi_a + 1, hi_b + 1
        else:
            return old, new


def sample_tasks(n: int, *, split: str = "train", seed: int = 0, functions: int = 2) -> list[dict]:
    """``n`` distinct tasks of ``split`` (train or eval), each module with ``functions`` functions."""
    rng, out, seen = random.Random(f"{seed}:{split}"), [], set()
    for _ in range(200 * n + 1000):
        if len(out) == n:
            break
        names = tuple(rng.sample(sorted(CATALOGUE), functions))
        ks = tuple(rng.randint(2, 9) for _ in names)
        buggy, bug = rng.randrange(functions), rng.randrange(2)
        if split_of(content_key(names, buggy, bug, ks)) != split:
            continue
        task = make_task(names, buggy, bug, ks)
        if task is None or task["id"] in seen:
            continue
        seen.add(task["id"])
        out.append(task)
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct {split} tasks could be drawn (asked for {n})")
    return out


def expected_report(task: dict) -> str:
    """What ``run_tests`` shows on the task's unfixed project."""
    names = [line.split("(")[0][4:] for line in task["fix"]["pkg/ops.py"].splitlines() if line.startswith("def ")]
    path, lines, failed = "tests/test_ops.py", [], 0
    test_src = task["files"][path]
    for name in names:
        assert_line = next(s.strip() for s in test_src.splitlines() if s.strip().startswith(f"assert {name}("))
        arg = assert_line[len(f"assert {name}("):assert_line.index(") ==")]
        got = _evaluate(task["files"]["pkg/ops.py"], name, arg)
        want = _evaluate(task["fix"]["pkg/ops.py"], name, arg)
        if got == want:
            continue
        failed += 1
        error = f"AssertionError: {got}" if not isinstance(got, Exception) else f"{type(got).__name__}: {got}"
        lines.append(report_line(path, f"test_{name}", assert_line, error))
    return "\n".join(lines + [f"{len(names) - failed} passed, {failed} failed"])


def miscopies(text: str, old: str, new: str) -> list[str]:
    """Plausible wrong copies of ``old`` (a ``replace`` that misses): the fixed text written as the
    old one, the constant off, a word dropped or doubled; only those that do not occur exactly once
    in ``text``, so the call fails."""
    words = old.split(" ")
    wrong = [new] + [old.replace(d, str((int(d) + 1) % 10), 1) for d in sorted(set(filter(str.isdigit, old)))]
    wrong += [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]
    wrong += [" ".join(words[:i + 1] + words[i:]) for i in range(len(words))]
    return [w for w in dict.fromkeys(wrong) if w.strip() and w != old and text.count(w) != 1]


def sft_record(task: dict, tools, tools_style: str = "compact", retry: random.Random | None = None,
               give_up: bool = False) -> dict:
    """The conversation of a good episode: run the tests, read the module, fix the line, submit.

    With ``give_up`` the trace submits right after the tests, the project unchanged (what a model
    that gives up does; it never passes, so RL has that choice to unlearn).

    With ``retry`` (a random source) the first ``replace`` misses (a `miscopies` pick) and the
    next one gets it right: the missed call has ``"weight": 0``, so SFT shows the model the
    environment's error and the recovery without teaching it to miss. The error is the one the
    environment prints (it is asked)."""
    prompt = task["prompt"].replace("{files}", ", ".join(task["files"]))
    messages = with_tools_message([{"role": "user", "content": prompt}], tools, tools_style)
    steps = [("run_tests", {}, expected_report(task), 1)]
    if not give_up:
        steps += _fix_steps(task, tools_style, retry)
    for name, args, result, weight in steps:
        call = {"role": "assistant", "content": format_call(name, args)}
        messages += [call if weight else {**call, "weight": 0}, {"role": "tool", "name": name, "content": result}]
    return {"messages": messages + [{"role": "assistant", "content": format_call("submit", {})}]}


def _fix_steps(task: dict, tools_style: str, retry: random.Random | None) -> list[tuple]:
    """``(tool, arguments, result, weight)`` of reading the module and fixing the line, a missed
    ``replace`` first (weight 0) when ``retry`` is given."""
    from posttrain.envs.repo import RepoEnv

    bug, text = task["bug"], task["files"][task["bug"]["path"]]
    old, new = minimal_edit(text, bug["old"], bug["new"])
    steps = [("read_file", {"path": bug["path"]}, text, 1)]
    wrong = miscopies(text, old, new) if retry is not None else []
    if wrong:
        env = RepoEnv(tools_style=tools_style)
        env.reset(task)
        args = {"path": bug["path"], "old": retry.choice(wrong), "new": new}
        [error] = env.step(format_call("replace", args)).observation
        steps.append(("replace", args, error["content"], 0))
    fixed = f"replaced 1 occurrence in {bug['path']}"
    return steps + [("replace", {"path": bug["path"], "old": old, "new": new}, fixed, 1)]


def write_repo_data(out_dir: str | Path, *, n_train: int = 2000, n_eval: int = 200, seed: int = 0,
                    tools_style: str = "compact", retry_frac: float = 0.0,
                    give_up_frac: float = 0.0) -> dict[str, Path]:
    """``prompts_train.jsonl`` / ``prompts_eval.jsonl`` (tasks) and ``sft_train.jsonl`` (traces;
    ``retry_frac`` of them miss with a first ``replace`` and retry, ``give_up_frac`` of them submit
    unfixed, see `sft_record`)."""
    for name, frac in (("retry_frac", retry_frac), ("give_up_frac", give_up_frac)):
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"{name} must be within [0, 1], got {frac}")
    from posttrain.data.records import write_jsonl
    from posttrain.envs.repo import RepoEnv

    tools = RepoEnv().tools
    out, written = Path(out_dir), {}
    for split, n in (("train", n_train), ("eval", n_eval)):
        tasks = sample_tasks(n, split=split, seed=seed)
        written[f"prompts_{split}"] = write_jsonl(out / f"prompts_{split}.jsonl", tasks)
        if split == "train":
            rng, quit_rng = random.Random(f"{seed}:retry"), random.Random(f"{seed}:give-up")
            written["sft_train"] = write_jsonl(out / "sft_train.jsonl", [
                sft_record(t, tools, tools_style, retry=rng if rng.random() < retry_frac else None,
                           give_up=quit_rng.random() < give_up_frac) for t in tasks])
    return written
