"""Reading Kueue's objects from outside dispatch, through a plain kubernetes client: a Workload's conditions
and owning TrainJob, and list-then-watch threads that see every event from a point on. Shared by
scripts/bench_kueue.py and the tests' Kueue support (tests/support/kueue.py), which cannot be imported from
scripts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

# A source to watch: (kind, the list call, its positional arguments), e.g.
# ("Workload", custom.list_namespaced_custom_object, ("kueue.x-k8s.io", "v1beta2", namespace, "workloads")).
Source = tuple[str, Callable[..., Any], tuple[Any, ...]]
# Takes one watch event (kind, type, object as the client gave it), keeps what it wants and returns the
# object as a plain dict (its metadata.resourceVersion is where the watch goes on from).
Record = Callable[[str, str, Any], dict[str, Any]]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def is_true(obj: dict[str, Any], type_: str, reason: str | None = None) -> bool:
    """The condition is there with status True (and, when `reason` is given, that reason)."""
    cond = condition(obj, type_)
    return bool(cond and cond.get("status") == "True" and (reason is None or cond.get("reason") == reason))


def workload_owner(workload: dict[str, Any]) -> str | None:
    """The name of the TrainJob that controls the Workload (either spelling of the owner references)."""
    for ref in (
        workload["metadata"].get("ownerReferences") or workload["metadata"].get("owner_references") or []
    ):
        if ref.get("kind") == "TrainJob" and ref.get("controller"):
            return str(ref["name"])
    return None


def _resource_version(listed: Any) -> str:
    meta = listed["metadata"] if isinstance(listed, dict) else listed.metadata
    return str(meta["resourceVersion"] if isinstance(meta, dict) else meta.resource_version)


def list_then_watch(
    source: Source,
    record: Record,
    *,
    stop: threading.Event,
    ready: threading.Barrier,
    errors: list[BaseException],
) -> None:
    """List, meet `ready`, then watch from the list's resourceVersion until `stop` is set (a watch that
    expired, 410, lists again). Every event goes to `record`. A failure lands in `errors` and breaks
    `ready`, so the starter does not wait on it."""
    from kubernetes import client, watch

    kind, lister, args = source
    try:
        rv = _resource_version(lister(*args))
        ready.wait(timeout=30)
        while not stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    lister, *args, resource_version=rv, timeout_seconds=2, _request_timeout=(5, 10)
                ):
                    obj = record(kind, event["type"], event["object"])
                    rv = obj["metadata"]["resourceVersion"]
                    if stop.is_set():
                        stream.stop()
            except client.ApiException as exc:
                if exc.status != 410:
                    raise
                rv = _resource_version(lister(*args))  # the resourceVersion expired: a fresh list
    except BaseException as exc:  # reported by whoever waits on the watches
        errors.append(exc)
        if not ready.broken:
            ready.abort()


def start_watches(
    sources: Sequence[Source], record: Record, *, stop: threading.Event, errors: list[BaseException]
) -> list[threading.Thread]:
    """One list_then_watch thread per source; returns once each has listed (so nothing after is missed)."""
    ready = threading.Barrier(len(sources) + 1)
    threads = []
    for source in sources:
        thread = threading.Thread(
            target=list_then_watch,
            args=(source, record),
            kwargs={"stop": stop, "ready": ready, "errors": errors},
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    ready.wait(timeout=30)
    return threads
