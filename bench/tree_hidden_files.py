"""What placing a job's hidden files read-only costs: the same tree job with N test files given
as hidden files (written and bound read-only by the sandbox) and with none, alternated in one run.

    python bench/tree_hidden_files.py [N] [ROUNDS]
"""

from __future__ import annotations

import sys
import time

from posttrain.sandbox.pool import Job, SandboxPool
from posttrain.sandbox.trees import Tree
from posttrain.sandbox.worker import SandboxConfig


def main(n: int = 200, rounds: int = 10) -> None:
    files = {f"tests/t{k // 20}/test_{k}.py": f"def test_{k}():\n    assert {k} == {k}\n" for k in range(n)}
    tree = Tree({**files, "pkg/__init__.py": "X = 1\n"})
    program = "import os\nprint(len(os.listdir('/tmp/work/tests')))"
    plain = Job(program, io=(("", ""),), capture=True, tree=tree)
    hidden = Job(program, io=(("", ""),), capture=True, tree=tree, hidden=files)
    pool = SandboxPool(SandboxConfig(workers=1))
    try:
        pool.run([plain, hidden])  # warm: the tree is written to the store once
        spent = {"plain": 0.0, "hidden": 0.0}
        for _ in range(rounds):
            for name, job in (("plain", plain), ("hidden", hidden)):
                t0 = time.perf_counter()
                out = pool.run([job])[0]
                spent[name] += time.perf_counter() - t0
                assert out.detail.strip() == str(len({p.split("/")[1] for p in files})), out
    finally:
        pool.close()
    per = {k: v / rounds * 1000 for k, v in spent.items()}
    print(f"{n} hidden files, {rounds} rounds: plain {per['plain']:.1f} ms/job, hidden {per['hidden']:.1f} ms/job, "
          f"ratio {per['hidden'] / per['plain']:.2f}x")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
