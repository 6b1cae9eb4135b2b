"""The warm-up program the zygote runs before it forks, and the way the sandbox loads its modules."""

from __future__ import annotations

import subprocess
import sys

from posttrain.sandbox import inside, worker
from posttrain.sandbox.inside import warm


def test_warm_up_program_runs_and_checks_its_answer():
    assert warm.exercise() == [8, 4, 4, 8, 1, 2, 3, 4]


def test_sandbox_modules_load_in_order_with_only_the_standard_library(tmp_path):
    # As the sandbox loads them: an isolated interpreter without site-packages, package ``box``
    # built from the host's code objects in `inside.MODULES` order; the zygote's loop not started.
    (tmp_path / "box.code").write_bytes(worker.box_code())
    boot = worker.BOOT.format(version=tuple(sys.version_info[:2]), modules=inside.MODULES)
    boot = boot.replace("/sandbox/box.code", str(tmp_path / "box.code"))
    boot = boot.replace("box.zygote.main(sys.argv)\n", "print(sorted(k for k in sys.modules if k.startswith('box')))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", boot], capture_output=True, text=True, check=True).stdout
    assert eval(out) == sorted(["box", *(f"box.{m}" for m in inside.MODULES)])
