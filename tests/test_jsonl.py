"""The one JSONL reader: records with their line numbers, and every error as FILE:LINE: what is wrong."""

import gzip
import re

import pytest

from posttrain.errors import UserError
from posttrain.jsonl import iter_jsonl, read_jsonl

# FILE, then :LINE where a line is to blame, then ": " and what is wrong, on one line.
FORMAT = re.compile(r"^(?P<file>[^\n]+?)(?::(?P<line>\d+))?: (?P<what>[^\n]+)$")


def error(path, **kw) -> str:
    with pytest.raises(UserError) as e:
        read_jsonl(path, **kw)
    message = str(e.value)
    assert FORMAT.match(message) and message.startswith(str(path)), message
    return message


def test_records_with_line_numbers_counting_blank_lines(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"a": 1}\n\n   \n{"b": "\xc3\x97"}\r\n{"c": null}')  # CRLF and no final newline
    assert read_jsonl(p) == [(1, {"a": 1}), (4, {"b": "×"}), (5, {"c": None})]
    assert [raw for _, raw, _ in iter_jsonl(p)] == ['{"a": 1}\n', '{"b": "×"}\r\n', '{"c": null}']


def test_a_line_separator_inside_a_string_is_not_a_line_break(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"t": "a\u2028b"}\n{"t": "c"}\n', encoding="utf-8")
    assert read_jsonl(p) == [(1, {"t": "a\u2028b"}), (2, {"t": "c"})]


def test_gzip(tmp_path):
    p = tmp_path / "d.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write('{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(p) == [(1, {"a": 1}), (3, {"a": 2})]
    p.write_bytes(gzip.compress(b'{"a": 1}\n')[:-6])
    assert error(p).startswith(f"{p}: cannot read gzip (")


@pytest.mark.parametrize("content, expected", [
    ('{"a": 1}\n\n{"a": oops}\n', ":3: invalid JSON (Expecting value at column 7)"),
    ('{"a": 1}\n[1, 2]\n', ":2: expected a JSON object, got an array"),
    ('"text"\n', ":1: expected a JSON object, got a string"),
    ("null\n", ":1: expected a JSON object, got null"),
    (b'{"a": 1}\n{"a": "\xff"}\n', ":2: not UTF-8 text (invalid start byte at byte 7)"),
    ("", ": no records (the file is empty)"),
    ("\n  \n", ": no records (the file is blank)"),
])
def test_bad_input_is_file_line_what(tmp_path, content, expected):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert error(p) == f"{p}{expected}"


def test_missing_file_folder_and_allowed_empty(tmp_path):
    assert error(tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"
    assert error(tmp_path) == f"{tmp_path}: a folder, not a JSONL file"
    (tmp_path / "empty.jsonl").write_text("")
    assert read_jsonl(tmp_path / "empty.jsonl", allow_empty=True) == []


def test_errors_come_in_order_while_streaming(tmp_path):
    """A bad line is reported when reached: the records before it have already been yielded."""
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{oops\n')
    rows = iter_jsonl(p)
    assert next(rows)[0] == 1
    with pytest.raises(UserError, match=r"d\.jsonl:2: invalid JSON"):
        next(rows)
