"""Code datasets as published: one loader per format, each yielding the task record that RL, SFT,
eval and the sandbox share.

Formats (detected from a record's fields, or named):

- ``kodcode`` (KodCode RL and SFT subsets): ``question``, ``solution``, ``test`` (a pytest module
  doing ``from solution import f``; ``test_code`` in older revisions), ``test_info`` (declarations).
  The tests run after the ``from solution import *`` line KodCode's harness puts before them.
- ``mbpp``: the original (``text``, ``code``, ``test_list``, ``test_setup_code``) and the
  sanitized (``prompt``, ``code``, ``test_list``, ``test_imports``) releases.
- ``evalplus`` (HumanEval+ and MBPP+): ``prompt``, ``entry_point``, ``canonical_solution``,
  ``base_input``, ``plus_input``, ``atol``. Correctness as evalplus defines it: the candidate's
  output on each input against the canonical solution's, within ``atol``; ``variant="base"``
  uses the base inputs (HumanEval / MBPP), ``"plus"`` base and plus (HumanEval+ / MBPP+).
- ``livecodebench`` (code_generation_lite): ``question_content``, ``starter_code``,
  ``public_test_cases``, ``private_test_cases`` (JSON, or base64 of zlib of a pickle of JSON),
  ``metadata`` (``func_name`` for functional problems), ``difficulty``, ``contest_date``.
- ``swebench`` (SWE-bench, SWE-Gym, R2E-Gym, SWE-smith): ``instance_id``, ``repo``,
  ``base_commit``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``,
  ``problem_statement``, and ``repo_path`` (a local checkout or folder): kept whole, with ``id``
  and ``prompt`` (the problem statement) added; an episode of ``env.name=swe`` (`posttrain.envs.swe`)
  is the task, not a single completion.
- ``posttrain``: our own records (``prompt`` + ``tests``/``entry_point`` or ``io``), unchanged.

The task record (a dict; extra fields ride along): ``id``, ``prompt``, ``format``, one test form
— function-call (``tests`` defining ``check(candidate)``, ``entry_point``, ``prelude``), pytest
(``tests`` a pytest module, ``module`` the name it imports the program as) or stdin/stdout
(``io``, ``compare``) — optional ``program_prefix``/``program_suffix`` put around the
candidate's code, ``reference`` (a known-good program, for audit and SFT), ``completion`` (the
reference in a fence: the SFT target), ``task_error`` (the task is broken as published: its
samples are TASK_FAIL), and the format's own metadata (``difficulty``, ``contest_date``).

Private LiveCodeBench tests are unpickled by an unpickler that resolves no class and no
function, so only builtin values can come out, and the result must be a string (the JSON the
format stores): anything else makes that task TASK_FAIL, it never runs code while loading.
"""

from __future__ import annotations

import ast
import base64
import datetime
import io
import json
import pickle
import zlib
from typing import Callable

from posttrain.errors import UserError

PUBLISHED = ("kodcode", "mbpp", "evalplus", "livecodebench", "swebench")
FORMATS = (*PUBLISHED, "posttrain")
MAX_PRIVATE_BYTES = 256 << 20  # a decompressed test blob larger than this is refused, not read


def detect(record: dict) -> str | None:
    """The format a record's fields say, or None."""
    keys = set(record)
    if {"question", "solution"} <= keys and keys & {"test", "test_code"}:
        return "kodcode"
    if {"question_content", "public_test_cases"} <= keys:
        return "livecodebench"
    if {"canonical_solution", "base_input"} <= keys:
        return "evalplus"
    if {"test_list", "code"} <= keys:
        return "mbpp"
    if {"instance_id", "test_patch", "FAIL_TO_PASS"} <= keys:
        return "swebench"
    if keys & {"prompt", "messages", "completion", "program", "reference", "tests", "io"}:
        return "posttrain"
    return None


def convert(record: dict, where: str, fmt: str = "auto", **options) -> dict | None:
    """The task record for one published record (None when an option filters it out, e.g. a
    LiveCodeBench problem outside the ``contest_date`` window). Bad input is a `UserError`
    naming ``where``."""
    name = detect(record) if fmt == "auto" else fmt
    if name is None:
        raise UserError(f"{where}: cannot tell the dataset format from the fields {sorted(record)[:8]}; "
                        f"name it (format: one of {', '.join(FORMATS)})")
    if name not in FORMATS:
        raise UserError(f"{where}: unknown dataset format {name!r} (one of {', '.join(FORMATS)})")
    task = LOADERS[name](record, where, **options)
    if task is not None and "program" in record:  # `posttrain sandbox check`: a program to judge
        task["program"] = record["program"]
    return task


def check_format(fmt: str, where: str) -> None:
    if fmt != "auto" and fmt not in FORMATS:
        raise UserError(f"{where}: unknown dataset format {fmt!r} (one of auto, {', '.join(FORMATS)})")


