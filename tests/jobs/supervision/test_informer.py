"""The informer that feeds supervision from watches (issue 21), on the real control plane.

- an informer lists once, then watches; a 410 Gone (injected: the API server keeps old resource versions for
  minutes, so it cannot be made to answer 410 on demand) lists afresh;
- the periodic re-list restores what the copy lost, while the watch goes on;
- an unreachable API server is tried again within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cluster import gateway
from cluster.errors import Expired
from cluster.informer import Informer
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


# ---------------------------------------------------------------- the informer


@pytest.mark.django_db
def test_an_informer_lists_once_then_watches_and_lists_afresh_after_410_gone(
    namespace: str, kube: Any, dispatch_on_cluster: str, monkeypatch: Any
) -> None:
    """The API server keeps old resource versions for minutes (etcd compaction every 5 minutes here), so a
    410 cannot be had on demand: the first watch is answered by an injected 410, as a real one would end."""
    real_open = gateway.open_watch
    injected: list[str] = []
    gone = threading.Event()

    class Gone:
        def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
            gone.wait(30)
            raise Expired("Pods (watch)", "too old resource version", status=410)
            yield  # pragma: no cover

        def close(self) -> None:
            gone.set()

    def open_watch(*args: Any, **kwargs: Any) -> Any:
        if not injected:
            injected.append(kwargs["resource_version"])
            return Gone()
        return real_open(*args, **kwargs)

    monkeypatch.setattr(gateway, "open_watch", open_watch)
    changes: list[tuple[str, str]] = []
    informer = Informer(
        gateway.PODS,
        namespace,
        on_change=lambda kind, obj, old: changes.append((kind, obj["metadata"]["name"])),
        indexers={"name": lambda o: [o["metadata"]["name"]]},
    ).start()
    try:
        assert informer.synced.wait(30)
        # Made while the informer cannot watch: only the list after the 410 can bring it.
        kube.core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "made-in-the-gap"},
                "spec": {"containers": [{"name": "c", "image": "localhost/x:v1"}]},
            },
        )
        gone.set()
        wait_for(lambda: informer.by_index("name", "made-in-the-gap"), timeout=30, what="the pod in the copy")
        assert informer.lists == 2 and injected and injected[0]
        kube.core.delete_namespaced_pod("made-in-the-gap", namespace, grace_period_seconds=0)
        wait_for(lambda: ("DELETED", "made-in-the-gap") in changes, timeout=30, what="the watch's DELETED")
        assert informer.lists == 2  # the rest came by the watch
        assert not informer.error
    finally:
        informer.stop()


@pytest.mark.django_db
def test_the_periodic_relist_runs_beside_the_watch_and_restores_what_the_copy_lost(
    namespace: str, kube: Any, dispatch_on_cluster: str
) -> None:
    """An event the watch missed cannot be had on demand: the copy loses a pod (dropped by hand), and the
    periodic re-list (asked for now) brings it back, while the watch goes on delivering."""
    changes: list[tuple[str, str]] = []
    informer = Informer(
        gateway.PODS,
        namespace,
        on_change=lambda kind, obj, old: changes.append((kind, obj["metadata"]["name"])),
        indexers={"name": lambda o: [o["metadata"]["name"]]},
    ).start()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": [{"name": "c", "image": "localhost/x:v1"}]},
    }
    try:
        kube.core.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "kept"}})
        assert informer.synced.wait(30)
        # Settled (Running, as KWOK leaves it) before it is dropped: a later status update would bring
        # it back through the watch before the re-list (CI saw that once).
        wait_for(
            lambda: [
                p
                for p in informer.by_index("name", "kept")
                if (p.get("status") or {}).get("phase") == "Running"
            ],
            timeout=30,
            what="the pod Running in the copy",
        )
        assert informer.purge(lambda o: o["metadata"]["name"] == "kept") == 1
        informer.relist_now()
        wait_for(
            lambda: informer.lists == 2 and informer.by_index("name", "kept"),
            timeout=30,
            what="the re-list restored it",
        )
        assert not informer.error
        kube.core.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "later"}})
        wait_for(lambda: ("ADDED", "later") in changes, timeout=30, what="the watch goes on")
        assert informer.lists == 2
    finally:
        informer.stop()


def test_an_informer_retries_an_unreachable_api_server_within_seconds() -> None:
    """While the API server cannot be reached (nothing listens: the default unreachable kubeconfig of the
    tests), an informer tries again at most a few seconds apart, so once the server is back the copy is
    current within seconds: evidence of a pod evicted and gone after an outage is otherwise lost (a chaos run
    read such evictions `unknown-failure` when informers waited up to 30 s between tries)."""
    from cluster import informer as informer_module

    waits: list[float] = []
    inf = Informer(gateway.PODS, "nowhere")
    real_wait = inf._stop.wait

    def wait(timeout: float | None = None) -> bool:
        waits.append(float(timeout or 0))
        return real_wait(0.01) if len(waits) < 8 else real_wait(5)

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.start()
    try:
        wait_for(lambda: len(waits) >= 8, timeout=60, what="eight failed tries")
    finally:
        inf.stop()
    assert "unreachable" in (inf.error or ""), inf.error
    assert waits[:3] == [1.0, 2.0, 3.0] and max(waits) == informer_module.UNAVAILABLE_RETRY_MAX_SECONDS <= 3.0
