"""The code sandbox: run untrusted programs in isolation and judge them outside their reach.

What is isolated, and how (each worker is one bubblewrap sandbox holding a warm zygote; each
program runs in a fresh process forked from it — see `inside` (one module per process in the
sandbox, and the boundaries between them), `worker`, `pool`, `seccomp_filter`):

- **Network**: own network namespace, loopback only; the host's listeners and DNS are unreachable.
- **Processes**: own PID namespace; after every program the zygote sends SIGKILL to every
  process in it but itself, the judge and the namespace's init (found in its ``/proc``), which
  also reaches ``setsid`` daemons and double forks. The sandbox
  dies with the pool (``--die-with-parent``); a pids cgroup (``nproc + 8``) and RLIMIT_NPROC on
  the program's own unprivileged uid bound fork bombs.
- **System calls**: a seccomp filter, generated with libseccomp, on every program and on the
  judge: namespace creation (``unshare``, ``setns``, ``clone`` with namespace flags; ``clone3``
  fails with ENOSYS so libc falls back to ``clone``), ``bpf``, ``perf_event_open``,
  ``userfaultfd``, io_uring, ``ptrace`` and ``process_vm_*``, kernel keyrings, every mount
  call, kexec, module loading, ``reboot``, swap/acct/syslog, and SysV IPC and POSIX message
  queues (state that would outlive the program) fail with EPERM; a foreign-ABI call kills the
  process. Without libseccomp the pool refuses to start.
- **Files**: a new root holding read-only binds of ``/usr`` (and ``/etc/alternatives``), the
  sandbox's own modules and the pytest library the judge runs (``/sandbox``, ``/sandbox/lib``) only —
  no ``/etc/shadow``, ``/root``, ``/home``, project or test files. ``/tmp`` and ``/dev/shm``
  are size-capped tmpfs (``tmpfs_mb``, 4096 inodes); after a program that touched one, the
  zygote replaces it with a fresh one, so nothing passes from one episode to the next. The
  judge writes test modules to its own tmpfs, ``/judge``, mode 0700 for its uid, mounted afresh
  after any task that changed it.
- **Identity**: the program drops to an unprivileged uid unique to its worker (no effective
  capabilities, ``no_new_privs`` set, so setuid binaries cannot raise it); the judge runs as a
  second uid, so the program can neither signal nor read it.
- **Resources**: RLIMIT_AS (``memory_mb``), RLIMIT_CPU (timeout + 1 s), RLIMIT_FSIZE
  (``file_mb``), RLIMIT_NOFILE 64, no core dumps; a memory cgroup (``worker_memory_mb``) per
  sandbox; a wall-clock limit enforced from outside; stdout+stderr capped at ``output_limit``.
- **Environment and descriptors**: empty environment, stdin ``/dev/null``, only its own pipes open.
- **The verdict**: never computed in the program's process. Function-call tests run in the judge
  process (one per worker, serving task after task, each in a fresh namespace; replaced when a
  task leaves state behind or times out), which calls the program through a proxy and receives
  return values as strictly typed data (exact builtin types only); pytest-style tasks (KodCode)
  run with the real pytest in that judge, the program imported through a proxy module whose
  objects stay in the candidate (`pytest_judge`: values as data, other objects as handles whose
  equality is identity, exceptions by name); stdin/stdout tasks are compared on the host.
  Expected outputs and tests never enter the program's address space; test modules are written
  to a tmpfs only the judge's uid can enter.

What is not isolated: the kernel is shared, and the filter is a deny list (every call not
named above is allowed, so a bug in an allowed call stays reachable); the sandbox runs as real
root with capabilities dropped, not in a user namespace (the uid drop is what binds
RLIMIT_NPROC); ``/usr`` is readable, so the program can see what is installed; the programs of
one worker share its network, IPC and PID namespaces one after another (each program's
processes are killed before the next starts; counters such as the next PID or port number are
not reset); CPU time is not partitioned between sandboxes (no cpu cgroup); timing side channels
are open. Missing bubblewrap, root or libseccomp stop the pool from starting; missing cgroups
(pids, memory) are listed by `worker.probe`, printed at start-up, and appended to every
outcome's detail.
"""
