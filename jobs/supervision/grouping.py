"""Which observed objects are an execution's: its TrainJob's owner chain, never a label alone. Pure.

An object is an execution's only when it is in the job's namespace and belongs to its TrainJob through the
owner chain TrainJob -> JobSet -> Job -> Pod, each link an ownerReference matched by name and UID. The
TrainJob itself is the one named for (job, attempt) in the job's namespace that carries the job's label (in
the label domain stored with the job) and has the UID the start recorded: a TrainJob deleted outside dispatch
and made again under the same name and labels is somebody else's, and the job's own is gone (executions
started before the UID was recorded go by name and label alone). Events count when they are about an object
of the chain (by UID), or about a pod the execution's memory holds. Anything else carrying the job's labels
is a stranger's: ignored, and named in the status's warnings so the page can say so.

The objects come from an ObjectSource: the beat's cycle builds a StaticIndex from its list calls; the
supervisor's informer cache (jobs.supervision.cache) answers the same questions from its indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jobs.naming import trainjob_name_prefix
from jobs.objects import is_worker_copy
from jobs.supervision.status import disrupted_pods_named

Obj = Mapping[str, Any]
TRAINJOB, JOBSET, JOB, POD, EVENT = "TrainJob", "JobSet", "Job", "Pod", "Event"
WORKLOAD = "Workload"  # Kueue's, owned by the TrainJob (a controller ownerReference), once Kueue is read
LABELLED_KINDS = (TRAINJOB, JOBSET, JOB, POD)


@dataclass(frozen=True)
class Watched:
    """What a cycle knows of one execution before it reads the cluster."""

    key: tuple[str, int]  # (job id, attempt)
    namespace: str
    trainjob_name: str
    memory: dict[str, Any]  # pods seen by earlier cycles (Execution.pods_seen)
    identity_warned: bool
    domain: str = "dispatch.dev"  # the label domain stored with the job
    ran: bool = False  # seen running before (Execution.started_at)
    trainjob_uid: str = ""  # the TrainJob's UID the start recorded ("" on rows from before: name and label)
    cluster: str = ""  # the MultiKueue worker its Workload was admitted to (Execution.cluster); "" here


class ObjectSource(Protocol):
    def named(self, kind: str, namespace: str, name: str) -> list[Obj]: ...

    def owned_by(self, kind: str, namespace: str, owner_uid: str) -> list[Obj]: ...

    def events_about(self, namespace: str, uid: str) -> list[Obj]: ...

    def events_named(self, namespace: str, name_prefix: str) -> list[Obj]:
        """Events without the UID of the object they are about, whose object name starts with name_prefix."""
        ...

    def events_of_pod(self, namespace: str, name: str) -> list[Obj]:
        """Events about the pod of this name (any UID): a pod gone before it was read has only its name."""
        ...

    def labelled(self, kind: str, domain: str, job_id: str, attempt: int) -> list[Obj]: ...


def meta(obj: Obj) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def labels(obj: Obj) -> Mapping[str, Any]:
    value = meta(obj).get("labels")
    return value if isinstance(value, Mapping) else {}


def uid(obj: Obj) -> str:
    return str(meta(obj).get("uid") or "")


def owner_uids(obj: Obj) -> list[str]:
    refs = meta(obj).get("ownerReferences")
    return [str(r.get("uid")) for r in refs or () if isinstance(r, Mapping) and r.get("uid")]


def _owned(child: Obj, owner: Obj, kind: str) -> bool:
    """child names owner (kind, name and UID) among its ownerReferences."""
    name, owner_uid = meta(owner).get("name"), uid(owner)
    for ref in meta(child).get("ownerReferences") or ():
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == kind
            and ref.get("name") == name
            and ref.get("uid") == owner_uid
        ):
            return True
    return False


def label_key(obj: Obj, domain: str) -> tuple[str, int] | None:
    """(job id, attempt) from the object's labels in `domain`, or None."""
    found = labels(obj)
    job_id = found.get(f"{domain}/job")
    attempt = str(found.get(f"{domain}/attempt") or "")
    if not job_id or not attempt.isdigit():
        return None
    return str(job_id), int(attempt)


