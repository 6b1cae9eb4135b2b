"""Records on disk and the typed examples built from them.

Sources (`load_records`):

- ``.jsonl`` / ``.json``: one JSON object per line, read by `posttrain.jsonl` (errors are
  ``FILE:LINE: what is wrong``); a ``.json`` file that starts with ``[`` is read as one array of
  objects. ``.jsonl.gz`` (as evalplus publishes HumanEval+ and MBPP+) is read through gzip.
- ``.parquet``: read with pyarrow; errors name the file and the 1-based row.
- a folder: written by ``datasets.Dataset.save_to_disk`` (read with ``load_from_disk``), or a
  folder of data files read with ``datasets.load_dataset(folder)`` (local only, nothing fetched).
  A ``DatasetDict`` must have a ``train`` split, which is the one read.

A source without records is an error.

Every record keeps where it came from (``file:line``), so the schema parsers (`parse_sft`,
`parse_prompt`, `parse_preference`) can raise a `UserError` that points at the offending row.
Records are plain dicts on purpose: extra fields ride along to verifiers (test cases, ids).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from posttrain.errors import UserError
from posttrain.jsonl import read_jsonl


@dataclasses.dataclass
class SFTExample:
    """One supervised example: ``prompt`` + ``completion``, or a ``messages`` conversation.

    ``prompt`` is a string or a list of chat messages (``{"role", "content"}``); with
    ``messages`` every assistant turn is trained on.
    """

    prompt: str | list[dict] | None = None
    completion: str | None = None
    messages: list[dict] | None = None


@dataclasses.dataclass
class PromptExample:
    """A prompt for RL / evaluation. ``answer`` may be None (e.g. code tasks carry tests in ``extra``)."""

    prompt: str | list[dict]
    answer: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The record as verifiers see it: extra fields plus ``prompt`` and ``answer``."""
        return {**self.extra, "prompt": self.prompt, "answer": self.answer}


@dataclasses.dataclass
class PreferenceExample:
    """A preference pair: ``chosen`` is preferred over ``rejected`` as a reply to ``prompt``."""

    prompt: str | list[dict]
    chosen: str
    rejected: str


def _is_json_array(path: Path) -> bool:
    """Whether the first character that is not whitespace is ``[``."""
    with path.open("rb") as f:
        while chunk := f.read(4096):
            if chunk.strip():
                return chunk.lstrip().startswith(b"[")
    return False


def _jsonl_rows(path: Path, name: str) -> list[tuple[str, dict]]:
    if path.suffix == ".json" and _is_json_array(path):
        try:
            items = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise UserError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{name}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise UserError(f"{name}[{i}]: expected a JSON object, got {type(item).__name__}")
        return [(f"{name}[{i}]", item) for i, item in enumerate(items)]
    return [(f"{name}:{lineno}", record) for lineno, record in read_jsonl(name)]


