"""Adversarial programs, one property per test. Each asserts the outcome, and the ``guard`` fixture
then asserts that nothing leaked: no sandbox process left, host files and /usr unchanged, nothing
in the host's /tmp or /dev/shm, the sandbox was not replaced, and the canaries still pass.

These attacks are real (a fork bomb under the limits, 1 GB printed, ``rm -rf /``); the sandbox
is what keeps them harmless."""

from __future__ import annotations

import socket
import time

import pytest

from posttrain.sandbox.pool import Job

ANSWER_TESTS = "def check(candidate):\n    assert candidate(2) == 4\n"


def judge(pool, program: str, tests: str = ANSWER_TESTS, timeout_s: float | None = None, prelude: str = ""):
    outcome = pool.run([Job(program, "f", tests, prelude, timeout_s=timeout_s)])[0]
    return outcome.cls.value, outcome.reason


def judge_io(pool, program: str, io: list[tuple[str, str]], timeout_s: float | None = None):
    outcome = pool.run([Job(program, io=tuple(io), timeout_s=timeout_s)])[0]
    return outcome.cls.value, outcome.reason


def wrapped(body: str, top: str = "") -> str:
    """A program whose ``f`` runs ``body`` and then answers correctly."""
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{top}\ndef f(x):\n{lines}\n    return x * 2\n"


# ----------------------------------------------------------------------------- time
def test_infinite_loop_times_out(pool, guard):
    t = time.monotonic()
    assert judge(pool, wrapped("while True:\n    pass"), timeout_s=1.0) == ("MODEL_FAIL", "timeout")
    assert time.monotonic() - t < 5


def test_long_sleep_times_out(pool, guard):
    t = time.monotonic()
    assert judge(pool, wrapped("import time\ntime.sleep(3600)"), timeout_s=1.0) == ("MODEL_FAIL", "timeout")
    assert time.monotonic() - t < 5


def test_patched_clock_still_times_out(pool, guard):
    body = "import time\ntime.time = time.monotonic = time.perf_counter = lambda: 0.0\nwhile True:\n    pass"
    assert judge(pool, wrapped(body), timeout_s=1.0) == ("MODEL_FAIL", "timeout")


def test_ignoring_sigterm_and_sigalrm_still_times_out(pool, guard):
    body = ("import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGXCPU):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass")
    assert judge(pool, wrapped(body), timeout_s=1.0) == ("MODEL_FAIL", "timeout")


# ----------------------------------------------------------------------------- processes
def test_os_fork_bomb(pool, guard):
    body = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    cls, _ = judge(pool, wrapped(body), timeout_s=1.0)
    assert cls == "MODEL_FAIL"


def test_multiprocessing_fork_bomb(pool, guard):
    body = ("import multiprocessing, time\n"
            "def spin():\n    while True:\n        pass\n"
            "procs = []\n"
            "for _ in range(200):\n"
            "    try:\n        p = multiprocessing.Process(target=spin); p.start(); procs.append(p)\n"
            "    except Exception:\n        break\n"
            "time.sleep(60)")
    cls, _ = judge(pool, wrapped(body), timeout_s=1.5)
    assert cls == "MODEL_FAIL"


def test_subprocess_fork_bomb(pool, guard):
    body = ("import subprocess, sys\n"
            "for _ in range(200):\n"
            "    try:\n        subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
            "    except Exception:\n        pass\n"
            "while True:\n    pass")
    cls, _ = judge(pool, wrapped(body), timeout_s=1.5)
    assert cls == "MODEL_FAIL"


def test_setsid_daemon_is_killed(pool, guard):
    # The double-forked, setsid'd grandchild outlives f; the answer is right, so PASS — and the
    # guard checks the daemon is gone afterwards.
    body = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        while True:\n            time.sleep(0.01)\n"
            "    os._exit(0)\n"
            "time.sleep(0.1)")
    assert judge(pool, wrapped(body)) == ("PASS", "")


