"""The docs' commands are tests: every ```bash block in README.md and docs/*.md runs, as written.

Each block is one test (``pytest -m docs``), run with ``bash -e`` in a workspace of its page: a
fresh folder with the checkout's ``examples/``, ``scripts/``, ``bench/`` and virtual environments
linked in, and the outputs of the README's "A first session by hand" (``runs/tiny-model``,
``runs/arith-data``, ``runs/sft-arith``) copied in, since every page assumes a reader who did it.
The blocks of a page run in order in the same workspace, so a block may use what an earlier one
wrote. A failing command, a moved flag or a missing file fails the block.

Sizes. With ``POSTTRAIN_DOCS_SMALL=1`` (what the ``docs`` lane sets unless told otherwise) every
``posttrain`` and ``torchrun`` a block calls goes through :func:`small_argv`, which appends
overrides that make it cheap without changing what it means: the nano model, a few hundred
problems, tiny batches and generations; step counts stay, so checkpoint paths the docs name
(``checkpoints/step-300``) exist. ``POSTTRAIN_DOCS_SMALL=0`` runs the documented sizes.

A block that cannot run here says why in the doc, on the line before it::

    <!-- docs-test: skip (needs a GPU) -->

A block whose documented step counts take minutes even at those sizes names, on the line before
it, overrides that some of its commands get on top of the small ones (per subcommand; inside a
``sweep``, the swept command's), e.g. fewer SFT steps and the RL run started from that step's
checkpoint; they bind only under ``POSTTRAIN_DOCS_SMALL``::

    <!-- docs-test: small (sft: num_steps=100; rl: model.path=runs/sft/checkpoints/step-100) -->

Command transcripts (a command and what it printed) are ```text blocks; an unlabelled block that
starts with a command is an error, so a new page cannot slip past the harness.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = ["examples", "scripts", "bench", "tests", "posttrain", "pyproject.toml", "constraints.txt",
          ".venv", ".venv-vllm", ".venv-verifiers"]
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<why>[^)]+)\) -->$")
SMALLER = re.compile(r"^<!-- docs-test: small \((?P<args>[^)]+)\) -->$")
EXTRA_ENV = "POSTTRAIN_DOCS_EXTRA"  # a block's own small overrides: its SMALLER marker's text


def block_overrides(text: str) -> dict[str, tuple[str, ...]]:
    """A SMALLER marker's ``CMD: key=value ...; CMD: ...`` as {CMD: overrides}."""
    out = {}
    for part in filter(str.strip, text.split(";")):
        cmd, sep, args = part.partition(":")
        if not sep or cmd.strip() not in SMALL or not args.split():
            raise ValueError(f"docs-test small marker: {part.strip()!r} is not 'COMMAND: key=value ...'")
        out[cmd.strip()] = tuple(args.split())
    return out
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)
COMMAND = re.compile(r"^\s*(\$ )?(posttrain [a-z-]+( |$)|torchrun |\.venv/bin/|bash scripts/|python )")
BLOCK_TIMEOUT_S = 540  # under pytest's own 600

