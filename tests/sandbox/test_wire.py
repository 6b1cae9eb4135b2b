"""The typed wire format between judge and candidate: exact builtin types (and the collections
classes a correct program returns) only, nothing else; checked against a slow reference codec."""

from __future__ import annotations

import collections
import json
import math
import os
import random
import typing

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


@pytest.mark.parametrize("wire", [[], ["?"], ["i", 5], ["b", 1], ["l", "x"], ["d", [[["N"]]]], {"k": 1}, ["s", 3],
                                  ["f", "nope"], ["A", "l", "d", "!!!!"], ["A", "l", "d", "AAAA"],
                                  ["A", "l", "m", "AAAAAAAA8D8=", [1]], ["A", "l", "m", "AAAAAAAA+D8=", [0]],
                                  ["A", "x", "d", "AAAAAAAA8D8="], ["T", "1bad", ["x"], [1]], ["T", "P", ["_x"], [1]],
                                  ["T", "P", ["x"], [1, 2]], ["D", "eval", []], ["d", ["ab"]], ["C", [[["l", []], 1]]],
                                  ["T", "P", [f"f{i}" for i in range(300)], list(range(300))]])
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


# ----------------------------------------------------------------------------- a slow reference
def reference_encode(x):
    """One tag per value, item by item: slow and plainly right (the codec's first form)."""
    t = type(x)
    if x is None:
        return ["N"]
    if t in (bool, str):
        return ["b" if t is bool else "s", x]
    if t is int:
        return ["i", format(x, "x")]
    if t is float:
        return ["f", x.hex()]
    if t in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], [reference_encode(v) for v in x]]
    if t is dict:
        return ["d", [[reference_encode(k), reference_encode(v)] for k, v in x.items()]]
    raise TypeError(t)


def same(a, b) -> bool:
    """Equal, of the same types all the way down, floats bit for bit (NaN and -0.0 too)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a.hex() == b.hex() or (math.isnan(a) and math.isnan(b))
    if type(a) in (list, tuple) or (isinstance(a, tuple) and hasattr(a, "_fields")):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def random_value(rng: random.Random, depth: int = 0):
    scalars = [lambda: None, lambda: rng.random() < 0.5, lambda: rng.randint(-2 ** 70, 2 ** 70),
               lambda: rng.randint(-5, 5), lambda: rng.choice([0.0, -0.0, math.inf, -math.inf, rng.uniform(-1e9, 1e9)]),
               lambda: "".join(rng.choice("ab\n\"\\ü") for _ in range(rng.randint(0, 4)))]
    if depth > 2 or rng.random() < 0.4:
        return rng.choice(scalars)()
    n = rng.choice([0, 1, 3, 20, 40])
    kind = rng.choice(["l", "t", "d", "floats", "ints", "mixed"])
    if kind == "floats":
        return [rng.uniform(-1e6, 1e6) for _ in range(n)]
    if kind == "ints":
        return tuple(rng.randint(-2 ** 62, 2 ** 62) for _ in range(n))
    if kind == "mixed":
        return [rng.choice([rng.randint(-2 ** 52, 2 ** 52), rng.uniform(-10, 10)]) for _ in range(n)]
    if kind == "d":
        return {rng.randint(0, 100): random_value(rng, depth + 1) for _ in range(n)}
    items = [random_value(rng, depth + 1) for _ in range(n)]
    return items if kind == "l" else tuple(items)


def through_the_wire(value):
    return decode(json.loads(json.dumps(encode(value))))


def test_random_values_cross_as_the_slow_reference_carries_them():
    rng = random.Random(0)
    for _ in range(400):
        value = random_value(rng)
        expected = decode(reference_encode(value))  # the reference's form is still read, as it was
        assert same(through_the_wire(value), expected) and same(expected, value)


@pytest.mark.parametrize("value", [
    [0.5] * 100, [1, 3, 2.0, 6.5] * 30, tuple(range(-50, 50)), [2 ** 63] * 20, [2 ** 53 + 1] + [0.5] * 40,
    [math.nan, -0.0, math.inf] * 10, set(range(100)), frozenset(x / 3 for x in range(50)), [True] * 30,
])
def test_long_runs_of_numbers_keep_types_and_bits(value):
    assert same(sorted(through_the_wire(value)) if isinstance(value, (set, frozenset)) else through_the_wire(value),
                sorted(value) if isinstance(value, (set, frozenset)) else value)
    assert type(through_the_wire(value)) is type(value)


def test_a_long_list_of_floats_crosses_as_one_packed_string():
    wire = encode([i / 7 for i in range(100_000)] + [1])
    assert wire[0] == "A" and type(wire[3]) is str and wire[4] == [100_000]


# ----------------------------------------------------------------------------- collections
Point = collections.namedtuple("Point", "x y")
Pair = typing.NamedTuple("Pair", [("a", int), ("b", list)])


@pytest.mark.parametrize("value", [
    collections.Counter("abracadabra"), collections.OrderedDict([(2, "b"), (1, "a")]),
    collections.defaultdict(list, {1: [2.5]}), collections.defaultdict(None, {"k": 1}), Point(1, 2.5),
    Pair(1, [Point(0, 0)]), [Point(i, -i) for i in range(20)], {"c": collections.Counter([1, 1])},
])
def test_collections_values_cross_with_their_types(value):
    back = through_the_wire(value)
    assert back == value and type(back).__name__ == type(value).__name__
    if isinstance(value, dict):
        assert list(back.items()) == list(value.items())
    if isinstance(value, collections.defaultdict):
        assert back.default_factory is value.default_factory


def test_a_counter_equal_to_a_dict_compares_equal_as_in_python():
    assert through_the_wire(collections.Counter({"a": 2})) == {"a": 2}


def test_a_namedtuple_is_rebuilt_here_without_the_senders_methods():
    cls = collections.namedtuple("P", "x")
    cls.__eq__ = lambda self, other: True  # the sender's own equality never crosses
    back = through_the_wire(cls(1))
    assert type(back) is not cls and back == (1,) and back != (2,) and back.x == 1