def test_kill_parent_and_everyone(pool, guard):
    body = "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, 9)\n    except OSError:\n        pass"
    assert judge(pool, wrapped(body).replace("return x * 2", "return x")) == ("MODEL_FAIL", "wrong_answer")
    # kill(-1) reaches only its own uid's processes, and Linux spares the caller: it answers on.
    assert judge(pool, wrapped("import os\nos.kill(-1, 9)")) == ("PASS", "")
    assert judge(pool, wrapped("import os\nos.kill(0, 9)")) == ("MODEL_FAIL", "no_verdict")


# ----------------------------------------------------------------------------- memory, files, output
def test_huge_allocation(pool, guard):
    assert judge(pool, wrapped("b = bytearray(8 << 30)")) == ("MODEL_FAIL", "memory")


def test_gradual_allocation(pool, guard):
    body = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"
    assert judge(pool, wrapped(body), timeout_s=20) == ("MODEL_FAIL", "memory")


def test_huge_file(pool, guard):
    body = "with open('/tmp/big', 'wb') as fh:\n    for _ in range(1024):\n        fh.write(b'x' * (1 << 20))"
    assert judge(pool, wrapped(body)) == ("MODEL_FAIL", "runtime_error")


def test_filling_tmp(pool, guard):
    body = ("for i in range(100):\n    with open(f'/tmp/f{i}', 'wb') as fh:\n"
            "        fh.write(b'x' * (8 << 20))\n"
            "for i in range(100000):\n    open(f'/dev/shm/s{i}', 'w').close()")
    assert judge(pool, wrapped(body)) == ("MODEL_FAIL", "runtime_error")


def test_printing_a_gigabyte(pool, guard):
    t = time.monotonic()
    body = "import sys\nline = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(line)"
    assert judge(pool, wrapped(body), timeout_s=10) == ("MODEL_FAIL", "output_limit")
    assert judge_io(pool, "line = 'y' * (1 << 20)\nfor _ in range(1024):\n    print(line)",
                    [("", "")], timeout_s=10) == ("MODEL_FAIL", "output_limit")
    assert time.monotonic() - t < 8


def test_rm_rf_root(pool, guard, sentinel):
    body = ("import shutil, subprocess\n"
            "subprocess.run(['rm', '-rf', '--no-preserve-root', '/'], capture_output=True)\n"
            f"shutil.rmtree('/', ignore_errors=True)\nshutil.rmtree({str(sentinel.parent)!r}, ignore_errors=True)")
    assert judge(pool, wrapped(body), timeout_s=30) == ("PASS", "")


def test_rmtree_home(pool, guard):
    body = ("import os, shutil\n"
            "for d in (os.path.expanduser('~'), '/root', '/home', '/work', os.getcwd()):\n"
            "    shutil.rmtree(d, ignore_errors=True)")
    assert judge(pool, wrapped(body)) == ("PASS", "")


# ----------------------------------------------------------------------------- reading what it must not
def _must_not_read(pool, reader: str, secret: str) -> None:
    """``reader`` returns what it found; the tests pass only if the secret was found. The verdict
    must be wrong_answer: the reader ran to its end and came back without the secret. A reader
    that crashed, ran out of memory or time shows nothing about what it could have read."""
    tests = f"def check(candidate):\n    assert {secret!r} in str(candidate())\n"
    program = f"def f():\n{reader}"
    assert judge(pool, program, tests) == ("MODEL_FAIL", "wrong_answer")


def test_a_reader_that_crashed_shows_nothing(pool, guard):
    """The check above can fail: a reader that dies before looking is not proof of isolation."""
    with pytest.raises(AssertionError):
        _must_not_read(pool, "    raise MemoryError\n", "anything")


def test_reading_etc_shadow(pool, guard):
    secret = open("/etc/shadow").read().split(":", 1)[0]  # "root": the file's first field
    reader = "    try:\n        return open('/etc/shadow').read()\n    except OSError as e:\n        return repr(e)\n"
    _must_not_read(pool, reader, secret + ":")


