"""What each rank owns of a step, in one process (the collectives are tested at 2 ranks elsewhere)."""

import pytest

from posttrain.core.dist import World, shard_range


@pytest.mark.parametrize("n,world_size", [(8, 2), (7, 2), (3, 4), (1, 2), (0, 3), (10, 4)])
def test_shard_range_gives_every_row_once_in_blocks_that_differ_by_at_most_one(n, world_size):
    blocks = [shard_range(n, World(rank=r, world_size=world_size)) for r in range(world_size)]
    assert [i for b in blocks for i in b] == list(range(n))  # contiguous, in rank order, each row once
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    assert [len(b) for b in blocks] == sorted((len(b) for b in blocks), reverse=True)  # the first ranks take more
