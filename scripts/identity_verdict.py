"""The identity observer's pure part: pod observations in, records out; records in, verdict out. No client, no
cluster, nothing of dispatch. What an identity is, when a pod ran and what the verdict means:
scripts/identity_observer.py's docstring (the watcher and the CLI are there)."""

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


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _m(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


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
    record: Mapping[str, Any] | None, pod: Mapping[str, Any], *, event: str, at: str
) -> dict[str, Any]:
    """The record of a pod after one more observation of it (an API object from a list or a watch event).
    Pure: returns a new dict. The identity is fixed at first sight (env is immutable; labels as created)."""
    meta, spec, status = _m(pod.get("metadata")), _m(pod.get("spec")), _m(pod.get("status"))
    phase = status.get("phase")
    if record is None:
        labels = {str(k): str(v) for k, v in _m(meta.get("labels")).items()}
        annotations = _m(meta.get("annotations"))
        env = _identity_env(spec)
        picked = _pick_identity(env)
        record = {
            "uid": meta.get("uid"),
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
    return record


def mark_vanished(record: Mapping[str, Any], *, at: str) -> dict[str, Any]:
    """A pod a re-list no longer holds: it was deleted while nobody watched. Its last state stays."""
    if record["deleted_at"] or record["vanished_at"]:
        return dict(record)
    return {**record, "vanished_at": at}


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


def verdict(
    records: Iterable[Mapping[str, Any]],
    *,
    allowed_jobs: Collection[str] = (),
    namespaces: Collection[str] | None = None,
) -> dict[str, Any]:
    """Judge recorded pods. Pure."""
    allowed = set(allowed_jobs)
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
    violations = [f for f in findings if f["job"] not in allowed]
    waived = [f for f in findings if f["job"] in allowed]
    counts |= {"violations": len(violations), "allowed": len(waived), "anomalies": len(anomalies)}
    return {
        "ok": not violations and not anomalies,
        "violations": violations,
        "allowed": waived,
        "anomalies": anomalies,
        "counts": counts,
        "allowed_jobs": sorted(allowed),
        "namespaces": sorted(namespaces) if namespaces is not None else None,
    }
