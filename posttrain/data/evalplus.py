"""HumanEval+ and MBPP+ (evalplus) judged as evalplus' own ``evaluate`` judges them.

What evalplus does, and where it happens here:

- **Inputs.** MBPP+ stores tuples, sets and complex numbers as JSON lists and strings; evalplus
  turns them back per task (``mbpp_deserialize_inputs``), and so does `mbpp_inputs` (a copy of its
  table). They reach the judge tagged (`tag`), so a tuple stays a tuple. An empty ``plus_input``
  written as ``{}`` (Mbpp/793) is no inputs, as evalplus' loop over it sees.
- **Expected outputs** are the canonical solution's, computed in the judge while the tests load:
  a reference that raises, or runs the judge out of memory, makes the task TASK_FAIL (masked and
  counted), never the program's fault.
- **Comparison** (``unsafe_execute``): equal, else within ``atol`` (``numpy.allclose`` with rtol
  1e-7, same type and length; ``atol`` becomes 1e-6 from the first input whose expected output is
  a float when the record says 0, for that input and the ones after it); HumanEval/32 accepts any
  root; MBPP's special oracles: ``are_equivalent`` (any output), ``sum_div`` (0 also right),
  ``surface_Area`` and ``digit_distance_nums`` (a second reading of the question), set equality
  for eight tasks, and "is not None" for three whose outputs (regex matches) are not values: there
  the program's own process turns its output into a bool before it crosses the sandbox boundary
  (`NOT_NONE_ENTRY`), as evalplus compares it.
- **Time.** Each input may take max(1 s, 4 x the reference's time on it), measured in the judge
  around the call and enforced with a timer there; each input group (base, plus) at most
  min(60 s, the sum of its limits) + 2 s, or 4 x the reference's time on the group where that is
  more (a machine slower than evalplus' must not fail the canonical solution of Mbpp/599). The reference's own time is not the program's: the
  whole task's wall-clock bound (``timeout_s`` of the task record, `task_timeout_s`) leaves room
  for the reference and both groups, and is only a backstop.
"""

from __future__ import annotations

import json

MIN_TIME_S = 1.0  # evalplus' --min-time-limit
TIME_FACTOR = 4.0  # evalplus' --gt-time-limit-factor
GROUP_CAP_S = 60.0  # evalplus' EVALPLUS_TIMEOUT_PER_TASK
REFERENCE_ALLOWANCE_S = 120.0  # wall-clock room for running the reference in the judge

SET_EQ = {"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
          "intersection_array", "find_dissimilar", "Diff"}
NOT_NONE = {"check_str", "text_match_three", "text_starta_endb"}
MBPP_ORACLES = {"are_equivalent", "sum_div", "surface_Area", "digit_distance_nums"}

# evalplus.data.mbpp.mbpp_deserialize_inputs, by task number.
_EACH_ARG_TUPLE = {2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726,
                   740, 744, 809}
_EACH_ARG_TUPLES = {63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780}
_FIRST_ARG_TUPLES = {75, 413, 444, 753}
_FIRST_ARG_TUPLE = {250, 405, 446, 617, 720, 763, 808}
_NESTED_TUPLES = {259, 401, 445}
_ALL_TUPLES = {580, 615, 791}


def _all_tuples(value):
    return tuple(_all_tuples(v) for v in value) if isinstance(value, list) else value


