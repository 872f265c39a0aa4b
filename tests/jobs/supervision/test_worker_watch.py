"""The supervisor's watches of MultiKueue workers (jobs.supervision.worker_watch), with stand-in informers:
which informers start on which cluster, when a worker's executions wait, and how a failing worker is named
(on the real planes: tests/jobs/test_multikueue_jobs.py)."""

from __future__ import annotations

import threading
from typing import Any

from cluster import gateway
from jobs.supervision.cache import CacheSource


class FakeInformer:
    def __init__(self, resource: gateway.Resource, namespace: str, **kwargs: Any) -> None:
        self.resource, self.namespace = resource, namespace
        self.cluster = kwargs["cluster"]
        self.on_synced = kwargs["on_synced"]
        self.synced = threading.Event()
        self.error = ""
        self.stopped = False

    def start(self) -> FakeInformer:
        return self

    def stop(self) -> None:
        self.stopped = True

    def by_index(self, index: str, value: str) -> list[Any]:
        return []

    def purge_indexed(self, index: str, value: str) -> int:
        return 0

    def __len__(self) -> int:
        return 0


def _fake(resource: gateway.Resource, namespace: str, **kwargs: Any) -> Any:
    return FakeInformer(resource, namespace, **kwargs)


def _informers(source: CacheSource, worker: str) -> list[Any]:
    return [
        i
        for (w, _), watched in source.workers._watched.items()
        if w == worker
        for i in watched.informers.values()
    ]


def test_a_workers_informers_run_on_it_and_only_its_own_executions_wait_or_fail() -> None:
    source = CacheSource(informer=_fake)
    source.workers.want(1, "worker-1", "team", "dispatch.dev", ("a", 1))
    source.workers.want(2, "worker-2", "team", "dispatch.dev", ("b", 1))
    one, two = _informers(source, "worker-1"), _informers(source, "worker-2")
    # Events, and the TrainJob copy, JobSets, Jobs and pods of the label domain: each on its worker.
    assert sorted(i.resource.kind for i in one) == ["Event", "Job", "JobSet", "Pod", "TrainJob"]
    assert {i.cluster for i in one} == {"worker-1"} and {i.cluster for i in two} == {"worker-2"}
    assert source.informer_count() == 10
    # Until every informer of a worker has listed, its executions wait; the other worker's do not.
    assert source.workers.listing("worker-1", "team") and source.workers.listing("worker-2", "team")
    for informer in two:
        informer.synced.set()
    assert source.workers.listing("worker-1", "team") and not source.workers.listing("worker-2", "team")
    # A failing watch on worker-1: its reads fail, named; worker-2's do not.
    pods = next(i for i in one if i.resource.kind == "Pod")
    pods.error = "worker-1: Pods in team: unreachable: cannot connect to 127.0.0.1:28501"
    assert not source.workers.listing("worker-1", "team")  # failed, not waiting: the cycle says unknown
    assert source.workers.errors("worker-1", "team") == {"Pod": pods.error}
    assert source.workers.errors("worker-2", "team") == {}
    # A second execution on worker-1 shares its watches; they stop with the last one.
    source.workers.want(3, "worker-1", "team", "dispatch.dev", ("c", 1))
    assert len(_informers(source, "worker-1")) == 5
    source.workers.release(1)
    assert not any(i.stopped for i in one)
    source.workers.release(3)
    assert all(i.stopped for i in one) and source.workers.informer_count("worker-1") == 0
    assert source.workers.informer_count("worker-2") == 5
    source.close()
    assert all(i.stopped for i in two) and source.informer_count() == 0
