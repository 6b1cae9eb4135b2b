"""The judge compiles a task's tests and prelude as plain Python compiles them."""

from __future__ import annotations

from posttrain.sandbox.pool import Job


def test_tests_do_not_inherit_postponed_annotations(pool):
    # `Undefined` is evaluated at the def in plain Python: the tests do not load.
    tests = "def check(candidate: Undefined):\n    assert candidate(2) == 4\n"
    out = pool.run([Job("def f(x):\n    return 2 * x\n", "f", tests)])[0]
    assert (out.cls.value, out.reason) == ("TASK_FAIL", "bad_test")


def test_prelude_does_not_inherit_postponed_annotations(pool):
    prelude = "def helper(x: Undefined):\n    return x\n"
    out = pool.run([Job("def f(x):\n    return 2 * x\n", "f", "def check(candidate):\n    assert candidate(2) == 4\n",
                        prelude)])[0]
    assert (out.cls.value, out.reason) == ("TASK_FAIL", "bad_test")