def involved(event: Obj) -> Mapping[str, Any]:
    value = event.get("involvedObject") or event.get("regarding")
    return value if isinstance(value, Mapping) else {}


@dataclass
class Grouped:
    objects: list[Obj] = field(default_factory=list)  # the chain, then the events about it
    strangers: list[dict[str, Any]] = field(default_factory=list)  # warnings {kind, message, object}
    job_uids: set[str] = field(default_factory=set)  # the chain's Jobs (a tombstone must name one)

    def warning_list(self) -> list[dict[str, Any]]:
        return list(self.strangers)


def worker_copy(worker: ObjectSource, item: Watched, workloads: Iterable[Obj]) -> Obj | None:
    """The worker's copy of the execution's TrainJob: same namespace and name, the job's label, and
    MultiKueue's prebuilt-workload annotation naming the manager's Workload that the execution's TrainJob
    owns (a stranger can copy the labels, but not make the manager's Workload its own)."""
    names = [str(meta(w).get("name") or "") for w in workloads]
    for copy in worker.named(TRAINJOB, item.namespace, item.trainjob_name):
        if is_worker_copy(copy, item.domain, item.key[0], names):
            return copy
    return None


def owned_objects(
    source: ObjectSource, item: Watched, also_about: Iterable[str] = (), worker: ObjectSource | None = None
) -> Grouped:
    """The execution's objects through its owner chain, the events about them (and about the pods in
    `also_about`: tombstones), and the strangers. Under MultiKueue (`worker`: what was read on the worker its
    Workload names) the TrainJob and its Workload are the manager's, and the JobSet, Jobs, pods and their
    Events the worker's, owned by the worker's copy of the TrainJob (worker_copy)."""
    job_id, attempt = item.key
    ns = item.namespace
    grouped = Grouped()
    chain: list[Obj] = []
    trainjobs = [
        t
        for t in source.named(TRAINJOB, ns, item.trainjob_name)
        if labels(t).get(f"{item.domain}/job") == job_id
        and (not item.trainjob_uid or uid(t) == item.trainjob_uid)
    ]
    trainjob = trainjobs[0] if trainjobs else None
    runs = source  # where the TrainJob's JobSet, Jobs and pods are
    root = trainjob
    copy_uid = ""
    if trainjob is not None:
        chain.append(trainjob)
        chain.extend(w for w in source.owned_by(WORKLOAD, ns, uid(trainjob)) if _owned(w, trainjob, TRAINJOB))
        if worker is not None:
            runs = worker
            root = worker_copy(worker, item, [o for o in chain if o.get("kind") == WORKLOAD])
            copy_uid = uid(root) if root is not None else ""
    if root is not None:
        jobsets = [j for j in runs.owned_by(JOBSET, ns, uid(root)) if _owned(j, root, TRAINJOB)]
        for jobset in jobsets:
            chain.append(jobset)
            for job in runs.owned_by(JOB, ns, uid(jobset)):
                if not _owned(job, jobset, JOBSET):
                    continue
                chain.append(job)
                grouped.job_uids.add(uid(job))
                chain.extend(p for p in runs.owned_by(POD, ns, uid(job)) if _owned(p, job, JOB))
    members = {uid(o) for o in chain}
    objects = grouped.objects = list(chain)
    # Events: about an object of the chain, or a pod the memory holds (gone now, its events stay an hour).
    # An Event is about one object, so no Event comes twice (the manager's and a worker's are different
    # objects).
    readers = [source] if runs is source else [source, runs]
    for reader in readers:
        for object_uid in members.union(item.memory, also_about):
            if object_uid:
                objects.extend(reader.events_about(ns, object_uid))
        # An event without the object's UID (rare: some recorders leave it out), by the TrainJob-name prefix.
        objects.extend(reader.events_named(ns, item.trainjob_name))
    members.add(copy_uid)
    # A disrupted pod gone before any cycle read it: its Job's failure names it (a FailJob rule on
    # DisruptionTarget), and its events (who took it, which node it ran on) are found by that name.
    remembered = {str(p.get("name") or "") for p in item.memory.values()}
    jobs = [o for o in chain if o.get("kind") == JOB]
    have: set[str] | None = None  # the events already in the group, gathered once, on the first such pod
    for _, _, pod_name in disrupted_pods_named(jobs):
        if pod_name in remembered or any(
            meta(p).get("name") == pod_name for p in chain if p.get("kind") == POD
        ):
            continue
        if have is None:
            have = {uid(o) for o in objects if o.get("kind") == EVENT}
        for event in runs.events_of_pod(ns, pod_name):
            if uid(event) not in have:
                have.add(uid(event))
                objects.append(event)
    # Strangers: the job's labels on an object outside the chain (any namespace the cycle read).
    for kind, reader in ((k, r) for r in readers for k in LABELLED_KINDS):
        for obj in reader.labelled(kind, item.domain, job_id, attempt):
            if uid(obj) in members:
                continue
            where = f"{kind} {meta(obj).get('namespace', '')}/{meta(obj).get('name', '')}"
            if meta(obj).get("namespace") != ns:
                reason = "in another namespace"
            elif kind == TRAINJOB and meta(obj).get("name") == item.trainjob_name:
                reason = f"not the TrainJob dispatch created (UID {uid(obj)}, not {item.trainjob_uid})"
            else:
                reason = "not in the owner chain of the job's TrainJob"
            grouped.strangers.append(
                {
                    "kind": "stranger",
                    "object": where,
                    "message": f"{where} carries this job's labels but is {reason}: ignored",
                }
            )
    return grouped


