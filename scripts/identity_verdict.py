"""The identity observer's pure part: pod and TrainJob observations in, records out; records in, verdict out.
No client, no cluster, nothing of dispatch. What an identity is, when a pod ran and what the verdict means:
scripts/identity_observer.py's docstring (the watcher and the CLI are there).

Besides the verdict (ran twice, restarted in place, anomalies), three readings a harness takes from the same
records: `attempt_overlaps` (a pod of attempt A+1 ran before a pod of attempt A had ended), `ranks_seen`
(which of the wanted (job, attempt)s the observer saw every rank of run: its coverage) and
`trainjob_duplicates` (more than one TrainJob UID for one (job, attempt))."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

ENV_JOB: Final = "DISPATCH_JOB"
ENV_ATTEMPT: Final = "DISPATCH_ATTEMPT"
TRAINER_CONTAINER: Final = "node"
RESTART_ATTEMPT: Final = "jobset.sigs.k8s.io/restart-attempt"
REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"

# A session's id (jobs/models.py _new_session_id; tests/scripts/test_identity_observer.py keeps the two
# in step).
SESSION_ID: Final = re.compile(r"s[a-z2-7]{10}")

RAN_TWICE: Final = "ran-twice"
RESTARTED_IN_PLACE: Final = "restarted-in-place"
NO_COMPLETION_INDEX: Final = "no-completion-index"
NO_ATTEMPT: Final = "no-attempt"
IDENTITY_CONFLICT: Final = "identity-conflict"
ATTEMPT_OVERLAP: Final = "attempt-overlap"
TRAINJOB_DUPLICATE: Final = "trainjob-duplicate"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _m(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def resource_version(value: Any) -> int | None:
    """A resourceVersion as a number. Kubernetes calls it opaque; on one API server backed by etcd it is the
    etcd revision of the write, so two of them order the writes they name (the observer compares them only
    within one cluster, and falls back to its own clock where they are not numbers)."""
    text = str(value or "")
    return int(text) if text.isdigit() else None


# ---------------------------------------------------------------- records (pure)


def _identity_env(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every container (init first, as they run) that states DISPATCH_JOB or DISPATCH_ATTEMPT as a value."""
    found = []
    for key in ("initContainers", "containers"):
        for container in _l(spec.get(key)):
            values = {
                e.get("name"): e.get("value")
                for e in _l(_m(container).get("env"))
                if isinstance(e, Mapping) and e.get("name") in (ENV_JOB, ENV_ATTEMPT)
            }
            if values:
                found.append(
                    {
                        "container": _m(container).get("name"),
                        "init": key == "initContainers",
                        "job": values.get(ENV_JOB),
                        "attempt": values.get(ENV_ATTEMPT),
                    }
                )
    return found


