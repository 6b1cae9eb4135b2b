"""A program the zygote compiles and runs once before it forks (`zygote._warm_up`).

CPython builds parts of its compiler's and evaluator's state on first use (annotations,
comprehensions, f-strings, ``try``/``with``, lambdas, star-unpacking, classes with keyword
arguments); a candidate that did that itself would pay for it in copy-on-write page faults,
more than for the rest of a short program. Compiled from this file's source inside the sandbox,
so the zygote does the work once and every fork starts warm. Standard library only.
"""

from typing import List


def f(xs: List[int], k: int = 2) -> List[int]:
    """Docstring."""
    out = [x * k for x in xs if x % 2 == 0]
    d = {x: f"{x!r:>3}" for x in out}
    try:
        with open("/nonexistent") as fh:  # noqa: F841  the `as` form is what is warmed
            pass
    except (OSError, ValueError) as e:
        del e
    while k > 0:
        k -= 1
    return sorted(out, key=lambda v: -v) + list(d) + [*(y for y in xs)]


class C:
    def m(self, a, *args, b=None, **kw):
        return a if a is not None and not b else ~-a


def exercise() -> list:
    """Run what the module defines once; the answer is fixed, so a broken warm-up shows."""
    out = f([1, 2, 3, 4])
    if out != [8, 4, 4, 8, 1, 2, 3, 4] or C().m(5) != 5:
        raise AssertionError(f"warm-up program went wrong: {out}")
    return out