def _parquet_rows(path: Path, name: str) -> list[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise UserError(f"{name}: cannot read Parquet ({e})") from None
    return [(f"{name}:row {i + 1}", row) for i, row in enumerate(table.to_pylist())]


def _dataset_rows(path: Path, name: str) -> list[tuple[str, dict]]:
    import datasets

    try:
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(str(path))
    except Exception as e:
        raise UserError(f"{name}: cannot read a dataset from this folder ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise UserError(f"{name}: dataset has splits {list(ds)}, but no 'train' split")
        ds = ds["train"]
    return [(f"{name}:row {i + 1}", row) for i, row in enumerate(ds)]


def load_records_with_location(path: str | Path) -> list[tuple[str, dict]]:
    """``[(where, record)]`` with ``where`` = ``file:line`` (or ``file:row N``) for error messages."""
    p, name = Path(path), str(path)
    if not p.exists():
        raise UserError(f"{name}: no such file or folder")
    if p.is_dir():
        rows = _dataset_rows(p, name)
    elif p.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(p, name)
    elif p.suffixes[-2:] == [".jsonl", ".gz"]:
        rows = [(f"{name}:{lineno}", record) for lineno, record in read_jsonl(name)]
    elif p.suffix == ".parquet":
        rows = _parquet_rows(p, name)
    else:
        raise UserError(f"{name}: unknown data format {p.suffix!r} (use .jsonl, .jsonl.gz, .json, .parquet or a dataset folder)")
    if not rows:
        raise UserError(f"{name}: no records")
    return rows


def load_records(path: str | Path) -> list[dict]:
    """All records of a JSONL / Parquet file or a local HF dataset folder, as dicts."""
    return [row for _, row in load_records_with_location(path)]


def write_jsonl(path: str | Path, records: list[dict]) -> Path:
    """Write records one JSON object per line (UTF-8, ``×`` kept as is); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return p


def _check_messages(messages: Any, where: str, field: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: field '{field}' must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UserError(f"{where}: {field}[{i}] must be an object with string 'role' and 'content'")
    return messages


def _check_prompt(record: dict, where: str, needs: str) -> str | list[dict]:
    if "prompt" not in record or record["prompt"] is None:
        raise UserError(f"{where}: missing field 'prompt' ({needs})")
    prompt = record["prompt"]
    if isinstance(prompt, list):
        return _check_messages(prompt, where, "prompt")
    if not isinstance(prompt, str):
        raise UserError(f"{where}: field 'prompt' must be a string or a list of messages")
    return prompt


def _check_text(record: dict, key: str, where: str, needs: str) -> str:
    if key not in record or record[key] is None:
        raise UserError(f"{where}: missing field '{key}' ({needs})")
    if not isinstance(record[key], str):
        raise UserError(f"{where}: field '{key}' must be a string, got {type(record[key]).__name__}")
    return record[key]


def parse_sft(record: dict, where: str) -> SFTExample:
    """An `SFTExample` from ``{"prompt", "completion"}`` or ``{"messages"}``."""
    needs = "an SFT record needs prompt+completion or messages"
    if record.get("messages") is not None:
        messages = _check_messages(record["messages"], where, "messages")
        for i, m in enumerate(messages):
            if "weight" in m and (m["role"] != "assistant" or m["weight"] not in (0, 1) or isinstance(m["weight"], float)):
                raise UserError(f"{where}: messages[{i}].weight must be 0 or 1, on an assistant message")
        if not any(m["role"] == "assistant" and m.get("weight", 1) == 1 for m in messages):
            raise UserError(f"{where}: field 'messages' has no assistant turn to train on")
        return SFTExample(messages=messages)
    if "prompt" not in record and "completion" not in record:
        raise UserError(f"{where}: missing fields 'prompt' and 'completion' ({needs})")
    prompt = _check_prompt(record, where, needs)
    return SFTExample(prompt=prompt, completion=_check_text(record, "completion", where, needs))


def parse_prompt(record: dict, where: str) -> PromptExample:
    """A `PromptExample`; fields other than prompt and answer are kept in ``extra``."""
    prompt = _check_prompt(record, where, "a prompt record needs a prompt")
    answer = record.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if answer is not None and not isinstance(answer, str):
        raise UserError(f"{where}: field 'answer' must be a string or a number")
    extra = {k: v for k, v in record.items() if k not in ("prompt", "answer")}
    return PromptExample(prompt=prompt, answer=answer, extra=extra)


def parse_preference(record: dict, where: str) -> PreferenceExample:
    """A `PreferenceExample` from ``{"prompt", "chosen", "rejected"}``."""
    needs = "a preference record needs prompt, chosen and rejected"
    prompt = _check_prompt(record, where, needs)
    return PreferenceExample(prompt=prompt, chosen=_check_text(record, "chosen", where, needs),
                             rejected=_check_text(record, "rejected", where, needs))


def load_tasks(path: str | Path, fmt: str = "auto", **options) -> list[tuple[str, dict]]:
    """`load_records_with_location`, with records of a published code dataset (KodCode, MBPP,
    evalplus, LiveCodeBench; detected from their fields, or named by ``fmt``) turned into task
    records (`posttrain.data.formats`): a prompt, the tests the code verifier runs, the reference
    as the SFT completion. ``options`` go to the format's loader (evalplus ``variant``,
    LiveCodeBench ``since``/``until``, which also filter records out)."""
    from posttrain.data.formats import check_format, convert

    check_format(fmt, str(path))
    out = []
    for where, rec in load_records_with_location(path):
        task = convert(rec, where, fmt, **options)
        if task is not None:
            out.append((where, task))
    return out


def _own_or_published(path: str | Path) -> list[tuple[str, dict]]:
    """Our own records as they are; a published format's, detected from its fields, as task records."""
    from posttrain.data.formats import PUBLISHED, convert, detect

    out = []
    for where, rec in load_records_with_location(path):
        fmt = detect(rec)
        task = convert(rec, where, fmt) if fmt in PUBLISHED else rec
        if task is not None:
            out.append((where, task))
    return out


def load_sft_examples(path: str | Path) -> list[SFTExample]:
    return [parse_sft(r, w) for w, r in _own_or_published(path)]


def load_prompt_examples(path: str | Path) -> list[PromptExample]:
    return [parse_prompt(r, w) for w, r in _own_or_published(path)]


def load_preference_examples(path: str | Path) -> list[PreferenceExample]:
    return [parse_preference(r, w) for w, r in load_records_with_location(path)]
