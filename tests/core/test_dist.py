"""What each rank owns of a step, in one process (the collectives are tested at 2 ranks elsewhere)."""

import pytest

from posttrain.core.dist import World, shard_range


@pytest.mark.parametrize("n,world_size", [(8, 2), (7, 2), (3, 4), (1, 2), (0, 3), (10, 4)])
def test_shard_range_gives_every_row_once_in_blocks_that_differ_by_at_most_one(n, world_size):
    blocks = [shard_range(n, World(rank=r, world_size=world_size)) for r in range(world_size)]
    assert [i for b in blocks for i in b] == list(range(n))  # contiguous, in rank order, each row once
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    assert [len(b) for b in blocks] == sorted((len(b) for b in blocks), reverse=True)  # the first ranks take more


def test_exit_rank_runs_the_exit_handlers_flushes_and_keeps_the_code_without_the_interpreter_teardown(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f'''
        import atexit, sys
        from posttrain.core.dist import exit_rank

        class Teardown:
            def __del__(self):  # runs as the interpreter tears the module down
                print("interpreter teardown", flush=True)

        kept = Teardown()
        import threading, time
        threading.Thread(target=lambda: (time.sleep(0.5), print("thread done, ", end=""))).start()  # not a daemon
        atexit.register(lambda: open({str(tmp_path / "handler")!r}, "w").write("ran"))
        print("buffered line", end="")  # a pipe is block-buffered: lost unless flushed
        exit_rank(3)
        print("never reached")
    ''')
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    assert r.stdout == "buffered linethread done, "  # waited for the thread; flushed; no teardown, nothing after
    assert (tmp_path / "handler").read_text() == "ran"