def _pick_identity(env: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The trainer container `node` first, then init containers (publish.via initContainer), then the rest."""
    with_job = [e for e in env if e["job"]]
    for want in (
        lambda e: not e["init"] and e["container"] == TRAINER_CONTAINER,
        lambda e: e["init"],
        lambda e: True,
    ):
        for entry in with_job:
            if want(entry):
                return entry
    return None


def _started(state: Mapping[str, Any]) -> str | None:
    for key in ("running", "terminated"):
        started = _m(state.get(key)).get("startedAt")
        if started:
            return str(started)
    return None


def _container_observations(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec, status = _m(pod.get("spec")), _m(pod.get("status"))
    sidecars = {
        _m(c).get("name") for c in _l(spec.get("initContainers")) if _m(c).get("restartPolicy") == "Always"
    }
    observed = []
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for cs in _l(status.get(key)):
            cs = _m(cs)
            name = cs.get("name")
            last = _m(cs.get("lastState")).get("terminated")
            starts = [s for s in (_started(_m(cs.get("state"))), _started(_m(cs.get("lastState")))) if s]
            observed.append(
                {
                    "name": name,
                    "kind": ("sidecar" if name in sidecars else "init") if init else "container",
                    "restart_count": int(cs.get("restartCount") or 0),
                    "last_terminated": dict(last) if isinstance(last, Mapping) else None,
                    "started_at": min(starts) if starts else None,
                    "state": dict(_m(cs.get("state"))),
                }
            )
    return observed


def observe(
    record: Mapping[str, Any] | None, pod: Mapping[str, Any], *, event: str, at: str, cluster: str = ""
) -> dict[str, Any]:
    """The record of a pod after one more observation of it (an API object from a list or a watch event).
    Pure: returns a new dict. The identity is fixed at first sight (env is immutable; labels as created).

    `ran_rv` / `ended_rv`: the resourceVersion of the first observation in which the pod had run (phase
    Running or a container started) / had ended (phase Succeeded or Failed, or deleted); with `ran_seen_at` /
    `ended_seen_at`, when the observer saw it. The object's own resourceVersion is that of the write that
    made the state seen, so these order one pod's start against another's end exactly."""
    meta, spec, status = _m(pod.get("metadata")), _m(pod.get("spec")), _m(pod.get("status"))
    phase = status.get("phase")
    rv = resource_version(meta.get("resourceVersion"))
    if record is None:
        labels = {str(k): str(v) for k, v in _m(meta.get("labels")).items()}
        annotations = _m(meta.get("annotations"))
        env = _identity_env(spec)
        picked = _pick_identity(env)
        record = {
            "uid": meta.get("uid"),
            "cluster": cluster,
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "labels": labels,
            "owner_references": [],
            "identity_env": env,
            "job": picked["job"] if picked else None,
            "attempt": picked["attempt"] if picked else None,
            "identity_source": (
                f"{'initContainer' if picked['init'] else 'container'} {picked['container']}"
                if picked
                else None
            ),
            "restart_attempt": labels.get(RESTART_ATTEMPT),
            "replicated_job": labels.get(REPLICATED_JOB),
            "job_index": labels.get(JOB_INDEX),
            "rank": labels.get(COMPLETION_INDEX, annotations.get(COMPLETION_INDEX)),
            "phases": [],
            "containers": {},
            "events": 0,
            "first_seen": at,
            "last_seen": at,
            "running_seen_at": None,
            "started_at": None,
            "terminated_at": None,
            "deletion_timestamp": None,
            "deleted_at": None,
            "vanished_at": None,
            "ran": False,
            "ran_rv": None,
            "ran_seen_at": None,
            "ended_rv": None,
            "ended_seen_at": None,
        }
    else:
        record = {
            **record,
            "phases": list(record["phases"]),
            "containers": {k: dict(v) for k, v in record["containers"].items()},
        }
    record["events"] += 1
    record["last_seen"] = at
    owners = [
        {k: o.get(k) for k in ("kind", "name", "uid", "controller")}
        for o in _l(meta.get("ownerReferences"))
        if isinstance(o, Mapping)
    ]
    if owners:  # orphaning removes them; keep what the pod was created under
        record["owner_references"] = owners
    if phase and (not record["phases"] or record["phases"][-1]["phase"] != phase):
        record["phases"].append({"phase": phase, "at": at, "event": event})
    if phase == "Running" and record["running_seen_at"] is None:
        record["running_seen_at"] = at
    if phase in ("Succeeded", "Failed") and record["terminated_at"] is None:
        record["terminated_at"] = at
    if meta.get("deletionTimestamp"):
        record["deletion_timestamp"] = meta["deletionTimestamp"]
    if event == "DELETED" and record["deleted_at"] is None:
        record["deleted_at"] = at
    for seen in _container_observations(pod):
        kept = record["containers"].get(seen["name"]) or {
            "kind": seen["kind"],
            "restart_count": 0,
            "last_terminated": None,
            "started_at": None,
        }
        kept["kind"] = seen["kind"]
        kept["restart_count"] = max(kept["restart_count"], seen["restart_count"])
        kept["last_terminated"] = seen["last_terminated"] or kept["last_terminated"]
        if seen["started_at"] and (kept["started_at"] is None or seen["started_at"] < kept["started_at"]):
            kept["started_at"] = seen["started_at"]
        kept["state"] = seen["state"]
        record["containers"][seen["name"]] = kept
    starts = [c["started_at"] for c in record["containers"].values() if c["started_at"]]
    record["started_at"] = min(starts) if starts else None
    record["ran"] = bool(record["ran"] or phase == "Running" or starts)
    if record["ran"] and record.get("ran_seen_at") is None:
        record["ran_rv"], record["ran_seen_at"] = rv, at
    if (phase in ("Succeeded", "Failed") or event == "DELETED") and record.get("ended_seen_at") is None:
        record["ended_rv"], record["ended_seen_at"] = rv, at
    return record


def mark_vanished(record: Mapping[str, Any], *, at: str, rv: int | None = None) -> dict[str, Any]:
    """An object a re-list no longer holds: it was deleted while nobody watched. Its last state stays; it
    ended at the latest at the re-list (`rv`, the list's resourceVersion)."""
    if record.get("deleted_at") or record.get("vanished_at"):
        return dict(record)
    ended = {"ended_rv": rv, "ended_seen_at": at} if record.get("ended_seen_at", "") is None else {}
    return {**record, "vanished_at": at, **ended}


def observe_trainjob(
    record: Mapping[str, Any] | None, obj: Mapping[str, Any], *, event: str, at: str, cluster: str = ""
) -> dict[str, Any]:
    """The record of a TrainJob after one more observation of it (by UID): its name, labels as created and
    when it was first seen and deleted. Pure."""
    meta = _m(obj.get("metadata"))
    if record is None:
        record = {
            "uid": meta.get("uid"),
            "cluster": cluster,
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "labels": {str(k): str(v) for k, v in _m(meta.get("labels")).items()},
            "created": meta.get("creationTimestamp"),
            "first_seen": at,
            "first_rv": resource_version(meta.get("resourceVersion")),
            "last_seen": at,
            "events": 0,
            "deletion_timestamp": None,
            "deleted_at": None,
            "vanished_at": None,
        }
    else:
        record = dict(record)
    record["events"] += 1
    record["last_seen"] = at
    if meta.get("deletionTimestamp"):
        record["deletion_timestamp"] = meta["deletionTimestamp"]
    if event == "DELETED" and record["deleted_at"] is None:
        record["deleted_at"] = at
    return record


# ---------------------------------------------------------------- verdict (pure)


def _is_session(record: Mapping[str, Any]) -> bool:
    if SESSION_ID.fullmatch(str(record["job"])):
        return True
    return any(k.rsplit("/", 1)[-1] == "session" and v == record["job"] for k, v in record["labels"].items())


def _job_controlled(record: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "Job" and o.get("controller") for o in record["owner_references"])


def _pod_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    keys = (
        "uid",
        "namespace",
        "name",
        "first_seen",
        "running_seen_at",
        "started_at",
        "terminated_at",
        "deleted_at",
        "vanished_at",
    )
    summary = {k: record.get(k) for k in keys}
    summary["phases"] = [p["phase"] for p in record["phases"]]
    return summary


def _identity(record: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("namespace", "job", "attempt", "restart_attempt", "replicated_job", "job_index", "rank")
    return {k: record.get(k) for k in keys}


def _rank_pod(record: Mapping[str, Any], namespaces: Collection[str] | None) -> bool:
    """A pod of a dispatch job's rank: in the namespaces judged, carrying DISPATCH_JOB, not a session's, made
    by a Job."""
    if namespaces is not None and record["namespace"] not in namespaces:
        return False
    return bool(record["job"]) and not _is_session(record) and _job_controlled(record)


def verdict(
    records: Iterable[Mapping[str, Any]], *, namespaces: Collection[str] | None = None
) -> dict[str, Any]:
    """Judge recorded pods. Pure. Every finding counts: nothing is waived."""
    counts = dict.fromkeys(
        (
            "pods_seen",
            "pods_outside_namespaces",
            "not_dispatch_pods",
            "session_pods",
            "dispatch_env_not_job_controlled",
            "rank_pods",
            "rank_pods_ran",
            "identities",
        ),
        0,
    )
    by_identity: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    findings: list[dict[str, Any]] = []
    anomalies: list[dict[str, Any]] = []
    for record in sorted(records, key=lambda r: (r["first_seen"], str(r["uid"]))):
        counts["pods_seen"] += 1
        if namespaces is not None and record["namespace"] not in namespaces:
            counts["pods_outside_namespaces"] += 1
            continue
        if not record["job"]:
            counts["not_dispatch_pods"] += 1
            continue
        if _is_session(record):
            counts["session_pods"] += 1
            continue
        if not _job_controlled(record):
            counts["dispatch_env_not_job_controlled"] += 1
            continue
        counts["rank_pods"] += 1
        counts["rank_pods_ran"] += record["ran"]
        distinct = {(e["job"], e["attempt"]) for e in record["identity_env"]}
        problems = [
            (IDENTITY_CONFLICT, len(distinct) > 1),
            (NO_ATTEMPT, not record["attempt"]),
            (NO_COMPLETION_INDEX, record["rank"] is None),
        ]
        for kind, found in problems:
            if found:
                anomaly = {"kind": kind, **_identity(record), "pods": [_pod_summary(record)]}
                if kind == IDENTITY_CONFLICT:
                    anomaly["identity_env"] = record["identity_env"]
                anomalies.append(anomaly)
        if record["rank"] is not None:
            by_identity.setdefault(tuple(_identity(record).values()), []).append(record)
        restarted = [
            {"container": name, "restart_count": c["restart_count"], "last_terminated": c["last_terminated"]}
            for name, c in sorted(record["containers"].items())
            if c["kind"] != "sidecar" and (c["restart_count"] > 0 or c["last_terminated"])
        ]
        if restarted:
            findings.append(
                {
                    "kind": RESTARTED_IN_PLACE,
                    **_identity(record),
                    "pods": [_pod_summary(record)],
                    "containers": restarted,
                }
            )
    counts["identities"] = len(by_identity)
    for pods in by_identity.values():
        ran = [p for p in pods if p["ran"]]
        if len(ran) > 1:
            findings.append({"kind": RAN_TWICE, **_identity(ran[0]), "pods": [_pod_summary(p) for p in ran]})
    counts |= {"violations": len(findings), "anomalies": len(anomalies)}
    return {
        "ok": not findings and not anomalies,
        "violations": findings,
        "anomalies": anomalies,
        "counts": counts,
        "namespaces": sorted(namespaces) if namespaces is not None else None,
    }


# ---------------------------------------------------------------- what else the records show (pure)

_INFINITY: Final = float("inf")


def _order(records: Collection[Mapping[str, Any]]) -> str:
    """How moments of these records compare: by resourceVersion when they all come from one cluster and every
    moment has one (the etcd revision: exact), else by the observer's clock ("seen")."""
    clusters = {r.get("cluster", "") for r in records}
    moments = [r.get(k) for r in records for k in ("ran_rv", "ended_rv") if r.get(k.replace("rv", "seen_at"))]
    return "rv" if len(clusters) <= 1 and all(isinstance(m, int) for m in moments) else "seen"


def _moment(record: Mapping[str, Any], which: str, order: str) -> Any:
    """When the pod started (`ran`) or ended (`ended`) in the chosen order; an end not seen is infinitely
    late (the pod may still run)."""
    seen = record.get(f"{which}_seen_at")
    if seen is None:
        return _INFINITY
    return float(record[f"{which}_rv"]) if order == "rv" else datetime.fromisoformat(seen).timestamp()


def attempt_overlaps(
    records: Iterable[Mapping[str, Any]], *, namespaces: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """Each (job, later attempt) whose first pod ran before a pod of an earlier attempt of the same job had
    ended (DESIGN.md: A+1 starts only when none of A's pods still runs). Only pods that ran count; a pod never
    seen ending is still running. Pure."""
    by_job: dict[tuple[str, str], dict[int, list[Mapping[str, Any]]]] = {}
    ran = [r for r in records if r["ran"] and _rank_pod(r, namespaces) and str(r["attempt"] or "").isdigit()]
    order = _order(ran)
    for record in ran:
        attempts = by_job.setdefault((record["namespace"], record["job"]), {})
        attempts.setdefault(int(record["attempt"]), []).append(record)
    found = []
    for (namespace, job), attempts in sorted(by_job.items()):
        numbers = sorted(attempts)
        for later in numbers[1:]:
            first = min(attempts[later], key=lambda r: (_moment(r, "ran", order), str(r["uid"])))
            started = _moment(first, "ran", order)
            for earlier in (n for n in numbers if n < later):
                last = max(attempts[earlier], key=lambda r: (_moment(r, "ended", order), str(r["uid"])))
                ended = _moment(last, "ended", order)
                if started < ended:
                    found.append(
                        {
                            "kind": ATTEMPT_OVERLAP,
                            "namespace": namespace,
                            "job": job,
                            "earlier_attempt": earlier,
                            "later_attempt": later,
                            "compared_by": "resourceVersion" if order == "rv" else "the observer's clock",
                            "later_pod_ran": {**_pod_summary(first), "ran_rv": first.get("ran_rv")},
                            "earlier_pod_ended": {
                                **_pod_summary(last),
                                "ended_rv": last.get("ended_rv"),
                                "ended_seen_at": last.get("ended_seen_at"),
                            },
                        }
                    )
    return found


def ranks_seen(
    records: Iterable[Mapping[str, Any]], wanted: Mapping[tuple[str, str, str], int]
) -> dict[tuple[str, str, str], int]:
    """For each wanted (namespace, job, attempt) -> number of ranks, how many distinct ranks (replicated job,
    job index, completion index) the observer saw run under it, from pods made by a Job. Pure."""
    seen: dict[tuple[str, str, str], set[tuple[Any, ...]]] = {key: set() for key in wanted}
    for record in records:
        key = (str(record["namespace"]), str(record["job"]), str(record["attempt"]))
        if key in seen and record["ran"] and _job_controlled(record) and record["rank"] is not None:
            seen[key].add((record["replicated_job"], record["job_index"], record["rank"]))
    return {key: len(ranks) for key, ranks in seen.items()}


def trainjob_key(record: Mapping[str, Any]) -> tuple[str, str] | None:
    """(job, attempt) a TrainJob says it runs: labels `<domain>/job` and `<domain>/attempt` of one domain."""
    labels = record.get("labels") or {}
    for key, value in sorted(labels.items()):
        domain, _, name = key.rpartition("/")
        if name == "job" and domain and f"{domain}/attempt" in labels:
            return str(value), str(labels[f"{domain}/attempt"])
    return None


def trainjob_duplicates(
    records: Iterable[Mapping[str, Any]], *, namespaces: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """More than one TrainJob UID for one (job, attempt) in one namespace of one cluster, by its labels, or
    for one name (a TrainJob deleted and made again under its name). Pure."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for record in records:
        if namespaces is not None and record["namespace"] not in namespaces:
            continue
        where = (str(record.get("cluster", "")), str(record["namespace"]))
        groups.setdefault((*where, "name", str(record["name"])), []).append(record)
        labelled = trainjob_key(record)
        if labelled is not None:
            groups.setdefault((*where, "labels", *labelled), []).append(record)
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, group in sorted(groups.items()):
        uids = sorted({str(r["uid"]) for r in group})
        if len(uids) < 2 or (key[0], key[1], *uids) in found:
            continue
        found[(key[0], key[1], *uids)] = {
            "kind": TRAINJOB_DUPLICATE,
            "cluster": key[0],
            "namespace": key[1],
            "by": key[2],
            "key": "/".join(key[3:]),
            "trainjobs": [
                {k: r.get(k) for k in ("uid", "name", "first_seen", "deleted_at", "vanished_at")}
                for r in sorted(group, key=lambda r: (r["first_seen"], str(r["uid"])))
            ],
        }
    return list(found.values())
