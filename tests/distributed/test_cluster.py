"""Connecting to Ray: the shared local cluster answers, and a second connect keeps the first."""

from posttrain.distributed.cluster import connect


def test_local_cluster_runs_a_task_and_connect_is_idempotent(ray_cluster):
    ray = ray_cluster

    @ray.remote
    def square(x):
        return x * x

    assert ray.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    assert connect("") is ray and ray.cluster_resources()["CPU"] == 8
