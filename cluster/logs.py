"""Pod logs and Events for one job's objects: what on-call reads instead of kubectl.

Every call passes an explicit timeout and turns API errors into cluster.errors (through the gateway's
call_api / calling). Logs are capped server-side (limitBytes) and again while reading, so a chatty rank
cannot fill the web worker's memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from urllib3.exceptions import HTTPError

from cluster.client import request_timeout
from cluster.gateway import calling, core, counted, raw_list, requests_made, target

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
DEFAULT_LOG_BYTES = 256 * 1024


@dataclass(frozen=True)
class PodInfo:
    """A pod of a job as the log endpoint needs it."""

    name: str
    namespace: str
    rank: int | None
    restart_attempt: int
    replicated_job: str
    phase: str
    created: str
    containers: tuple[str, ...]
    init_containers: tuple[str, ...] = field(default=())
    uid: str = ""
    job_index: int = 0  # the JobSet job index (of its replicated job)


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _pod_info(item: dict[str, Any]) -> PodInfo:
    meta = item.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = item.get("spec") or {}
    rank = _int(labels.get(COMPLETION_INDEX))
    if rank is None:
        rank = _int(annotations.get(COMPLETION_INDEX))
    return PodInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        rank=rank,
        restart_attempt=_int(labels.get(RESTART_ATTEMPT)) or 0,
        replicated_job=str(labels.get(REPLICATED_JOB, "")),
        job_index=_int(labels.get(JOB_INDEX)) or 0,
        phase=str((item.get("status") or {}).get("phase", "")),
        created=str(meta.get("creationTimestamp", "")),
        containers=tuple(str(c.get("name", "")) for c in spec.get("containers") or []),
        init_containers=tuple(str(c.get("name", "")) for c in spec.get("initContainers") or []),
    )


def list_pods(namespace: str, label_selector: str) -> list[PodInfo]:
    """The pods carrying `label_selector` in `namespace` (one list call)."""
    items = raw_list(
        f"Pods in {namespace} ({label_selector})",
        "Pod",
        core().list_namespaced_pod,
        namespace,
        label_selector=label_selector,
    )
    return [_pod_info(item) for item in items]


@dataclass(frozen=True)
class LogText:
    text: str
    truncated: bool  # the log had more than the cap: these are its last bytes up to the cap


def read_log(
    namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int = DEFAULT_LOG_BYTES
) -> LogText:
    """The container's log: its last `tail_lines` lines, at most `limit_bytes` bytes."""
    what = target("Pod", namespace, pod) + f" container {container}"
    requests_made.add()
    with counted("get", "PodLog"), calling(what):
        response: Any = core().read_namespaced_pod_log(
            pod,
            namespace,
            container=container,
            tail_lines=tail_lines,
            limit_bytes=limit_bytes + 1,  # one byte more tells us the cap cut it
            _preload_content=False,
            _request_timeout=request_timeout(),
        )
        try:
            data = response.read(limit_bytes + 1)
        finally:
            response.release_conn()
    truncated = len(data) > limit_bytes
    return LogText(text=data[:limit_bytes].decode("utf-8", errors="replace"), truncated=truncated)


def follow_log(
    namespace: str,
    pod: str,
    container: str,
    *,
    tail_lines: int,
    limit_bytes: int = DEFAULT_LOG_BYTES,
    max_seconds: float = 300.0,
) -> Iterator[bytes]:
    """The container's log as it grows, while the container runs: ends when the container ends, when
    `limit_bytes` were sent, or after `max_seconds` (the read timeout; the caller can follow again).

    The request is made before the first chunk is asked for, so a missing pod or container raises here,
    before a streaming response has sent its headers."""
    what = target("Pod", namespace, pod) + f" container {container}"
    requests_made.add()
    with counted("get", "PodLog"), calling(what):
        response: Any = core().read_namespaced_pod_log(
            pod,
            namespace,
            container=container,
            tail_lines=tail_lines,
            follow=True,
            limit_bytes=limit_bytes,
            _preload_content=False,
            _request_timeout=(request_timeout()[0], max_seconds),
        )

    def chunks() -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in response.stream(4096):
                if not chunk:
                    continue
                chunk = chunk[: max(0, limit_bytes - sent)]
                sent += len(chunk)
                yield chunk
                if sent >= limit_bytes:
                    return
        except (OSError, HTTPError):  # the read timed out or the connection dropped: the stream ends
            return
        finally:
            response.release_conn()

    return chunks()


@dataclass(frozen=True)
class EventRow:
    at: str
    type: str
    reason: str
    object: str  # "Kind name"
    message: str
    count: int
    reporter: str = ""  # event_reporter


def event_reporter(event: dict[str, Any] | Any) -> str:
    """Who reported an Event, as Kubernetes names it: `reportingController` (events.k8s.io), its core/v1
    view `reportingComponent`, else the legacy recorder's `source.component` (events.k8s.io:
    `deprecatedSource`)."""
    for key in ("reportingController", "reportingComponent"):
        if event.get(key):
            return str(event[key])
    for key in ("source", "deprecatedSource"):
        source = event.get(key) or {}
        if source.get("component"):
            return str(source["component"])
    return ""


def events_for(namespace: str, name_prefix: str, *, limit: int = 200) -> list[EventRow]:
    """The namespace's Events about objects whose name starts with `name_prefix` (a job's TrainJobs,
    JobSets, Jobs and Pods are all named after the job), newest first, at most `limit`."""
    items = raw_list(f"Events in {namespace}", "Event", core().list_namespaced_event, namespace)
    rows = []
    for item in items:
        involved = item.get("involvedObject") or item.get("regarding") or {}
        name = str(involved.get("name", ""))
        if not name.startswith(name_prefix):
            continue
        series = item.get("series") or {}
        at = (
            item.get("lastTimestamp")
            or series.get("lastObservedTime")
            or item.get("eventTime")
            or item.get("firstTimestamp")
            or (item.get("metadata") or {}).get("creationTimestamp")
            or ""
        )
        rows.append(
            EventRow(
                at=str(at),
                type=str(item.get("type", "")),
                reason=str(item.get("reason", "")),
                object=f"{involved.get('kind', '')} {name}".strip(),
                message=str(item.get("message") or item.get("note") or ""),
                count=_int(item.get("count")) or _int(series.get("count")) or 1,
                reporter=event_reporter(item),
            )
        )
    rows.sort(key=lambda r: r.at, reverse=True)
    return rows[:limit]