def test_reading_environment(pool, guard, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "env-secret-51c2")
    reader = ("    import glob\n    out = []\n"
              "    for p in ['/proc/self/environ', '/proc/1/environ'] + glob.glob('/proc/*/environ'):\n"
              "        try:\n            out.append(open(p, 'rb').read().decode())\n"
              "        except OSError:\n            pass\n"
              "    import os\n    return ' '.join(out) + str(dict(os.environ))\n")
    _must_not_read(pool, reader, "env-secret-51c2")
    _must_not_read(pool, reader, "PATH=")


def test_reading_the_parents_files(pool, guard, sentinel):
    paths = [str(sentinel), f"/proc/1/root{sentinel}", "/proc/1/cwd/" + sentinel.name]
    reader = (f"    out = []\n    for p in {paths!r}:\n"
              "        try:\n            out.append(open(p).read())\n"
              "        except OSError:\n            pass\n    return ' '.join(out)\n")
    _must_not_read(pool, reader, sentinel.read_text().strip())


def test_reading_the_tests(pool, guard):
    # The tests carry a marker; the program searches every process's memory, fds, cmdline and
    # the filesystem for it and returns it if found. The tests pass only if it was found.
    reader = ("    import glob, os, re\n    found = []\n"
              "    for pid in os.listdir('/proc'):\n"
              "        if not pid.isdigit():\n            continue\n"
              "        for name in ('cmdline', 'environ'):\n"
              "            try:\n                found.append(open(f'/proc/{pid}/{name}', 'rb').read())\n"
              "            except OSError:\n                pass\n"
              "        try:\n"
              "            maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
              "            mem = open(f'/proc/{pid}/mem', 'rb')\n"
              "            for line in maps:\n"
              "                lo, hi = (int(v, 16) for v in line.split()[0].split('-'))\n"
              "                try:\n                    mem.seek(lo); found.append(mem.read(min(hi - lo, 1 << 22)))\n"
              "                except (OSError, ValueError, OverflowError):\n                    pass\n"
              "        except OSError:\n            pass\n"
              "    for p in glob.glob('/tmp/**', recursive=True) + glob.glob('/sandbox/*'):\n"
              "        try:\n            found.append(open(p, 'rb').read())\n"
              "        except OSError:\n            pass\n"
              "    blob = b' '.join(found)\n"
              "    m = re.search(rb'MARK' + rb'ER-[0-9a-f]{6}', blob)\n"
              "    return m.group().decode() if m else 'nothing'\n")
    _must_not_read(pool, reader, "MARKER-7e3a90")


def test_reading_expected_output_of_io_tasks(pool, guard):
    # Expected stdout never enters the sandbox: the host compares it.
    program = ("import glob\nfor p in glob.glob('/proc/*/cmdline') + glob.glob('/tmp/*'):\n"
               "    try:\n        data = open(p, 'rb').read()\n    except OSError:\n        continue\n"
               "    if b'EXPECTED-' in data:\n        print(data.split(b'EXPECTED-')[1][:6].decode())\n")
    assert judge_io(pool, program, [("", "EXPECTED-4b1d2c")]) == ("MODEL_FAIL", "wrong_answer")


# ----------------------------------------------------------------------------- network
def test_outbound_tcp(pool, guard):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    reader = ("    import socket\n    out = []\n"
              f"    for host in ('127.0.0.1', '1.1.1.1', '8.8.8.8'):\n"
              "        try:\n"
              f"            socket.create_connection((host, {port} if host == '127.0.0.1' else 53), timeout=0.3)\n"
              "            out.append('connected')\n"
              "        except OSError as e:\n            out.append(repr(e))\n"
              "    return ' '.join(out)\n")
    try:
        _must_not_read(pool, reader, "connected")
        try:
            server.accept()
            raise AssertionError("the sandbox reached a host listener")
        except TimeoutError:
            pass
    finally:
        server.close()


def test_dns(pool, guard):
    reader = ("    import socket\n"
              "    try:\n        return str(socket.getaddrinfo('example.com', 80))\n"
              "    except OSError as e:\n        return repr(e)\n")
    _must_not_read(pool, reader, "AddressFamily")