# ----------------------------------------------------------------------------- field checks
def _text(rec: dict, key: str, where: str, fmt: str, allow_empty: bool = True) -> str:
    if rec.get(key) is None:
        raise UserError(f"{where}: a {fmt} record needs the field {key!r}")
    if not isinstance(rec[key], str) or (not allow_empty and not rec[key].strip()):
        raise UserError(f"{where}: field {key!r} of a {fmt} record must be a {'non-empty ' * (not allow_empty)}string")
    return rec[key]


def _str_list(rec: dict, key: str, where: str, fmt: str, required: bool = True) -> list[str]:
    value = rec.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: field {key!r} of a {fmt} record must be a list of strings")
    return list(value)


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def _indent(code: str) -> str:
    return "\n".join("    " + line if line.strip() else "" for line in code.splitlines())


# ----------------------------------------------------------------------------- KodCode
# KodCode's harness writes every test file as this line and then the record's tests
# (pipeline/step2.2_gen_unit_tests.py): many tests call the solution's functions without importing them.
KODCODE_HEADER = "from solution import *\n\n"


def kodcode(rec: dict, where: str, **_) -> dict:
    """Tests: the record's own pytest module after KodCode's ``from solution import *`` line, run
    against the candidate imported as ``solution``, as KodCode's harness runs them."""
    question = _text(rec, "question", where, "kodcode", allow_empty=False)
    tests = _text(rec, "test_code" if "test_code" in rec and "test" not in rec else "test", where, "kodcode",
                  allow_empty=False)
    tests = KODCODE_HEADER + tests
    solution = _text(rec, "solution", where, "kodcode")
    info = rec.get("test_info") or []
    if not isinstance(info, list) or not all(isinstance(i, dict) for i in info):
        raise UserError(f"{where}: field 'test_info' of a kodcode record must be a list of objects")
    names = [i["function_name"] for i in info if isinstance(i.get("function_name"), str) and i["function_name"]]
    decls = [i["function_declaration"] for i in info if isinstance(i.get("function_declaration"), str)
             and i["function_declaration"].strip()]
    prompt = question.rstrip()
    if decls and rec.get("style", "instruct") != "complete":  # "complete" questions show the signature
        prompt += ("\n\nNote that the function declaration is " + "; ".join(d.strip() for d in decls)
                   + ". Your code should be wrapped in a markdown code block.")
    pid = rec.get("question_id", rec.get("conversation_id", where))
    return {"id": str(pid), "format": "kodcode", "prompt": prompt, "tests": tests, "module": "solution",
            "entry_points": names or imported_from(tests, "solution"), "reference": solution,
            "completion": _fence(solution), "difficulty": rec.get("gpt_difficulty"), "subset": rec.get("subset")}


