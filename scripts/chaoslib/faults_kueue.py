"""The Kueue preemption wave (--kueue): low-priority jobs on a ClusterQueue with room for one, then a
high-priority one; a low Workload must be preempted. Also the run's own queues and priority classes."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict
from typing import Any, Final

from scripts.chaoslib.context import Context
from scripts.chaoslib.jobs import submit
from scripts.chaoslib.kube import Kube, pod_identity
from scripts.chaoslib.outcomes import START_RECOVERY_SECONDS, Hit
from scripts.chaoslib.plan import KUEUE_HIGH, KUEUE_LOW, FaultPlan, JobPlan

# How long the wave waits for one of its low-priority jobs to run: a start's recovery after a worker kill,
# and a little for the plane.
LOW_RUN_WITHIN: Final = START_RECOVERY_SECONDS + 30.0


def fault_kueue_wave(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    args, run, kube, client, plan = ctx.args, ctx.run, ctx.kube, ctx.client, ctx.plan
    namespace, kueue_names = ctx.namespace, ctx.kueue_names
    platform_token, run_deadline = ctx.platform_token, ctx.run_deadline
    base = 10_000

    def priority(wpc: str) -> dict[str, Any]:
        if args.kueue_priority_field == "labels":  # the raw Kueue label, where the API allows it
            return {"labels": {"kueue.x-k8s.io/priority-class": wpc}}
        return {args.kueue_priority_field: wpc}

    extra = lambda wpc: {  # noqa: E731
        "queue_name": kueue_names["lq"],
        **priority(wpc),
        "resources_per_node": {
            "requests": {"nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"},
        },
    }
    allowed = None
    if args.kueue_priority_field != "labels":  # the platform allows the run's classes in its namespace
        answer = client.call(
            "PATCH",
            "/api/v1/settings",
            platform_token,
            run_deadline,
            json={"kueue_priority_classes": {namespace: [kueue_names["low"], kueue_names["high"]]}},
        )
        allowed = answer.status_code if answer is not None else None
        if allowed == 200:
            # Each web process reads the site settings through a cache at most PLAN_RUNTIME_MAX_AGE old (the
            # PATCH cleared only its own process's): a submission within that window may be judged on the
            # settings before it (seen in a CI run: priority-class-not-allowed right after the PATCH's 200).
            from jobs.submission.planning import PLAN_RUNTIME_MAX_AGE

            time.sleep(PLAN_RUNTIME_MAX_AGE + 0.5)
    lows = [
        JobPlan(index=base + i, kind=KUEUE_LOW, at=at, policy="retry", duration=plan.kueue_low_duration)
        for i in range(2)
    ]
    entries = [submit(ctx, item, extra(kueue_names["low"])) for item in lows]
    accepted = [e for e in entries if e is not None]
    if not accepted:
        errors = [run.jobs[i.index].get("error") for i in lows]
        return {
            "verified": False,
            "summary": f"low-priority jobs not accepted: {errors[0]} (priority classes PATCH: {allowed})",
            "evidence": {"errors": errors, "priority_classes_patch": allowed},
        }
    low_ids = {e["id"] for e in accepted}
    # A low job's start may wait for its recovery as any start does: a worker killed holding (or having
    # prefetched) it leaves it to the claim's lease and the stale sweep (seed 3 at f65ee95: both lows'
    # TrainJobs came about 2 min after their submission, amid seven worker kills; a 90 s wait left the wave
    # unverified).
    deadline = time.monotonic() + LOW_RUN_WITHIN
    while time.monotonic() < deadline:
        pods = [pod_identity(p) for p in kube.pods(namespace)]
        if any(p["job"] in low_ids and p["phase"] == "Running" and p["job_controlled"] for p in pods):
            break
        time.sleep(1)
    else:
        return {"verified": False, "summary": f"no low-priority job ran within {LOW_RUN_WITHIN:.0f} s"}
    # A preempted Workload is matched to its low job by its owner's name: dispatch names a TrainJob
    # <job id>-<attempt>. (A map of the low jobs' TrainJobs read from their pods before the wave missed the
    # second low job, which had not started yet and was the one preempted: seed 3.) dispatch ends a
    # preempted attempt within a second or so, deleting its TrainJob and its Workload: polled closely.
    high = JobPlan(index=base + 9, kind=KUEUE_HIGH, at=at, policy="retry", duration=3.0)
    # Every change of every Workload is watched from before the high job, so a preemption is seen however
    # briefly it shows: dispatch ends a preempted attempt within a second or so, deleting its TrainJob and
    # its Workload, and a list every 0.1 s missed one on a busy CI machine (the low job's second attempt
    # succeeded, the wave was reported unverified).
    # The watch goes on until the run is judged (wave_hits): every Kueue eviction of the wave's Workloads, a
    # later attempt's too, is a hit. Seed 1 at 81ecc66: on the loaded plane the high job's pods were not Ready
    # within waitForPodsReady's 15 s twice, so Kueue evicted it twice (PodsReadyTimeout) and each new attempt
    # preempted the low job again; a wave that expected one preemption read both jobs as mismatches.
    watch = _WorkloadWatch(kube, namespace, clock=run.t)
    high_entry: dict[str, Any] | None = None
    try:
        high_entry = submit(ctx, high, extra(kueue_names["high"]))
        preempted: list[dict[str, Any]] = []
        # The high job's start may wait for the stale sweep (a worker killed with it, seed 3): up to 2 min.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not preempted:
            with watch.lock:
                preempted = [
                    dict(r["preempted"])
                    for r in watch.records.values()
                    if r.get("preempted") and r["preempted"]["job"] in low_ids
                ]
            time.sleep(0.1)
    finally:
        wave = low_ids | ({str(high_entry["id"])} if high_entry and high_entry.get("id") else set())
        run.keep_workload_watch(watch, wave)
    verified = bool(preempted) and high_entry is not None
    return {
        "verified": verified,
        "summary": f"{len(accepted)} low, high {'accepted' if high_entry else 'NOT accepted'}; "
        f"{len(preempted)} low Workload(s) preempted",
        "evidence": {
            "low": sorted(low_ids),
            "high": high_entry.get("id") if high_entry else None,
            "preempted": preempted,
        },
    }


class _WorkloadWatch:
    """The run's namespace's Workloads, list + watch in a thread (the identity observer's watcher)."""

    def __init__(self, kube: Kube, namespace: str, clock: Callable[[], float] | None = None) -> None:
        from scripts.identity_observer import _Watch

        self._stopping = threading.Event()
        self._watch = _Watch(
            cluster="chaos",
            resource="workloads",
            call=functools.partial(
                kube.custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
            ),
            merge=functools.partial(_merge_workload, clock=clock),
            stopping=self._stopping,
        )
        self.lock, self.records = self._watch.lock, self._watch.records
        self._watch.start()
        self._watch.synced.wait(30)

    def stop(self) -> None:
        self._stopping.set()
        self._watch.wake()


# Kueue's own reasons for evicting a Workload that the wave's expectation follows (Evicted=True): a
# preemption, and the waitForPodsReady timeout (the plane's, scripts/cluster: its pods not Ready in time). An
# eviction dispatch asks for itself (deactivating a Workload: InactiveWorkload) is not one.
KUEUE_EVICTIONS: Final = {"Preempted": "preempted", "PodsReadyTimeout": "evicted"}


def _merge_workload(
    old: Mapping[str, Any] | None,
    wl: Mapping[str, Any],
    event: str,
    at: str,
    clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """A Workload's record: the first eviction by Kueue (KUEUE_EVICTIONS) any of its versions showed, matched
    to its job by its owner's name (dispatch names a TrainJob <job id>-<attempt>), at the run's time
    (`clock`); a preemption is also kept as `preempted` (the wave waits for one)."""
    record = dict(old or {})
    if record.get("evicted"):
        return record
    conditions = {c.get("type"): c for c in (wl.get("status") or {}).get("conditions") or []}
    evicted = conditions.get("Evicted") or {}
    reason = str(evicted.get("reason") or "") if evicted.get("status") == "True" else ""
    if (conditions.get("Preempted") or {}).get("status") == "True":
        reason = "Preempted"
    if reason not in KUEUE_EVICTIONS:
        return record
    owner = next(
        (o for o in wl.get("metadata", {}).get("ownerReferences") or [] if o.get("kind") == "TrainJob"),
        None,
    )
    job_id, _, attempt = str((owner or {}).get("name", "")).rpartition("-")
    record["evicted"] = {
        "workload": wl.get("metadata", {}).get("name"),
        "job": job_id,
        "attempt": attempt,
        "reason": reason,
        "message": str(evicted.get("message", ""))[:200],
        "seen": f"{event} {at}",
        "t": clock() if clock is not None else None,
    }
    if reason == "Preempted":
        record["preempted"] = record["evicted"]
    return record


def wave_hits(
    records: Iterable[Mapping[str, Any]], jobs: Collection[str], at: float
) -> list[tuple[str, Hit]]:
    """The hits of the Kueue wave: every Kueue eviction of a Workload of the wave's jobs that its watch saw,
    in the order Kueue made them (`at`: the time of one seen before the clock was read). Pure."""
    found = [r["evicted"] for r in records if r.get("evicted") and r["evicted"]["job"] in jobs]
    found.sort(key=lambda e: (e["t"] if e.get("t") is not None else at, int(e["attempt"] or 0)))
    return [
        (
            e["job"],
            Hit(
                "kueue-wave",
                KUEUE_EVICTIONS[e["reason"]],
                int(e["attempt"] or 0),
                e["t"] if e.get("t") is not None else at,
                e["workload"],
                message="" if e["reason"] == "Preempted" else e["reason"],
            ),
        )
        for e in found
    ]


def kueue_wave_hits(ctx: Context) -> None:
    """Stop the wave's Workload watch and make its evictions hits; the wave's fault entry lists them."""
    run = ctx.run
    kept = run.workload_watch
    if kept is None:
        return
    watch, jobs = kept
    run.workload_watch = None
    watch.stop()
    with watch.lock:
        records = [dict(r) for r in watch.records.values()]
    hits = wave_hits(records, jobs, run.t())
    for job_id, hit in hits:
        run.hit(job_id, hit)
    with run.lock:
        for entry in run.faults:
            if entry.get("fault") == "kueue-wave":
                entry.setdefault("evidence", {})["evictions_seen"] = [
                    {"job": job_id, **asdict(hit)} for job_id, hit in hits
                ]


def kueue_setup(kube: Kube, namespace: str, names: Mapping[str, str]) -> None:
    """A ClusterQueue of this run's own with room for one 2-GPU job, a LocalQueue in the run's namespace, and
    two WorkloadPriorityClasses, so nothing is shared with other tests on the plane."""
    group, version = "kueue.x-k8s.io", "v1beta2"
    kube.custom.create_cluster_custom_object(
        group,
        version,
        "resourceflavors",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ResourceFlavor",
            "metadata": {"name": names["flavor"]},
            "spec": {"nodeLabels": {"type": "kwok"}},
        },
    )
    kube.custom.create_cluster_custom_object(
        group,
        version,
        "clusterqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ClusterQueue",
            "metadata": {"name": names["cq"]},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": names["flavor"],
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "4"},
                                    {"name": "memory", "nominalQuota": "16Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "2"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    for name, value in ((names["low"], 100), (names["high"], 1000)):
        kube.custom.create_cluster_custom_object(
            group,
            version,
            "workloadpriorityclasses",
            {
                "apiVersion": f"{group}/{version}",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    kube.custom.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "localqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": names["lq"], "namespace": namespace},
            "spec": {"clusterQueue": names["cq"]},
        },
    )


def kueue_teardown(kube: Kube, names: Mapping[str, str]) -> None:
    group, version = "kueue.x-k8s.io", "v1beta2"
    for plural, name in (
        ("clusterqueues", names["cq"]),
        ("resourceflavors", names["flavor"]),
        ("workloadpriorityclasses", names["low"]),
        ("workloadpriorityclasses", names["high"]),
    ):
        with contextlib.suppress(Exception):
            kube.custom.delete_cluster_custom_object(group, version, plural, name)