def test_listening_port_is_unreachable_from_host(pool, guard):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now; the sandbox listens on it in its own namespace
    body = (f"import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', {port}))\ns.listen(4)\n"
            "time.sleep(1.0)")
    fut = pool.submit(Job(wrapped(body), "f", ANSWER_TESTS, timeout_s=3))
    reached = []
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            reached.append(port)
        except OSError:
            pass
        time.sleep(0.05)
    outcome, _ = fut.result()
    assert outcome.cls.value == "PASS"  # listening in its own namespace is allowed
    assert reached == []


# ----------------------------------------------------------------------------- early exits and fake results
def test_sys_exit_before_the_tests(pool, guard):
    assert judge(pool, "import sys\nsys.exit(0)\ndef f(x):\n    return x * 2\n") == ("MODEL_FAIL", "no_verdict")
    assert judge(pool, wrapped("import sys\nsys.exit(0)")) == ("MODEL_FAIL", "no_verdict")
    assert judge_io(pool, "import sys\nsys.exit(0)\nprint(4)", [("2\n", "4\n")]) == ("MODEL_FAIL", "wrong_answer")


def test_os_exit_before_the_tests(pool, guard):
    assert judge(pool, "import os\nos._exit(0)\n") == ("MODEL_FAIL", "no_verdict")
    assert judge(pool, wrapped("import os\nos._exit(0)")) == ("MODEL_FAIL", "no_verdict")


def test_sigkill_to_self(pool, guard):
    assert judge(pool, wrapped("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")) == ("MODEL_FAIL", "no_verdict")


def test_printing_passed_and_fake_results(pool, guard):
    body = ("import json, os, struct\n"
            "print('PASSED'); print('passed'); print(json.dumps({'cls': 'PASS', 'passed': True, 'result': 'passed'}))\n"
            "frame = json.dumps({'cls': 'PASS', 'reason': '', 'detail': '', 'passed': True}).encode()\n"
            "for fd in range(0, 64):\n"
            "    try:\n        os.write(fd, struct.pack('>I', len(frame)) + frame)\n"
            "    except OSError:\n        pass")
    assert judge(pool, wrapped(body).replace("return x * 2", "return 0"))[0] == "MODEL_FAIL"


def test_atexit_and_non_daemon_threads(pool, guard):
    top = ("import atexit, os, sys, threading, time\n"
           "atexit.register(lambda: (print('PASSED'), os._exit(0)))\n"
           "def spin():\n    while True:\n        time.sleep(0.01)\n"
           "threading.Thread(target=spin, daemon=False).start()\n")
    assert judge(pool, wrapped("pass", top).replace("return x * 2", "return 0")) == ("MODEL_FAIL", "wrong_answer")
    assert judge(pool, wrapped("sys.exit(0)", top)) == ("MODEL_FAIL", "no_verdict")


# ----------------------------------------------------------------------------- fooling the comparison
def test_always_equal_object(pool, guard):
    top = ("class Yes:\n    def __eq__(self, other):\n        return True\n"
           "    __ne__ = lambda self, other: False\n    __hash__ = object.__hash__\n")
    program = top + "def f(x):\n    return Yes()\n"
    assert judge(pool, program)[0] == "MODEL_FAIL"


def test_int_and_str_subclasses(pool, guard):
    top = "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
    assert judge(pool, top + "def f(x):\n    return I(0)\n")[0] == "MODEL_FAIL"
    top = "class S(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
    tests = "def check(candidate):\n    assert candidate(2) == 'four'\n"
    assert judge(pool, top + "def f(x):\n    return S('')\n", tests)[0] == "MODEL_FAIL"
    assert judge(pool, "def f(x):\n    return [True.__class__(1)]\n",
                 "def check(candidate):\n    assert candidate(2) == [1]\n")[0] == "PASS"  # real bools are fine


