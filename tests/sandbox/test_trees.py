"""Project trees: named by content, written once, seen in the sandbox through an overlay that a
program may change without the change reaching the next program or the shared copy."""

from __future__ import annotations

import os
import pickle
import stat

from posttrain.sandbox import trees, zygote
from posttrain.sandbox.pool import Job
from posttrain.sandbox.trees import Tree, materialize, overlay

FILES = {"pkg/__init__.py": "X = 1\n", "pkg/mod.py": "def f():\n    return 2\n", "README": "hi\n"}


def test_a_tree_is_named_by_its_paths_and_texts():
    assert Tree(dict(FILES)).name == Tree(dict(reversed(list(FILES.items())))).name  # order does not count
    assert Tree({**FILES, "README": "hi!\n"}).name != Tree(FILES).name
    assert Tree({"ab": "c"}).name != Tree({"a": "bc"}).name  # where a path ends is part of the name
    assert Tree({"a": ""}).name != Tree({}).name
    copy = pickle.loads(pickle.dumps(Tree(FILES)))  # how a farm actor gets it
    assert copy.name == Tree(FILES).name and dict(copy.files) == FILES


def test_the_overlay_holds_only_what_differs():
    view = {**FILES, "pkg/mod.py": "def f():\n    return 3\n", "pkg/new.py": "y = 2\n"}
    del view["README"]
    assert overlay(FILES, view) == {"pkg/mod.py": "def f():\n    return 3\n", "pkg/new.py": "y = 2\n", "README": None}
    assert overlay(FILES, dict(FILES)) == {}
    assert overlay(FILES, {**FILES, "README": "hi" + "\n"}) == {}  # equal text, another object


def test_materialize_writes_once_with_modes_the_program_can_change():
    tree = Tree({**FILES, "a/b/c/d.py": "deep\n"})
    name = materialize(tree)
    root = os.path.join(trees.store_root(), name)
    assert stat.S_IMODE(os.stat(trees.store_root()).st_mode) == 0o700  # no other user of the host gets in
    got = {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f)).read()
           for d, _, fs in os.walk(root) for f in fs}
    assert got == tree.files
    for d, _, fs in os.walk(root):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o777
        assert all(stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o666 for f in fs)
    mtime = os.stat(os.path.join(root, "README")).st_mtime_ns
    assert materialize(Tree(dict(tree.files))) == name  # the same content: the same folder, not rewritten
    assert os.stat(os.path.join(root, "README")).st_mtime_ns == mtime
    assert not [p for p in os.listdir(trees.store_root()) if p.startswith(".part-")]


def test_the_copy_fallback_gives_the_same_tree_with_the_same_modes(tmp_path):
    src = os.path.join(trees.store_root(), materialize(Tree({**FILES, "a/b.py": "x\n"})))
    dst = tmp_path / "work"
    dst.mkdir()
    zygote._copy_tree(src, str(dst))
    got = {str(p.relative_to(dst)): p.read_text() for p in dst.rglob("*") if p.is_file()}
    assert got == {**FILES, "a/b.py": "x\n"}
    assert stat.S_IMODE((dst / "a").stat().st_mode) == 0o777
    assert stat.S_IMODE((dst / "a" / "b.py").stat().st_mode) == 0o666


PROGRAM = r'''
import os
root = "/tmp/work"
print(open(root + "/pkg/mod.py").read().splitlines()[-1].strip())
print(sorted(os.listdir(root + "/pkg")))
with open(root + "/pkg/mod.py", "w") as f:
    f.write("def f():\n    return 3\n")
os.remove(root + "/pkg/__init__.py")
os.makedirs(root + "/pkg/sub")
with open(root + "/pkg/sub/t.py", "w") as f:
    f.write("z")
os.chmod(root + "/pkg/sub", 0o755)  # what pytest does to its cache folder
print(sorted(os.listdir(root + "/pkg")), open(root + "/pkg/mod.py").read().splitlines()[-1].strip())
for where in ("/sandbox/trees", "/tmp/.layers/up"):
    try:
        os.listdir(where)
        print("open", where)
    except PermissionError:
        print("closed", where)
mounts = [line.split() for line in open("/proc/self/mountinfo")]
print([m[m.index("-") + 1] for m in mounts if m[4] == root])
'''


def test_a_program_sees_the_tree_and_its_changes_stay_in_its_run(pool):
    tree = Tree(FILES)
    first, second = pool.run([Job(PROGRAM, io=(("", ""),), capture=True, tree=tree)] * 2)
    assert first.detail == second.detail, second.detail  # nothing the first wrote reached the second
    lines = first.detail.splitlines()
    assert lines[:2] == ["return 2", "['__init__.py', 'mod.py']"]
    assert lines[2] == "['mod.py', 'sub'] return 3"  # written, removed and made in the run
    assert lines[3:5] == ["closed /sandbox/trees", "closed /tmp/.layers/up"]  # other trees, the layers
    assert lines[5] == "['overlay']", "the tree was copied, not mounted: the kernel refused the overlay"
    root = os.path.join(trees.store_root(), tree.name)
    assert open(os.path.join(root, "pkg/mod.py")).read() == FILES["pkg/mod.py"]  # the shared copy is untouched
    assert os.path.exists(os.path.join(root, "pkg/__init__.py"))


