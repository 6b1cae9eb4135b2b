"""The code sandbox: run untrusted programs in isolation and judge them outside their reach.

What is isolated, and how (each worker is one bubblewrap sandbox holding a warm zygote; each
program runs in a fresh process forked from it — see `zygote`, `worker`, `pool`):

- **Network**: own network namespace, loopback only; the host's listeners and DNS are unreachable.
- **Processes**: own PID namespace; after every program the zygote sends SIGKILL to every other
  process in it (``kill(-1)``), which also reaches ``setsid`` daemons and double forks. The sandbox
  dies with the pool (``--die-with-parent``); a pids cgroup (``nproc + 8``) and RLIMIT_NPROC on
  the program's own unprivileged uid bound fork bombs.
- **Files**: a new root holding read-only binds of ``/usr`` (and ``/etc/alternatives``) only —
  no ``/etc/shadow``, ``/root``, ``/home``, project or test files. Each program gets its own
  mount namespace with fresh size-capped tmpfs on ``/tmp`` and ``/dev/shm`` (``tmpfs_mb``, 4096
  inodes), discarded when it dies, so nothing passes from one episode to the next.
- **Identity**: the program drops to an unprivileged uid unique to its worker (no effective
  capabilities, ``no_new_privs`` set, so setuid binaries cannot raise it); the judge runs as a
  second uid, so the program can neither signal nor read it.
- **Resources**: RLIMIT_AS (``memory_mb``), RLIMIT_CPU (timeout + 1 s), RLIMIT_FSIZE
  (``file_mb``), RLIMIT_NOFILE 64, no core dumps; a memory cgroup (``worker_memory_mb``) per
  sandbox; a wall-clock limit enforced from outside; stdout+stderr capped at ``output_limit``.
- **Environment and descriptors**: empty environment, stdin ``/dev/null``, only its own pipes open.
- **The verdict**: never computed in the program's process. Function-call tests run in the judge
  process, which calls the program through a proxy and receives return values as strictly typed
  data (exact builtin types only); stdin/stdout tasks are compared on the host. Expected outputs
  and tests never enter the program's address space.

What is not isolated: the kernel is shared and no seccomp filter narrows the system calls; the
sandbox runs as real root with capabilities dropped, not in a user namespace (the uid drop is
what binds RLIMIT_NPROC); ``/usr`` is readable, so the program can see what is installed; CPU
time is not partitioned between sandboxes (no cpu cgroup); timing side channels are open.
Missing mechanisms (bubblewrap, root, the pids or memory cgroup) are listed by
`worker.probe`, printed at start-up, and appended to every outcome's detail.
"""