def test_stack_walking_and_gc(pool, guard):
    body = ("import gc, sys\n"
            "f_ = sys._getframe()\n"
            "while f_ is not None:\n"
            "    for k, v in list(f_.f_locals.items()):\n"
            "        if isinstance(v, list):\n            v.append('passed')\n"
            "    f_ = f_.f_back\n"
            "for o in gc.get_objects():\n"
            "    if isinstance(o, list):\n        o.append('passed')\n"
            "    if isinstance(o, dict) and 'check' in o:\n        o['check'] = lambda c: None")
    assert judge(pool, wrapped(body).replace("return x * 2", "return 0")) == ("MODEL_FAIL", "wrong_answer")


def test_patching_builtins_check_and_import(pool, guard):
    top = ("import builtins, sys\n"
           "builtins.AssertionError = type('Nope', (Exception,), {})\n"
           "def check(candidate):\n    pass\n"
           "builtins.check = check\n"
           "real_import = builtins.__import__\n"
           "builtins.__import__ = lambda *a, **k: (_ for _ in ()).throw(SystemExit(0))\n")
    assert judge(pool, top + "def f(x):\n    return 0\n") == ("MODEL_FAIL", "wrong_answer")


def test_dropping_sitecustomize_and_conftest(pool, guard):
    payload = "import builtins\nbuiltins.AssertionError = Exception\n"
    body = ("import os, site, sys\n"
            "targets = ['/tmp', os.getcwd(), '/sandbox', '/'] + site.getsitepackages() + [site.getusersitepackages()] + sys.path\n"
            "for d in targets:\n"
            "    for name in ('sitecustomize.py', 'usercustomize.py', 'conftest.py'):\n"
            "        try:\n"
            f"            open(os.path.join(d, name), 'w').write({payload!r})\n"
            "        except (OSError, TypeError):\n            pass")
    assert judge(pool, wrapped(body).replace("return x * 2", "return 0")) == ("MODEL_FAIL", "wrong_answer")
    # The next program (and the guard's canaries) run in a sandbox the files did not reach.
    assert judge(pool, "def f(x):\n    return 0\n") == ("MODEL_FAIL", "wrong_answer")


def test_redefining_a_prelude_helper(pool, guard):
    # HumanEval/32's shape: the tests call the prompt's helper `poly`; a completion that
    # redefines it to return 0 (so any root "works") must not pass.
    prelude = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n"
    tests = "def check(candidate):\n    xs = [1, 2]\n    assert abs(poly(xs, candidate(xs))) < 1e-6\n"
    cheat = "def poly(xs, x):\n    return 0\ndef f(xs):\n    return 123.0\n"
    assert judge(pool, cheat, tests, prelude=prelude) == ("MODEL_FAIL", "wrong_answer")
    assert judge(pool, prelude + "def f(xs):\n    return -0.5\n", tests, prelude=prelude) == ("PASS", "")


# ----------------------------------------------------------------------------- state and crashes
def test_no_state_between_episodes(pool, guard):
    write = wrapped("import os\nfor p in ('/tmp/left', '/dev/shm/left', os.path.expanduser('~/left')):\n"
                    "    try:\n        open(p, 'w').write('A')\n    except OSError:\n        pass")
    assert judge(pool, write) == ("PASS", "")
    look = ("import glob, os\ndef f():\n"
            "    return sorted(glob.glob('/tmp/*') + glob.glob('/dev/shm/*') + glob.glob(os.path.expanduser('~/left')))\n")
    assert judge(pool, look, "def check(candidate):\n    assert candidate() == []\n") == ("PASS", "")


def test_deep_recursion_segfault(pool, guard):
    # Each level passes through C (map), so the C stack overflows: a real segfault.
    body = "import sys\nsys.setrecursionlimit(10 ** 8)\ndef r(n):\n    return list(map(r, [n + 1]))\nr(0)"
    assert judge(pool, wrapped(body), timeout_s=20) == ("MODEL_FAIL", "no_verdict")


