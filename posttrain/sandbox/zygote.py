"""Names other modules import from the zygote's former single file; the code that runs inside
the sandbox lives in `posttrain.sandbox.inside`, one module per process (see its docstring for
the processes and the boundaries between them)."""

from __future__ import annotations

from posttrain.sandbox.inside.mounts import (  # noqa: F401
    JUDGE_DIR, JUDGE_LIB, SITE_DIR, TREE_DIR, TREES_DIR, copy_tree as _copy_tree)
from posttrain.sandbox.inside.wire import decode, encode, read_frame, write_frame  # noqa: F401
