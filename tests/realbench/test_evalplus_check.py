"""``posttrain sandbox check`` on real MBPP+ records (the ``realbench`` lane). A file of its own,
so that pytest-xdist runs it beside the canonical solutions of test_evalplus_release.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.realbench


def test_check_on_the_release_records_charges_neither_reference_time_nor_its_memory(tmp_path, capsys):
    """``posttrain sandbox check`` on real MBPP+ records: an O(1) program for Mbpp/599, whose
    reference takes tens of seconds, passes; Mbpp/255, whose reference runs the judge out of
    memory, is TASK_FAIL (masked), not the program's MODEL_FAIL."""
    import gzip
    import json

    from posttrain.cli import main
    from tests.data.test_evalplus import real_records

    o1 = "def sum_average(number):\n    total = number * (number + 1) // 2\n    return (total, total / number)\n"
    (r599, r255) = real_records("MbppPlus", ["Mbpp/599", "Mbpp/255"])
    path = tmp_path / "MbppPlus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({**r599, "program": o1}) + "\n")
        f.write(json.dumps({**r255, "program": r255["prompt"] + r255["canonical_solution"]}) + "\n")
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(o["id"], o["outcome"], o["base"]["outcome"]) for o in out] == [
        ("Mbpp/599", "PASS", "PASS"), ("Mbpp/255", "TASK_FAIL", "PASS")]