def mbpp_inputs(number: int, inputs: list) -> list:
    """MBPP+ task ``number``'s inputs as evalplus hands them to the function."""
    if number in _EACH_ARG_TUPLE:
        return [[tuple(a) for a in inp] for inp in inputs]
    if number in _EACH_ARG_TUPLES:
        return [[[tuple(a) for a in arg] for arg in inp] for inp in inputs]
    if number in _FIRST_ARG_TUPLES:
        return [[[tuple(a) for a in inp[0]]] + [inp[1]] for inp in inputs]
    if number in (106, 750):
        return [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    if number == 115:
        return [[[set(i) if isinstance(i, list) and len(i) else {} for i in inp[0]]] for inp in inputs]
    if number == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if number in _FIRST_ARG_TUPLE:
        return [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    if number in _NESTED_TUPLES:
        return [[tuple(tuple(a) for a in arg) for arg in inp] for inp in inputs]
    if number == 278:
        return [[tuple(tuple(i) if isinstance(i, list) else i for i in inp[0])] for inp in inputs]
    if number == 307:
        return [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    if number == 722:
        return [[{k: tuple(v) for k, v in inp[0].items()}] + inp[1:] for inp in inputs]
    if number == 252:
        return [[complex(inp[0])] for inp in inputs]
    if number in _ALL_TUPLES:
        return [_all_tuples(inp) for inp in inputs]
    return inputs


def tag(value):
    """``value`` as JSON that keeps tuples, sets, complex numbers and dicts (keys of any type);
    `CHECK`'s ``_untag`` reverses it."""
    if isinstance(value, list):
        return [tag(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [tag(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"s": [tag(v) for v in value]}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, dict):
        return {"d": [[tag(k), tag(v)] for k, v in value.items()]}
    return value


def oracle_of(task_id: str, entry: str) -> str:
    """The special oracle evalplus applies to a task ('' for plain comparison)."""
    if not task_id.startswith("Mbpp/"):
        return "find_zero" if entry == "find_zero" else ""
    if entry in MBPP_ORACLES:
        return entry
    return "set_eq" if entry in SET_EQ else "not_none" if entry in NOT_NONE else ""


def task_timeout_s(groups: int) -> float:
    """The whole task's wall-clock backstop: the reference, then each group's evalplus bound."""
    return REFERENCE_ALLOWANCE_S + groups * (GROUP_CAP_S + 2.0)


# After the program, for the "is not None" tasks: what crosses the boundary is evalplus' reading
# of the output (a bool stays as it is, anything else is whether it is not None).
NOT_NONE_ENTRY = '''

def __posttrain_entry__(*args):
    out = globals()[{name!r}](*args)
    return out if isinstance(out, bool) else out is not None
'''

# Runs in the judge (task code, trusted).
CHECK = '''
import copy as _copy, json as _json, math as _math, signal as _signal, sys as _sys, time as _time
_RAW = {spec!r}
_SPEC = _json.loads(_RAW)


def _untag(v):
    if type(v) is list:
        return [_untag(x) for x in v]
    if type(v) is dict:
        ((kind, x),) = v.items()
        if kind == "t":
            return tuple(_untag(i) for i in x)
        if kind == "s":
            return set(_untag(i) for i in x)
        if kind == "c":
            return complex(x[0], x[1])
        return {{_untag(k): _untag(i) for k, i in x}}
    return v


def _reference(inputs):
    """evalplus' ground truth for one input group: the outputs and the reference's time on each."""
    ns = {{"__name__": "__reference__"}}
    exec(compile(_SPEC["reference"], "<reference>", "exec"), ns)
    fn, outs, times = ns[_SPEC["entry_point"]], [], []
    for args in inputs:
        args = _copy.deepcopy(args)
        start = _time.time()
        out = fn(*args)
        times.append(_time.time() - start)
        outs.append(out is not None if _SPEC["oracle"] == "not_none" else out)
    return outs, times


def _ground_truth():
    """Every group's (inputs, outputs, reference times), kept in the judge for the next programs
    on the same task (evalplus too computes them once), unless an output is large."""
    import hashlib

    cache = _sys.modules.get("_posttrain_evalplus_truth")
    if cache is None:
        cache = _sys.modules["_posttrain_evalplus_truth"] = type(_sys)("_posttrain_evalplus_truth")
        cache.entries = {{}}
    key = hashlib.sha256(_RAW.encode()).hexdigest()
    if key not in cache.entries:
        groups = [(inputs, *_reference(inputs)) for inputs in map(_untag, _SPEC["groups"])]
        if all(_sys.getsizeof(out) < 1 << 20 for _, outs, _ in groups for out in outs):
            cache.entries[key] = groups
            while len(cache.entries) > 64:
                cache.entries.pop(next(iter(cache.entries)))
        return groups
    return cache.entries[key]


# While the tests load: a reference that raises (or a judge out of memory) is the task's fault.
_GROUPS = _ground_truth()


def _poly(xs, x):
    return sum(c * _math.pow(x, i) for i, c in enumerate(xs))


def _surface_area(base_edge, height):
    slant = _math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant) / 2)


def _digit_distance(a, b):
    a, b = str(a), str(b)
    n = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(n), b.zfill(n)))


def _floats(x):
    return type(x) is float or (type(x) in (list, tuple) and len(x) > 0 and all(type(i) is float for i in x))


def _allclose(out, exp, atol):
    """numpy.allclose(out, exp, rtol=1e-07, atol=atol) for numbers and equal-shaped lists of them."""
    if type(out) in (list, tuple) and type(exp) in (list, tuple):
        return len(out) == len(exp) and all(_allclose(o, e, atol) for o, e in zip(out, exp))
    if type(out) not in (int, float, bool, complex) or type(exp) not in (int, float, bool, complex):
        return False
    if type(out) is not complex and type(exp) is not complex and (_math.isinf(out) or _math.isinf(exp)):
        return out == exp
    return abs(out - exp) <= atol + 1e-07 * abs(exp)


def _same(out, exp, args, atol):
    """(whether out is right, the atol for later inputs), as evalplus' unsafe_execute decides."""
    oracle = _SPEC["oracle"]
    if oracle == "find_zero":
        return abs(_poly(*args, out)) <= atol, atol
    exact = out == exp
    if oracle == "are_equivalent":
        exact = True
    elif oracle == "sum_div":
        exact = exact or out == 0
    elif oracle == "surface_Area":
        exact = exact or abs(out - _surface_area(*args)) <= atol
    elif oracle == "digit_distance_nums":
        exact = exact or out == _digit_distance(*args)
    elif oracle == "set_eq":
        exact = set(out) == set(exp)
    if atol == 0 and _floats(exp):
        atol = 1e-6  # evalplus keeps it for the inputs after this one
    if not exact and atol != 0:
        same_shape = type(out) is type(exp) and (type(exp) not in (list, tuple) or len(out) == len(exp))
        return same_shape and _allclose(out, exp, atol), atol
    return bool(exact), atol


class _OverTime(Exception):
    pass


def _ring(signum, frame):
    raise _OverTime()


def _timed(candidate, args, limit):
    """The candidate's output on args, or _OverTime once limit seconds have passed."""
    previous = _signal.signal(_signal.SIGALRM, _ring)
    try:
        _signal.setitimer(_signal.ITIMER_REAL, limit)
        try:
            return candidate(*args)
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
    finally:
        _signal.signal(_signal.SIGALRM, previous)


def _crossing(codec, value):
    """Seconds a large value takes through the sandbox's codec one way (0 for small ones),
    extrapolated from its first 4096 items or characters: the program's time on an input includes
    it, the reference's run in the judge does not."""
    if None in codec or type(value) not in (str, bytes, list, tuple, dict) or _sys.getsizeof(value) < 65536:
        return 0.0
    part = dict(list(value.items())[:4096]) if type(value) is dict else value[:4096]
    start = _time.time()
    try:
        codec[1](_json.loads(_json.dumps(codec[0](part))))
    except Exception:
        return 0.0
    return (_time.time() - start) * len(value) / max(len(part), 1)


def _limits(codec, inputs, expected, times):
    """evalplus' per-input limits, max(1 s, 4 x the reference's time), and the time the input
    and the output take to cross the boundary (4 x too), which is never the program's."""
    crossing = [_SPEC["time_factor"] * (_crossing(codec, list(args)) + _crossing(codec, exp))
                for args, exp in zip(inputs, expected)]
    return [max(_SPEC["min_time_s"], _SPEC["time_factor"] * t) + c for t, c in zip(times, crossing)], sum(crossing)


def check(candidate):
    # The judge also binds the candidate to the entry point's name here; one named like a builtin
    # (Mbpp/126's ``sum``) would shadow the builtin for the code above.
    if globals().get(_SPEC["entry_point"]) is candidate:
        del globals()[_SPEC["entry_point"]]
    where = getattr(candidate, "__globals__", {{}})
    codec = (where.get("encode"), where.get("decode"))
    atol = _SPEC["atol"]
    for inputs, expected, times in _GROUPS:
        limits, crossing = _limits(codec, inputs, expected, times)
        # evalplus' bound on the whole group, min(60 s, the sum of the limits) + 2 s; where the
        # reference alone takes over 15 s on this machine, 4 x its time (60 s is evalplus' machine's).
        cap = max(min(_SPEC["group_cap_s"], sum(limits) - crossing), _SPEC["time_factor"] * sum(times))
        left = cap + 2.0 + crossing
        for i, (args, exp, limit) in enumerate(zip(inputs, expected, limits)):
            start = _time.time()
            try:
                out = _timed(candidate, args, max(min(limit, left), 1e-3))
            except _OverTime:
                raise TimeoutError(f"input {{i}}: over its time limit ({{min(limit, left):.2f}} s)") from None
            left -= _time.time() - start
            try:
                ok, atol = _same(out, exp, args, atol)
            except Exception:
                ok = False
            assert ok, f"input {{i}}: wrong output"
'''


def check_source(reference: str, entry: str, groups: list[list], atol: float, oracle: str) -> str:
    """The tests (``check(candidate)``) for one task; ``groups`` are its input groups, as evalplus
    passes them (already through `mbpp_inputs`)."""
    spec = json.dumps({"reference": reference, "entry_point": entry, "groups": [tag(g) for g in groups],
                       "atol": atol, "oracle": oracle, "min_time_s": MIN_TIME_S, "time_factor": TIME_FACTOR,
                       "group_cap_s": GROUP_CAP_S})
    return CHECK.format(spec=spec)
