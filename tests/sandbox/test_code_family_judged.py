"""The embedded code family judged as the demo judges it: in every published format, each
problem's reference passes and the same program with the wrong constant fails."""

from __future__ import annotations


from posttrain.data.formats import convert
from posttrain.sandbox.records import to_job
from posttrain.tasks import code_family as cf


def formats(p: cf.Problem) -> list[tuple[str, dict, str]]:
    """(format, task record, the program that answers it) for problem ``p``."""
    return [("kodcode", convert(cf.kodcode_record(p), "k"), p.solution),
            ("mbpp", convert(cf.mbpp_record(p, 1), "m"), p.solution),
            ("humaneval+", convert(cf.evalplus_record(p, "HumanEval/1"), "h", variant="plus"), p.solution),
            ("mbpp+", convert(cf.evalplus_record(p, "Mbpp/1"), "p", variant="plus"), p.solution),
            ("livecodebench", convert(cf.livecodebench_record(p, "1"), "l"), cf.lcb_solution(p))]


def test_references_pass_and_a_wrong_constant_fails_in_every_format(pool):
    cases = []
    for template in cf.TEMPLATES:
        right, wrong = cf.Problem(template, 4), cf.Problem(template, 5)
        for (fmt, task, program), (_, _, other) in zip(formats(right), formats(wrong)):
            cases += [(template.name, fmt, "PASS", {**task, "program": program}),
                      (template.name, fmt, "MODEL_FAIL", {**task, "program": other})]
    outcomes = pool.run([to_job(task, f"{name}/{fmt}") for name, fmt, _, task in cases])
    got = [(name, fmt, o.cls.value) for (name, fmt, _, _), o in zip(cases, outcomes)]
    assert got == [(name, fmt, want) for name, fmt, want, _ in cases]


def test_the_reference_outputs_are_what_the_tests_expect():
    p = cf.Problem(cf.TEMPLATES[0], 4)  # add_k: x + 4 on the inputs 3, 0, -5, 12, 7, 100, -1, 41
    assert p.outputs() == [7, 4, -1, 16, 11, 104, 3, 45]