def test_honest_code_using_os_threads_and_recursion_passes(pool, guard):
    program = ("import os, threading, functools\n"
               "@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
               "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
               "def f(x):\n"
               "    out = []\n"
               "    ts = [threading.Thread(target=lambda i=i: out.append(i * i)) for i in range(4)]\n"
               "    [t.start() for t in ts]; [t.join() for t in ts]\n"
               "    os.makedirs('/tmp/work', exist_ok=True)\n"
               "    open('/tmp/work/a', 'w').write(str(x))\n"
               "    y = int(open('/tmp/work/a').read())\n"
               "    return [sorted(out), fib(30), depth(500), y * 2, os.path.join('a', 'b')]\n")
    tests = ("def check(candidate):\n"
             "    assert candidate(2) == [[0, 1, 4, 9], 832040, 500, 4, 'a/b']\n")
    assert judge(pool, program, tests) == ("PASS", "")
    assert judge_io(pool, "import sys\nn = int(sys.stdin.read())\nprint(n * 2)", [("21\n", "42\n"), ("0", "0")]) == ("PASS", "")


# ----------------------------------------------------------------------------- pytest-style tests (KodCode's form)
PYTEST_TESTS = ("import pytest\nfrom solution import f\n\n"
                "def test_f():\n    assert f(2) == 4\n\n"
                "@pytest.mark.parametrize('x', [1, 3])\ndef test_more(x):\n    assert f(x) == 2 * x\n")
WRONG = "def f(x):\n    return 0\n"


def judge_pytest(pool, program: str, tests: str = PYTEST_TESTS, timeout_s: float | None = None):
    outcome = pool.run([Job(program, tests=tests, module="solution", timeout_s=timeout_s)])[0]
    return outcome.cls.value, outcome.reason


def test_pytest_sys_exit_at_import(pool, guard):
    assert judge_pytest(pool, "import sys\nsys.exit(0)\n" + WRONG) == ("MODEL_FAIL", "no_verdict")


def test_pytest_os_exit_at_import(pool, guard):
    assert judge_pytest(pool, "import os\nos._exit(0)\n" + WRONG) == ("MODEL_FAIL", "no_verdict")


def test_pytest_os_exit_during_a_test(pool, guard):
    assert judge_pytest(pool, "import os\ndef f(x):\n    os._exit(0)\n") == ("MODEL_FAIL", "no_verdict")


def test_pytest_patching_pytest(pool, guard):
    # A stand-in `pytest` everywhere the program can reach: its own modules, /tmp, its cwd.
    fake = "def main(*a, **k):\n    return 0\nclass mark:\n    parametrize = staticmethod(lambda *a, **k: (lambda f: f))\n"
    top = ("import sys, types, os\n"
           f"fake = types.ModuleType('pytest')\nexec({fake!r}, fake.__dict__)\n"
           "sys.modules['pytest'] = sys.modules['_pytest'] = fake\n"
           "for d in ('/tmp', os.getcwd()):\n"
           "    try:\n"
           f"        open(os.path.join(d, 'pytest.py'), 'w').write({fake!r})\n"
           "    except OSError:\n        pass\n")
    assert judge_pytest(pool, top + WRONG) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_patching_builtins(pool, guard):
    top = ("import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
           "builtins.isinstance = lambda *a: True\nbuiltins.__import__ = None\n")
    assert judge_pytest(pool, top + WRONG)[0] == "MODEL_FAIL"  # it breaks its own answers, not the judge