class StaticIndex:
    """An ObjectSource over objects listed once (the beat's cycle, tests, the bench)."""

    def __init__(self, objects: Iterable[Obj], domains: Iterable[str]) -> None:
        self._named: dict[tuple[str, str, str], list[Obj]] = {}
        self._owned: dict[tuple[str, str, str], list[Obj]] = {}
        self._events: dict[tuple[str, str], list[Obj]] = {}
        self._events_named: dict[tuple[str, str], list[Obj]] = {}
        self._events_of_pod: dict[tuple[str, str], list[Obj]] = {}
        self._labelled: dict[tuple[str, str, str, int], list[Obj]] = {}
        domains = sorted(set(domains))
        for obj in objects:
            kind = str(obj.get("kind", ""))
            ns = str(meta(obj).get("namespace") or "")
            if kind == EVENT:
                ref = involved(obj)
                about = str(ref.get("uid") or "")
                if ref.get("kind") == POD:
                    self._events_of_pod.setdefault((ns, str(ref.get("name", ""))), []).append(obj)
                if about:
                    self._events.setdefault((ns, about), []).append(obj)
                    continue
                prefix = trainjob_name_prefix(str(ref.get("name", "")))
                if prefix:
                    self._events_named.setdefault((ns, prefix), []).append(obj)
                continue
            self._named.setdefault((kind, ns, str(meta(obj).get("name", ""))), []).append(obj)
            for owner in owner_uids(obj):
                self._owned.setdefault((kind, ns, owner), []).append(obj)
            for domain in domains:
                found = label_key(obj, domain)
                if found is not None:
                    self._labelled.setdefault((kind, domain, *found), []).append(obj)

    def named(self, kind: str, namespace: str, name: str) -> list[Obj]:
        return self._named.get((kind, namespace, name), [])

    def owned_by(self, kind: str, namespace: str, owner_uid: str) -> list[Obj]:
        return self._owned.get((kind, namespace, owner_uid), [])

    def events_about(self, namespace: str, uid: str) -> list[Obj]:
        return self._events.get((namespace, uid), [])

    def events_named(self, namespace: str, name_prefix: str) -> list[Obj]:
        return self._events_named.get((namespace, name_prefix), [])

    def events_of_pod(self, namespace: str, name: str) -> list[Obj]:
        return self._events_of_pod.get((namespace, name), [])

    def labelled(self, kind: str, domain: str, job_id: str, attempt: int) -> list[Obj]:
        return self._labelled.get((kind, domain, job_id, attempt), [])
