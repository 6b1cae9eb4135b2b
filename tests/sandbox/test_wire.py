"""The typed wire format between judge and candidate: exact builtin types only, nothing else."""

from __future__ import annotations

import math
import os

import pytest

from posttrain.sandbox.inside.wire import decode, encode, read_frame, write_frame


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2 ** 100, 0.1, -0.0, math.inf, 1e-310, 3 + 4j, "", "ünï\n", b"\x00\xff",
    [1, [2.5, "a"]], (1, (2,)), {1, "x"}, frozenset({(1, 2)}), {"a": [1], 2: (None,)}, [[]] * 3,
])
def test_round_trip_keeps_type_and_value(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)  # -0.0 stays -0.0


def test_nan_round_trips():
    assert math.isnan(decode(encode(math.nan)))


def test_bool_and_int_stay_apart():
    assert type(decode(encode(True))) is bool and type(decode(encode(1))) is int
    assert decode(encode([True, 1])) == [True, 1] and [type(v) for v in decode(encode([True, 1]))] == [bool, int]


@pytest.mark.parametrize("value", [
    type("I", (int,), {})(3), type("S", (str,), {})("x"), type("L", (list,), {})(), object(),
    type("Eq", (), {"__eq__": lambda s, o: True})(), [1, type("F", (float,), {})(1.0)], len,
])
def test_anything_but_exact_builtins_is_refused(value):
    with pytest.raises(TypeError):
        encode(value)


def test_too_deep_is_refused():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep)


@pytest.mark.parametrize("wire", [[], ["?"], ["i", 5], ["b", 1], ["l", "x"], ["d", [[["N"]]]], "x", ["s", 3],
                                  ["f", "nope"]])
def test_malformed_values_raise_value_error(wire):
    with pytest.raises(ValueError):
        decode(wire)


def test_frames_round_trip_and_end_cleanly():
    r, w = os.pipe()
    write_frame(w, {"a": [1, 2]})
    os.close(w)
    assert read_frame(r) == {"a": [1, 2]}
    assert read_frame(r) is None
    os.close(r)


def test_truncated_frame_is_an_error():
    r, w = os.pipe()
    os.write(w, b"\x00\x00\x00\x10{}")
    os.close(w)
    with pytest.raises(ValueError):
        read_frame(r)
    os.close(r)