def imported_from(tests: str, module: str) -> list[str]:
    """The names a test module takes with ``from <module> import ...`` (none if it does not parse)."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    return [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == module
            for a in node.names if a.name != "*"]


# ----------------------------------------------------------------------------- MBPP
def mbpp(rec: dict, where: str, **_) -> dict:
    """Tests: ``test_list`` asserts (after ``test_imports`` / ``test_setup_code``) calling the
    function the reference ``code`` defines; the judge routes that name to the candidate."""
    code = _text(rec, "code", where, "mbpp", allow_empty=False)
    asserts = _str_list(rec, "test_list", where, "mbpp")
    if not asserts:
        raise UserError(f"{where}: field 'test_list' of an mbpp record is empty")
    setup = "\n".join(_str_list(rec, "test_imports", where, "mbpp", required=False))
    setup += "\n" + (_text(rec, "test_setup_code", where, "mbpp") if rec.get("test_setup_code") is not None else "")
    text = rec["prompt"] if isinstance(rec.get("prompt"), str) else _text(rec, "text", where, "mbpp")
    entry = _mbpp_entry(code, asserts)
    if entry is None:
        raise UserError(f"{where}: no function of the mbpp record's 'code' is called by its 'test_list'")
    tests = f"{setup.strip()}\n\ndef check(candidate):\n{_indent(chr(10).join(asserts))}\n"
    # The MBPP paper's prompt (Austin et al., 2021), without its few-shot examples.
    prompt = (f"You are an expert Python programmer, and here is your task: {text.strip()} "
              "Your code should pass these tests:\n\n" + "\n".join(asserts))
    return {"id": str(rec.get("task_id", where)), "format": "mbpp", "prompt": prompt, "tests": tests,
            "entry_point": entry, "prelude": "", "reference": code, "completion": _fence(code)}


def _mbpp_entry(code: str, asserts: list[str]) -> str | None:
    """The first function the reference defines at top level that the asserts call."""
    try:
        defined = [n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        called = {n.func.id for a in asserts for n in ast.walk(ast.parse(a))
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    except SyntaxError:
        return None
    return next((name for name in defined if name in called), None)


# ----------------------------------------------------------------------------- evalplus
def evalplus(rec: dict, where: str, variant: str = "plus", **_) -> dict:
    """Judged as evalplus judges (`posttrain.data.evalplus`): ``variant="base"`` on the base
    inputs (HumanEval / MBPP), ``"plus"`` on base then plus inputs (HumanEval+ / MBPP+)."""
    from posttrain.data import evalplus as ep

    if variant not in ("base", "plus"):
        raise UserError(f"{where}: evalplus variant must be base or plus, got {variant!r}")
    task_id = _text(rec, "task_id", where, "evalplus")
    prompt = _text(rec, "prompt", where, "evalplus")
    entry = _text(rec, "entry_point", where, "evalplus", allow_empty=False)
    reference = prompt + _text(rec, "canonical_solution", where, "evalplus")
    mbpp_task = task_id.startswith("Mbpp/")
    number = task_id.rsplit("/", 1)[-1]
    groups = []
    for key in ("base_input", "plus_input") if variant == "plus" else ("base_input",):
        inputs = _evalplus_inputs(rec, key, where)
        groups.append(ep.mbpp_inputs(int(number), inputs) if mbpp_task and number.isdigit() else inputs)
    atol = rec.get("atol") or 0
    if not isinstance(atol, (int, float)):
        raise UserError(f"{where}: field 'atol' of an evalplus record must be a number")
    oracle = ep.oracle_of(task_id, entry)
    not_none = {"program_suffix": ep.NOT_NONE_ENTRY.format(name=entry)} if oracle == "not_none" else {}
    return {"id": task_id, "format": "evalplus", "variant": variant, "prompt": prompt,
            "tests": ep.check_source(reference, entry, groups, atol, oracle),
            "entry_point": "__posttrain_entry__" if not_none else entry, "prelude": "" if mbpp_task else prompt,
            "reference": reference, "completion": _fence(reference), "timeout_s": ep.task_timeout_s(len(groups)),
            **not_none}


def _evalplus_inputs(rec: dict, key: str, where: str) -> list:
    """A record's input list: JSON text in some exports; ``{}`` (Mbpp/793's plus_input) is none."""
    value = rec.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise UserError(f"{where}: field {key!r} of an evalplus record is not JSON ({e})") from None
    if value == {}:
        return []
    if not isinstance(value, list) or not all(isinstance(args, list) for args in value):
        raise UserError(f"{where}: field {key!r} of an evalplus record must be a list of argument lists")
    return value


# ----------------------------------------------------------------------------- LiveCodeBench
# What LiveCodeBench puts in front of every program it grades (the same modules, star-imported).
LCB_HEADER = "".join(f"from {m} import *\n" for m in (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
    "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")) + \
    "import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, " \
    "functools, operator, io, sys, json\nsys.setrecursionlimit(50000)\n"
# After the program: the entry the judge calls. LeetCode problems are methods of `Solution`, one
# instance for all inputs as LiveCodeBench does; other functional problems name a function.
LCB_ENTRY = '''

_posttrain_instance = []
def __posttrain_entry__(*args):
    if "Solution" in globals():
        if not _posttrain_instance:
            _posttrain_instance.append(Solution())
        return getattr(_posttrain_instance[0], {name!r})(*args)
    return globals()[{name!r}](*args)
'''
LCB_CHECK = '''
import json as _json
_CASES = _json.loads({cases!r})


def check(candidate):
    for i, (args, expected) in enumerate(_CASES):
        got = candidate(*args)
        if type(got) is tuple:  # as LiveCodeBench: a tuple answers for a list
            got = list(got)
        assert got == expected, f"test {{i}}: wrong output"
'''


class _StringsOnly(pickle.Unpickler):
    """Resolves no global: only the pickle protocol's own builtin values can be built."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def decode_private_tests(blob: str) -> list:
    """LiveCodeBench's private tests: JSON, or base64 → zlib → pickle → JSON. Raises ValueError
    (never runs code) when the blob is anything else, or unpickles to anything but a string."""
    try:
        return json.loads(blob)
    except ValueError:
        pass
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(blob.encode("ascii"), validate=False), MAX_PRIVATE_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"private tests over {MAX_PRIVATE_BYTES} bytes")
        value = _StringsOnly(io.BytesIO(raw)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError, KeyError, IndexError,
            AttributeError, UnicodeError) as e:
        raise ValueError(f"private tests do not decode: {type(e).__name__}: {e}") from None
    if type(value) is not str:
        raise ValueError(f"private tests unpickle to {type(value).__name__}, not a JSON string")
    return json.loads(value)