def test_a_job_without_a_tree_has_no_project_folder(pool):
    out = pool.run([Job("import os\nprint(os.path.exists('/tmp/work'))", io=(("", ""),), capture=True)])[0]
    assert out.detail.strip() == "False"


# Each attempt on a hidden file prints its name and what happened: "refused <errno name>" or "done".
HIDDEN_PROGRAM = r'''
import errno, os, sys
root = "/tmp/work"
path = root + "/tests/test_a.py"
def attempt(name, fn):
    try:
        fn()
        print(name, "done")
    except OSError as e:
        print(name, "refused", errno.errorcode.get(e.errno, e.errno))
def write():
    with open(path, "a") as f:
        f.write("X = 2\n")
def rename_over():
    with open(root + "/pkg/evil.py", "w") as f:
        f.write("X = 2\n")
    os.rename(root + "/pkg/evil.py", path)
def move_folder():
    os.rename(root + "/tests", root + "/old")
def plant(cache):
    os.makedirs(cache, exist_ok=True)
    with open(cache + "/test_a.cpython-311-pytest-9.2.0.pyc", "wb") as f:
        f.write(b"x")
attempt("write", write)
attempt("truncate", lambda: os.truncate(path, 0))
attempt("rename_over", rename_over)
attempt("unlink", lambda: os.unlink(path))
attempt("chmod", lambda: os.chmod(path, 0o666))
attempt("move_folder", move_folder)
attempt("rename_beside", lambda: (open(root + "/tests/evil.py", "w").close(), os.rename(root + "/tests/evil.py", path)))
attempt("link", lambda: os.link(path, root + "/tests/again.py"))
attempt("upper_layer", lambda: open("/tmp/.layers/up/tests/test_a.py", "w").close())  # the overlay's upper copy
attempt("cache_file", lambda: plant(root + "/tests/__pycache__"))
attempt("cache_folder", lambda: os.rename(root + "/tests/__pycache__", root + "/tests/c"))
attempt("root_conftest", lambda: os.unlink(root + "/conftest.py"))
attempt("beside", lambda: open(root + "/tests/data.txt", "w").close())  # tests still write beside their modules
print("text", open(path).read().strip(), open(root + "/conftest.py").read().strip())
'''


def _attempts(detail: str) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in detail.splitlines()}


def test_a_jobs_hidden_files_are_read_only_to_the_program(pool):
    tree = Tree({**FILES, "tests/test_a.py": "X = 0\n"})
    hidden = {"tests/test_a.py": "X = 1\n", "conftest.py": "Y = 1\n"}
    out = pool.run([Job(HIDDEN_PROGRAM, io=(("", ""),), capture=True, tree=tree, hidden=hidden)])[0]
    got = _attempts(out.detail)
    assert got["text"] == "X = 1 Y = 1", out.detail  # the hidden text, not the tree's, and unchanged
    # 0444 and another owner refuse first (EACCES); the read-only mount refuses even chmod (EROFS)
    assert {got["write"], got["truncate"]} <= {"refused EACCES", "refused EROFS"}, out.detail
    assert got["chmod"] == "refused EROFS", out.detail
    assert got["rename_over"] in ("refused EBUSY", "refused EXDEV"), out.detail  # a mount point is never replaced
    assert got["unlink"] == got["root_conftest"] == "refused EBUSY", out.detail
    assert got["move_folder"] == got["cache_folder"] == "refused EBUSY", out.detail
    assert got["rename_beside"] in ("refused EBUSY", "refused EXDEV"), out.detail
    assert got["link"] in ("refused EXDEV", "refused EPERM"), out.detail
    assert got["upper_layer"] == "refused EACCES", out.detail
    assert got["cache_file"] == "refused EROFS", out.detail  # no bytecode where Python and pytest look by default
    assert got["beside"] == "done", out.detail


def test_hidden_files_go_with_the_tree(pool):
    tree = Tree({**FILES, "tests/test_a.py": "X = 0\n"})
    first = Job(HIDDEN_PROGRAM, io=(("", ""),), capture=True, tree=tree, hidden={"tests/test_a.py": "X = 1\n",
                                                                                  "conftest.py": "Y = 1\n"})
    after = Job("import os\nprint(open('/tmp/work/tests/test_a.py').read().strip(), os.path.exists('/tmp/work/conftest.py'))\n"
                "os.unlink('/tmp/work/tests/test_a.py')\nprint('unlinked')", io=(("", ""),), capture=True, tree=tree)
    out = pool.run([first, after])[1]
    assert out.detail.splitlines() == ["X = 0 False", "unlinked"], out.detail  # the next job sees its own tree


def test_hidden_files_need_a_tree():
    import pytest

    with pytest.raises(ValueError, match="tree"):
        Job("print(1)", io=(("", ""),), hidden={"a.py": ""})


def test_hidden_files_travel_with_a_pickled_job():
    """How a farm actor gets a job: the hidden files come along, and the request carries them."""
    from posttrain.sandbox.worker import SandboxConfig

    job = Job("print(1)", io=(("", ""),), tree=Tree(FILES), hidden={"tests/test_a.py": "X = 1\n"})
    req = pickle.loads(pickle.dumps(job)).request(SandboxConfig(workers=1))
    assert req["hidden"] == {"tests/test_a.py": "X = 1\n"} and req["tree"] == Tree(FILES).name