# Appended to a subcommand's own arguments (later overrides win); "{max_len}" is the block's
# data.max_len, so packing still fits one sample.
SMALL = {
    "make-tiny": ["--size", "nano"],
    "make-data": ["--n-train", "200", "--n-eval", "16"],
    "make-env-data": ["--n-train", "40", "--n-eval", "8"],
    "sft": ["data.tokens_per_batch={max_len}"],
    "rl": ["prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "data.eval_max_prompts=4",
           "dynamic_sampling.max_rounds=1"],
    "distill": ["prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                "data.eval_max_prompts=4"],
    "dpo": ["batch_pairs=4"],
    "rm": ["batch_pairs=4"],
    "demo": ["--profile", "quick"],
    "study": ["--profile", "smoke"],
    "sweep": [],
}
QUIET = {"sft", "rl", "distill", "dpo", "rm"}  # no progress bars in a captured log
# Capped only where a block sets them (setting one where it is not set can be an error).
CAPPED = {"eval_generate": "4"}


def small_argv(argv: list[str], block: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """``argv`` (``posttrain CMD ...`` or ``torchrun ... -m posttrain CMD ...``) made cheap; a
    training command also gets its block's own overrides for it (``block[CMD]``; they win)."""
    block = block or {}
    head = argv.index("posttrain") + 1 if argv[0] == "torchrun" and "posttrain" in argv else 1
    if head >= len(argv) or argv[head] not in SMALL:
        return argv
    cmd, args = argv[head], list(argv[head + 1:])
    if cmd == "sweep":  # the swept command's overrides go right after its config, the block's after the shared ones; one seed
        inner = args[args.index("--command") + 1] if "--command" in args else "rl"
        flags = next((i for i, a in enumerate(args) if i and a.startswith("--")), len(args))
        return (argv[:head + 2] + small_argv(["posttrain", inner])[2:] + args[1:flags] + list(block.get(inner, ()))
                + args[flags:] + ["--seeds", "1"])
    max_len = max([256] + [int(a.split("=", 1)[1]) for a in args if a.startswith("data.max_len=")])
    extra = [a.format(max_len=max_len) for a in SMALL[cmd]]
    extra += [f"{key}={v}" for key, v in CAPPED.items() if any(a.startswith(key + "=") for a in args)]
    if cmd in QUIET:
        extra += ["logging.progress=false", *block.get(cmd, ())]
    return argv[:head + 1] + args + extra


def shim_main(argv: list[str]) -> None:
    """Entry of the shell functions ``posttrain`` and ``torchrun`` a block sees."""
    if os.environ.get("POSTTRAIN_DOCS_SMALL", "1") != "0":
        argv = small_argv(argv, block_overrides(os.environ.get(EXTRA_ENV, "")))
    real = str(ROOT / ".venv" / "bin" / argv[0])
    os.execv(real, [real, *argv[1:]])


def blocks() -> list[tuple[Path, int, str, str, str]]:
    """(page, line, body, why skipped or "", the block's own small overrides or "") for every
    ```bash block, in page order."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") not in ("bash", "sh", "shell"):
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            skip, smaller = SKIP.match(before), SMALLER.match(before)
            out.append((page, line, m.group("body"), skip.group("why") if skip else "",
                        smaller.group("args") if smaller else ""))
    return out


def test_command_blocks_are_labelled():
    """An unlabelled block that starts with a command would not be run: label it bash (run, or
    skipped with a reason) or text (a transcript)."""
    unlabelled = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            first = next((x for x in m.group("body").splitlines() if x.strip()), "")
            if m.group("lang") == "" and COMMAND.match(first):
                unlabelled.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert unlabelled == [], "unlabelled command blocks: " + ", ".join(unlabelled)


def test_skip_markers_give_a_reason_and_precede_a_block():
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("<!-- docs-test"):  # a marker is a line of its own
                assert SKIP.match(line.strip()) or SMALLER.match(line.strip()), \
                    f"{page.name}:{i + 1}: malformed marker {line!r}"
                assert i + 1 < len(lines) and lines[i + 1].startswith("```bash"), \
                    f"{page.name}:{i + 1}: a docs-test marker must sit on the line before a ```bash block"


def test_small_argv_appends_overrides_that_win_and_keeps_step_counts():
    assert small_argv(["posttrain", "make-tiny", "runs/m", "--size", "tiny"]) == \
        ["posttrain", "make-tiny", "runs/m", "--size", "tiny", "--size", "nano"]
    sft = small_argv(["posttrain", "sft", "x.yaml", "num_steps=150", "data.max_len=768"])
    assert sft[:5] == ["posttrain", "sft", "x.yaml", "num_steps=150", "data.max_len=768"]
    assert "data.tokens_per_batch=768" in sft and "logging.progress=false" in sft and "eval_generate=4" not in sft
    assert small_argv(["posttrain", "sft", "x.yaml", "eval_generate=100"])[-2] == "eval_generate=4"
    ranks = small_argv(["torchrun", "--nproc-per-node", "2", "-m", "posttrain", "rl", "x.yaml"])
    assert ranks[:7] == ["torchrun", "--nproc-per-node", "2", "-m", "posttrain", "rl", "x.yaml"]
    assert "rollout.group_size=2" in ranks
    assert small_argv(["posttrain", "report", "runs/a"]) == ["posttrain", "report", "runs/a"]
    sweep = small_argv(["posttrain", "sweep", "s.yaml", "num_steps=30", "--command", "sft", "--seeds", "3"])
    assert sweep[:3] == ["posttrain", "sweep", "s.yaml"] and sweep[3].startswith("data.tokens_per_batch=")
    assert sweep[-7:] == ["num_steps=30", "--command", "sft", "--seeds", "3", "--seeds", "1"]


def test_a_blocks_own_small_overrides_win_in_their_command_only():
    block = block_overrides("sft: num_steps=20 save_every=20; rl: model.path=m/step-20")
    assert block == {"sft": ("num_steps=20", "save_every=20"), "rl": ("model.path=m/step-20",)}
    sft = small_argv(["posttrain", "sft", "x.yaml", "num_steps=1000"], block)
    assert sft[3] == "num_steps=1000" and sft[-2:] == ["num_steps=20", "save_every=20"]
    assert small_argv(["posttrain", "rl", "y.yaml"], block)[-1] == "model.path=m/step-20"
    assert "num_steps=20" not in small_argv(["posttrain", "dpo", "z.yaml"], block)
    assert small_argv(["posttrain", "report", "runs/a"], block) == ["posttrain", "report", "runs/a"]
    sweep = small_argv(["posttrain", "sweep", "s.yaml", "num_steps=30", "--grid", "optim.lr=1,2"], {"rl": ("num_steps=5",)})
    assert sweep[sweep.index("num_steps=30") + 1] == "num_steps=5"  # after the shared overrides, before the grid
    assert sweep[-4:] == ["--grid", "optim.lr=1,2", "--seeds", "1"]
    bare = small_argv(["posttrain", "sweep", "s.yaml", "--command", "sft"], block)
    assert bare.index("num_steps=20") < bare.index("--command") and "model.path=m/step-20" not in bare
    for bad in ("num_steps=20", "train: num_steps=20", "sft:"):
        with pytest.raises(ValueError, match="docs-test small marker"):
            block_overrides(bad)


def test_each_small_marker_binds_the_block_under_it_and_parses():
    found = {(p, line): extra for p, line, _, _, extra in blocks() if extra}
    assert found  # the pages use them (docs/ray.md, docs/envs.md, ...)
    for (page, line), extra in found.items():
        assert page.read_text().splitlines()[line - 2] == f"<!-- docs-test: small ({extra}) -->"
        block_overrides(extra)


def _run(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[docs-test] timed out after {BLOCK_TIMEOUT_S} s"
    finally:  # a block's background servers end with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _preamble() -> str:
    py, me = ROOT / ".venv" / "bin" / "python", Path(__file__).resolve()
    return (f'export PATH="{ROOT}/.venv/bin:$PATH" OMP_NUM_THREADS=1\n'
            f'posttrain() {{ "{py}" "{me}" posttrain "$@"; }}\n'
            f'torchrun() {{ "{py}" "{me}" torchrun "$@"; }}\n'
            "export -f posttrain torchrun\n")


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("POSTTRAIN_DOCS_SMALL", "1")
    env.pop("PYTHONPATH", None)
    return env


def _workspace(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (ROOT / name).exists() and not (root / name).exists():
            (root / name).symlink_to(ROOT / name)
    return root


def first_session_sft() -> str:
    """The README's "A first session by hand" up to its SFT (what the other pages build on)."""
    body = next(body for page, _, body, *_ in blocks() if page.name == "README.md" and "posttrain sft" in body)
    return "".join(line + "\n" for line in body.splitlines() if line.startswith(("posttrain make-", "posttrain sft")))


@pytest.fixture(scope="session")
def docs_root():
    """Workspaces outside pytest's numbered temp folders, which a concurrent pytest run may prune."""
    with tempfile.TemporaryDirectory(prefix="posttrain-docs-") as root:
        yield Path(root)


README = ROOT / "README.md"
FIRST_SESSION = ("tiny-model", "arith-data", "sft-arith")  # what first_session_sft() writes under runs/


class Workspaces:
    """A workspace per page, made when its first block runs. Every page but the README starts with
    the README's first session done: the README's own block runs it (pages run in order), and its
    outputs are copied rather than trained a second time; when that block did not pass (or was not
    selected), the first session runs here on its own."""

    def __init__(self, root: Path):
        self.root, self.made, self.first, self.readme_passed = root, {}, None, False

    def get(self, page: Path) -> Path:
        if page not in self.made:
            ws = _workspace(self.root / page.stem)
            if page != README:
                shutil.copytree(self.first_session(), ws / "runs", symlinks=True)
            self.made[page] = ws
        return self.made[page]

    def first_session(self) -> Path:
        if self.first is None:
            self.first = self._from_readme() or self._run()
        return self.first

    def _from_readme(self) -> Path | None:
        runs = self.made[README] / "runs" if README in self.made else None
        if not self.readme_passed or not all((runs / name).is_dir() for name in FIRST_SESSION):
            return None
        out = self.root / "first-session" / "runs"
        for name in FIRST_SESSION:  # the README's later commands add a report and runs no page assumes
            shutil.copytree(runs / name, out / name, symlinks=True, ignore=shutil.ignore_patterns("report.html"))
        return out

    def _run(self) -> Path:
        ws = _workspace(self.root / "first-session")
        r = _run(_preamble() + first_session_sft(), ws, _env())
        assert r.returncode == 0, r.stdout[-3000:]
        return ws / "runs"


@pytest.fixture(scope="session")
def workspaces(docs_root) -> Workspaces:
    return Workspaces(docs_root)


ALL = blocks()


@pytest.mark.docs
@pytest.mark.parametrize("page,line,body,why,extra", ALL, ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, *_ in ALL])
def test_documented_block_runs(page, line, body, why, extra, workspaces):
    if why:
        pytest.skip(why)
    script = _preamble() + body.replace(".venv/bin/posttrain", "posttrain")
    r = _run(script, workspaces.get(page), {**_env(), EXTRA_ENV: extra})
    assert r.returncode == 0, f"{page.relative_to(ROOT)}:{line} exited {r.returncode}:\n{r.stdout[-4000:]}"
    if page == README and "posttrain sft" in body:
        workspaces.readme_passed = True


if __name__ == "__main__":
    shim_main(sys.argv[1:])