def _lcb_cases(rec: dict, where: str) -> tuple[list, str]:
    """(test cases, why the task is broken or ''): public then private, each {input, output, testtype}."""
    public = rec.get("public_test_cases")
    if not isinstance(public, (str, list)):
        raise UserError(f"{where}: a livecodebench record needs the field 'public_test_cases' (JSON text or a list)")
    try:
        cases = json.loads(public) if isinstance(public, str) else public
    except ValueError:
        raise UserError(f"{where}: field 'public_test_cases' of a livecodebench record is not JSON") from None
    problem = ""
    private = rec.get("private_test_cases")
    if isinstance(private, str) and private.strip():
        try:
            cases = list(cases) + list(decode_private_tests(private))
        except ValueError as e:
            problem = str(e)
    if not isinstance(cases, list) or not all(isinstance(c, dict) and isinstance(c.get("input"), str)
                                              and isinstance(c.get("output"), str) for c in cases):
        return [], "test cases must be objects with string input and output"
    return cases, problem


def _date(value, where: str, key: str) -> datetime.datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, datetime.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, datetime.date):
        return datetime.datetime(value.year, value.month, value.day)
    try:
        return datetime.datetime.fromisoformat(str(value)).replace(tzinfo=None)
    except ValueError:
        raise UserError(f"{where}: {key} {value!r} is not an ISO date (YYYY-MM-DD)") from None


def livecodebench(rec: dict, where: str, since=None, until=None, **_) -> dict | None:
    """Stdin/stdout problems compared line by line as LiveCodeBench does (stripped lines, then
    numbers as decimals); functional ones call ``metadata.func_name`` (a ``Solution`` method)."""
    content = _text(rec, "question_content", where, "livecodebench", allow_empty=False)
    date = _date(rec.get("contest_date"), where, "contest_date")
    lo, hi = _date(since, "livecodebench", "since"), _date(until, "livecodebench", "until")
    if date is not None and ((lo and date < lo) or (hi and date >= hi)):
        return None
    starter = rec.get("starter_code") or ""
    meta = rec.get("metadata") or "{}"
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except ValueError:
        raise UserError(f"{where}: field 'metadata' of a livecodebench record is not JSON") from None
    cases, problem = _lcb_cases(rec, where)
    task = {"id": str(rec.get("question_id", where)), "format": "livecodebench", "prompt": _lcb_prompt(content, starter),
            "difficulty": rec.get("difficulty"), "platform": rec.get("platform"),
            "contest_date": date.isoformat() if date else None, "program_prefix": LCB_HEADER}
    if problem or not cases:
        return {**task, "io": [{"stdin": "", "stdout": ""}], "task_error": problem or "no test cases"}
    func = meta.get("func_name") if isinstance(meta, dict) else None
    if func:
        try:
            pairs = [[[json.loads(line) for line in c["input"].split("\n")], json.loads(c["output"])] for c in cases]
        except ValueError:
            return {**task, "io": [{"stdin": "", "stdout": ""}], "task_error": "functional test not JSON"}
        return {**task, "tests": LCB_CHECK.format(cases=json.dumps(pairs)), "entry_point": "__posttrain_entry__",
                "prelude": "", "program_suffix": LCB_ENTRY.format(name=func)}
    return {**task, "io": [{"stdin": c["input"], "stdout": c["output"]} for c in cases], "compare": "tokens"}


def _lcb_prompt(content: str, starter: str) -> str:
    """LiveCodeBench's own question template for chat models (its system message, which asks for
    the program alone, is left to the chat template or the recipe)."""
    if starter.strip():
        fmt = ("You will use the following starter code to write the solution to the problem and enclose "
               f"your code within delimiters.\n```python\n{starter}\n```")
    else:
        fmt = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
               "on the sample inputs). Enclose your code within delimiters as follows.\n```python\n# YOUR CODE HERE\n```")
    return f"### Question:\n{content}\n\n### Format: {fmt}\n\n### Answer: (use the provided format with backticks)\n\n"


# ----------------------------------------------------------------------------- SWE-bench
def swebench(rec: dict, where: str, **_) -> dict:
    """The record whole (the environment reads its fields), with ``id`` and ``prompt``."""
    for key in ("instance_id", "problem_statement"):
        _text(rec, key, where, "swebench", allow_empty=False)
    return {**rec, "id": rec["instance_id"], "format": "swebench", "prompt": rec["problem_statement"]}


# ----------------------------------------------------------------------------- ours
def posttrain(rec: dict, where: str, **_) -> dict:
    return dict(rec)


LOADERS: dict[str, Callable[..., dict | None]] = {"kodcode": kodcode, "mbpp": mbpp, "evalplus": evalplus,
                                                   "livecodebench": livecodebench, "swebench": swebench,
                                                   "posttrain": posttrain}
