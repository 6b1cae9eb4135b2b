"""The code that runs inside a sandbox, one module per process, and the boundaries between them.

Standard library only: the sandbox runs it under the system interpreter (``-I -S``, no
site-packages), loaded by `posttrain.sandbox.worker.BOOT` as the package ``box`` from code
objects the host compiled (`MODULES`, in this order: each imports only those before it).

Processes, their privileges, and what each may write::

    host (posttrain.sandbox.worker)     outside; talks to the zygote over stdin/stdout (JSON frames)
     └─ zygote   `zygote`   root in the sandbox, a few capabilities; mounts /tmp, /dev/shm,
         │                  /judge and a job's tree (`mounts`); never runs task or program code
         ├─ forker `forker` root, CAP_SETUID/SETGID only, seccomp; forks candidates, reads
         │   │              only fork/wait requests from the zygote
         │   └─ candidate `candidate`  program uid, no capabilities, seccomp; runs the program;
         │                  writes only /tmp, /dev/shm, a job's tree (not its hidden files)
         │                  and its own pipes
         └─ judge  `judge`  judge uid, seccomp; runs the task's tests; writes /judge (0700,
                            its uid only) and its verdict pipe to the zygote

Invariants each boundary holds:

- The verdict is computed in the judge or on the host, never in the candidate; what the
  candidate sends the judge is rebuilt by `wire.decode` as exact builtin types (or, for
  pytest-style tasks, handles whose objects stay in the candidate).
- Tests, preludes and expected outputs never enter the candidate's address space: it is forked
  before the request is read, and test modules live under ``/judge``, which its uid cannot enter.
- A job's hidden files (a verdict's tests and configuration) reach its tree only through the
  zygote, before the program starts, each bound read-only over itself, its folders mount points
  and an empty read-only ``__pycache__`` beside it (`mounts.place_hidden`): the program cannot
  change, remove, replace or shadow them on disk (nor reach the overlay's upper copy: only the
  zygote's uid enters `mounts.LAYERS_DIR`), nor put bytecode where Python or pytest looks for
  theirs by default. (Inside its own process the program can still redirect
  ``sys.pycache_prefix`` or the import system; that is the SWE verdict's sentinels' job.)
- Nothing a program writes outlives it: its processes are killed and touched tmpfs replaced
  before the next program starts.
- The candidate cannot signal the judge, the forker or the zygote (other uids, no capabilities).
"""

MODULES = ("wire", "kernel", "mounts", "candidate", "forker", "judge", "zygote")