def test_pytest_always_equal_object(pool, guard):
    program = ("class Yes:\n    def __eq__(self, other):\n        return True\n"
               "    __ne__ = lambda self, other: False\n    __hash__ = object.__hash__\n"
               "    __bool__ = lambda self: True\n"
               "def f(x):\n    return Yes()\n")
    assert judge_pytest(pool, program) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_conftest_and_ini_written_by_the_program(pool, guard):
    conftest = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                "    outcome.get_result().outcome = 'passed'\n")
    top = ("import os\n"
           "for d in ('/tmp', '/', '/judge', '/sandbox', '/sandbox/lib', os.getcwd(), '/dev/shm'):\n"
           "    for name, text in (('conftest.py', CONFTEST), ('pytest.ini', '[pytest]\\naddopts = -p no:python\\n'),\n"
           "                       ('tox.ini', '[pytest]\\naddopts = --co\\n')):\n"
           "        try:\n            open(os.path.join(d, name), 'w').write(text)\n"
           "        except OSError:\n            pass\n")
    assert judge_pytest(pool, f"CONFTEST = {conftest!r}\n" + top + WRONG) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_star_import_cannot_shadow_builtins(pool, guard):
    tests = "from solution import *\n\ndef test_f():\n    assert sorted(f([3, 1, 2])) == [1, 2, 3]\n    assert len(f([1])) == 1\n"
    program = "def sorted(x):\n    return [1, 2, 3]\ndef len(x):\n    return 1\ndef f(xs):\n    return None\n"
    assert judge_pytest(pool, program, tests)[0] == "MODEL_FAIL"


def test_pytest_exceptions_named_like_pytest_outcomes(pool, guard):
    # pytest turns Skipped, XFailed and unittest's SkipTest into skips; the program's namesakes
    # arrive as plain exceptions of the program, so each test fails instead of being skipped.
    program = ("import unittest\nclass Skipped(Exception):\n    pass\n"
               "def f(x):\n    raise (unittest.SkipTest if x == 2 else Skipped)('skip')\n")
    assert judge_pytest(pool, program) == ("MODEL_FAIL", "runtime_error")


def test_pytest_tests_out_of_the_programs_reach(pool, guard):
    top = "import os\nTESTS = [open(os.path.join('/judge', d, 'test_task.py')).read() for d in os.listdir('/judge')]\n"
    assert judge_pytest(pool, top + WRONG) == ("MODEL_FAIL", "runtime_error")


def test_pytest_filling_tmp_is_still_the_programs_fault(pool, guard):
    # A full /tmp must not turn a wrong answer into a masked outcome (TASK_FAIL, INFRA_FAIL).
    top = ("import os\ntry:\n    with open('/tmp/fill', 'wb') as fh:\n        while True:\n"
           "            fh.write(b'x' * (1 << 20))\nexcept OSError:\n    pass\n"
           "for i in range(5000):\n    try:\n        os.mkdir(f'/tmp/d{i}')\n    except OSError:\n        break\n")
    tests = PYTEST_TESTS + "\ndef test_file(tmp_path):\n    (tmp_path / 'a').write_text('x')\n    assert f(1) == 2\n"
    assert judge_pytest(pool, top + WRONG, tests, timeout_s=10)[0] == "MODEL_FAIL"


def test_pytest_container_claiming_everything(pool, guard):
    # `x in result` is decided by the judge over the items, never by the program's __contains__.
    tests = "from solution import f\n\ndef test_f():\n    assert 3 in f(1) and 'x' in f(2)\n"
    program = ("class All:\n    def __contains__(self, item):\n        return True\n"
               "    def __iter__(self):\n        return iter(())\n"
               "def f(x):\n    return All()\n")
    assert judge_pytest(pool, program, tests) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_printing_into_capsys_is_bounded(pool, guard):
    # What the program prints during calls is carried to the judge (capsys reads it): bounded there too.
    tests = "from solution import f\n\ndef test_f(capsys):\n    for _ in range(50):\n        f(1)\n    assert f(2) == 4\n"
    program = "def f(x):\n    print('y' * (1 << 19))\n    return 2 * x\n"
    assert judge_pytest(pool, program, tests, timeout_s=10) == ("MODEL_FAIL", "output_limit")


def test_pytest_star_import_cannot_replace_the_tests_constants(pool, guard):
    tests = "EXPECTED = 4\nfrom solution import *\n\ndef test_f():\n    assert f(2) == EXPECTED\n"
    program = "EXPECTED = 0\ndef f(x):\n    return 0\n"
    assert judge_pytest(pool, program, tests) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_star_imported_tests_and_setup_cannot_hide_a_failing_test(pool, guard):
    """The star import brings the program's ``test_*`` functions, its test class and its
    ``setup_module`` as plain pytest would: tests of the program's own that pass do not make the
    verdict PASS, the task's failing test still decides it."""
    tests = "from solution import *\n\ndef test_f():\n    assert f(2) == 4\n"
    program = ("pytestmark = []\ndef setup_module(m):\n    pass\ndef test_extra():\n    pass\n"
               "class TestMore:\n    def test_it(self):\n        pass\n"
               "def f(x):\n    return 0\n")
    assert judge_pytest(pool, program, tests) == ("MODEL_FAIL", "wrong_answer")


# A KodCode-format record of four tests whose last asserts a constant that exists only in the
# hidden test module. The program plants `basetemp/j -> /judge` through `tmp_path`, then a link
# to each task folder it can list there, and reads the test module through whatever it reaches:
# a judge that opened `tmp_path` by following links would hand it `/judge`, then the task folder.
PLANT_TESTS = ("from solution import probe\n\nSECRET = 73914\n\n"
               "def test_one(tmp_path):\n    assert probe(tmp_path) >= 0\n\n"
               "def test_two(tmp_path):\n    assert probe(tmp_path) >= 0\n\n"
               "def test_three(tmp_path):\n    assert probe(tmp_path) >= 0\n\n"
               "def test_four(tmp_path):\n    assert probe(tmp_path) == SECRET\n")
PLANT = ("import os, re\nFOUND = [0]\n"
         "def probe(p):\n"
         "    base = os.path.dirname(str(p))\n"
         "    try:\n        os.symlink('/judge', base + '/j')\n    except OSError:\n        pass\n"
         "    try:\n        names = os.listdir('/judge')\n    except OSError:\n        names = []\n"
         "    for d in names:\n"
         "        try:\n            os.symlink('/judge/' + d, base + '/k' + d)\n        except OSError:\n            pass\n"
         "        try:\n"
         "            m = re.search(r'SECRET = (\\d+)', open(f'/judge/{d}/test_task.py').read())\n"
         "            FOUND[0] = int(m.group(1)) if m else FOUND[0]\n"
         "        except OSError:\n            pass\n"
         "    return FOUND[0]\n")
LIST_JUDGE = "import os\ndef f(x):\n    os.listdir('/judge')\n    return x * 2\n"


def test_pytest_link_to_judge_in_tmp_path_cannot_read_the_tests(pool, guard):
    assert judge_pytest(pool, PLANT, PLANT_TESTS) == ("MODEL_FAIL", "wrong_answer")


def test_pytest_link_to_judge_leaves_judge_closed_to_the_next_program(pool, guard):
    judge_pytest(pool, PLANT, PLANT_TESTS)
    assert judge(pool, LIST_JUDGE) == ("MODEL_FAIL", "runtime_error")


def test_judge_dir_is_fresh_for_every_task(pool, guard):
    # Even a task whose own tests open /judge (trusted code, run by the judge) leaves nothing
    # for the next program: /judge is mounted afresh before it.
    tests = "import os\nfrom solution import f\n\ndef test_f():\n    os.chmod('/judge', 0o777)\n    assert f(2) == 4\n"
    assert judge_pytest(pool, "def f(x):\n    return 2 * x\n", tests) == ("PASS", "")
    assert judge(pool, LIST_JUDGE) == ("MODEL_FAIL", "runtime_error")


def test_sandbox_check_on_a_record_that_links_to_judge(make_pool, tmp_path, capsys):
    # Through the command a user runs, on the pytest record form KodCode's tasks load into.
    import json

    from posttrain.cli import main

    make_pool(workers=1).close()  # skips where the machine has no sandbox
    path = tmp_path / "plant.jsonl"
    path.write_text(json.dumps({"id": "plant", "program": PLANT, "tests": PLANT_TESTS, "module": "solution"}) + "\n")
    assert main(["sandbox", "check", str(path), "--workers", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert (line["outcome"], line["reason"]) == ("MODEL_FAIL", "wrong_answer")
