"""The faults to the cluster under dispatch's jobs, each verified as it happens: a rank pod evicted, a KWOK
node lost, foreign pods carrying a running job's labels. Each acts on the jobs the plan submitted for it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from scripts.chaoslib.common import log
from scripts.chaoslib.context import Context
from scripts.chaoslib.kube import age_seconds, pod_identity
from scripts.chaoslib.outcomes import Hit
from scripts.chaoslib.plan import APP_ERROR, LONG, UNTIL_CANCELLED, FaultPlan

# After kube-apiserver is killed and back, the plane works through what piled up: seed 1 at 81ecc66 saw the
# TrainJobs created in the 45 s after it was ready get their first pod after a median of 59-67 s, and the
# target of an eviction planned 93 s into the run (job index 76) ran its ranks 212 s after the fault began
# waiting, 32 s past the old deadline: the fault read NOT VERIFIED though the job then ran and succeeded.
PLANE_BACKLOG_SECONDS = 300


def running_rank_pods(ctx: Context, indexes: Iterable[int], *, margin: float) -> list[dict[str, Any]]:
    """Running rank pods (of dispatch's Jobs, in the run's namespace) of the planned jobs `indexes`,
    with at least `margin` seconds of their run still ahead; sorted by job index and rank."""
    run, kube, namespace = ctx.run, ctx.kube, ctx.namespace
    with run.lock:
        wanted = {run.jobs[i]["id"]: run.jobs[i] for i in indexes if run.jobs.get(i, {}).get("id")}
    found = []
    for pod in kube.pods(namespace):
        who = pod_identity(pod)
        job = wanted.get(who["job"] or "")
        if job is None or not who["job_controlled"] or who["deleting"] or who["phase"] != "Running":
            continue
        duration = float(job["plan"]["duration"]) if job["kind"] != UNTIL_CANCELLED else 1e9
        if duration - age_seconds(who["start"]) < margin:
            continue
        found.append({**who, "index": job["index"]})
    return sorted(found, key=lambda p: (p["index"], str(p["rank"])))


def wait_for_targets(ctx: Context, indexes: Iterable[int], margin: float) -> list[dict[str, Any]]:
    """The targets' running rank pods, waiting for them as long as dispatch may take to start a job
    whose start message was lost with Redis (the stale sweep: up to 2 min), plus an API server
    outage, plus the plane's backlog after one (PLANE_BACKLOG_SECONDS)."""
    args = ctx.args
    deadline = time.monotonic() + 150 + args.outage_seconds + PLANE_BACKLOG_SECONDS
    while True:
        try:
            found = running_rank_pods(ctx, indexes, margin=margin)
        except Exception as exc:  # our direct client: should not fail; say so if it does
            log(f"listing pods failed: {exc!r}")
            found = []
        if found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def fault_eviction(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    run, kube, namespace = ctx.run, ctx.kube, ctx.namespace
    targets = wait_for_targets(ctx, f.targets, margin=5.0)
    if not targets:
        return {
            "verified": False,
            "summary": f"the target job {f.targets} had no running rank pod to evict",
        }
    pod = targets[f.pick % len(targets)]
    with run.lock:
        run.targeted.add(pod["job"])
    body = kube.client.V1Eviction(metadata=kube.client.V1ObjectMeta(name=pod["name"], namespace=namespace))
    try:
        kube.core.create_namespaced_pod_eviction(pod["name"], namespace, body, _request_timeout=15)
        answer = "201"
    except kube.client.ApiException as exc:
        answer = f"{exc.status} {exc.reason}"
    gone = False
    for _ in range(60):
        current = kube.pod(namespace, pod["name"])
        if (
            current is None
            or (current.get("metadata") or {}).get("uid") != pod["uid"]
            or (current.get("metadata") or {}).get("deletionTimestamp")
        ):
            gone = True
            break
        time.sleep(0.5)
    verified = answer == "201" and gone
    if verified:
        run.hit(pod["job"], Hit("eviction", "evicted", int(pod["attempt"] or 0), run.t(), pod["name"]))
    return {
        "verified": verified,
        "summary": f"Eviction of {pod['name']} (job {pod['job']} attempt {pod['attempt']} "
        f"rank {pod['rank']}): {answer}, pod gone {gone}",
        "evidence": {
            "pod": pod["name"],
            "uid": pod["uid"],
            "job": pod["job"],
            "attempt": pod["attempt"],
            "answer": answer,
            "gone": gone,
        },
    }


def fault_node_loss(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    run, kube, namespace, lost_node = ctx.run, ctx.kube, ctx.namespace, ctx.lost_node
    wait_for_targets(ctx, f.targets, margin=10.0)  # the jobs submitted for it run (on either node)
    kube.core.patch_node(lost_node, {"spec": {"unschedulable": True}})
    time.sleep(3)  # nothing new lands there; what is there runs on
    deadline = time.monotonic() + 60
    while True:
        on_node = [pod_identity(p) for p in kube.pods(namespace, node=lost_node)]
        on_node = [
            p
            for p in on_node
            if p["job_controlled"] and p["phase"] in ("Pending", "Running") and not p["deleting"]
        ]
        running = [
            p
            for p in on_node
            if p["phase"] == "Running"
            and (j := run.job_by_id(p["job"] or ""))
            and j["kind"] in (LONG, UNTIL_CANCELLED)
        ]
        if running or time.monotonic() > deadline:
            break
        kube.core.patch_node(lost_node, {"spec": {"unschedulable": False}})  # let pods land there, then again
        time.sleep(4)
        kube.core.patch_node(lost_node, {"spec": {"unschedulable": True}})
        time.sleep(5)
    if not running:
        kube.core.delete_node(lost_node)
        return {
            "verified": False,
            "summary": f"no running rank pod of a long or cancel-only job on {lost_node} "
            "within 60 s; "
            "node deleted anyway",
        }
    kube.core.delete_node(lost_node)
    deleted_at = run.t()
    node_gone = False
    for _ in range(60):
        try:
            kube.core.read_node(lost_node, _request_timeout=5)
        except kube.client.ApiException as exc:
            if exc.status == 404:
                node_gone = True
                break
        time.sleep(0.5)
    # PodGC removes the pods of a Node that no longer exists (after a 40 s quarantine). KWOK plays
    # them on meanwhile, so one may finish on its own first: a hit is a pod still unfinished when it
    # went (or failed by PodGC itself), and it takes effect when it is gone.
    last = {p["uid"]: p for p in on_node}
    gone_at: dict[str, float] = {}
    for _ in range(300):
        current = {q["metadata"]["uid"]: q for q in kube.pods(namespace, node=lost_node)}
        for uid in list(last):
            if uid in gone_at:
                continue
            if uid in current:
                pod = current[uid]
                conditions = (pod.get("status") or {}).get("conditions") or []
                target: dict[str, Any] = next(
                    (c for c in conditions if c.get("type") == "DisruptionTarget"), {}
                )
                last[uid] = {**pod_identity(pod), "disruption": target.get("reason")}
            else:
                gone_at[uid] = run.t()
        if len(gone_at) == len(last):
            break
        time.sleep(1)
    left = [p for uid, p in last.items() if uid not in gone_at]
    hits = []
    for uid, p in last.items():
        job = run.job_by_id(p["job"] or "")
        if job is None or job["kind"] == APP_ERROR or uid not in gone_at:
            continue  # an app-error job's failing rank exits 3 after 2 s, before the node went
        unfinished = p["phase"] in ("Pending", "Running") or p.get("disruption") == "DeletionByPodGC"
        if not unfinished:
            continue
        hits.append(p)
        run.hit(p["job"], Hit("node-loss", "node-lost", int(p["attempt"] or 0), gone_at[uid], p["name"]))
    verified = node_gone and not left
    return {
        "verified": verified,
        "summary": f"node {lost_node} deleted with {len(on_node)} pod(s) of "
        f"{len({p['job'] for p in on_node})} job(s) on it ({len(hits)} hits); node gone {node_gone}; "
        f"pods removed {not left} ({run.t() - deleted_at:.0f} s)",
        "evidence": {
            "node": lost_node,
            "pods": [
                {k: p.get(k) for k in ("name", "job", "attempt", "rank", "phase", "disruption")}
                for p in last.values()
            ],
            "hits": [p["name"] for p in hits],
            "node_gone": node_gone,
            "pods_left": [p["name"] for p in left],
            "seconds_until_pods_gone": round(run.t() - deleted_at, 1),
        },
    }


def fault_foreign_pods(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    run, kube, namespace, stranger_ns = ctx.run, ctx.kube, ctx.namespace, ctx.stranger_ns
    main_nodes = ctx.main_nodes
    targets = wait_for_targets(ctx, f.targets, margin=8.0)
    if not targets:
        return {
            "verified": False,
            "summary": f"the target job {f.targets} had no running rank pod to copy",
        }
    real = targets[f.pick % len(targets)]
    with run.lock:
        run.targeted.add(real["job"])
    source = kube.pod(namespace, real["name"]) or {}
    meta = source.get("metadata") or {}
    # Labels as dispatch's rank pod has them, minus the Job controller's selector labels (the Job
    # controller would adopt an orphan matching its selector: that would be the Job's pod, not a
    # stranger's).
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if "controller-uid" not in k and "job-name" not in k
    }
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith("batch.kubernetes.io/job-completion-index")
    }
    node_env = next(
        (
            c.get("env") or []
            for c in (source.get("spec") or {}).get("containers") or []
            if c.get("name") == "node"
        ),
        [],
    )
    env = [e for e in node_env if str(e.get("name", "")).startswith("DISPATCH_") and "value" in e] + [
        {"name": "KWOK_STAY_RUNNING", "value": "1"}
    ]
    made, running = [], []
    for ns in (stranger_ns, namespace):
        name = f"forged-{real['name']}"[:63].rstrip("-.")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": {
                "nodeName": main_nodes[0],
                "restartPolicy": "Never",
                "containers": [{"name": "node", "image": "localhost/stranger:1", "env": env}],
            },
        }
        try:
            kube.core.create_namespaced_pod(ns, pod, _request_timeout=15)
            made.append(f"{ns}/{name}")
        except kube.client.ApiException as exc:
            log(f"foreign pod in {ns}: {exc.status} {exc.reason}")
            continue
        for _ in range(40):
            current = kube.pod(ns, name)
            if current and (current.get("status") or {}).get("phase") == "Running":
                running.append(f"{ns}/{name}")
                break
            time.sleep(0.5)
    verified = len(made) == 2 and len(running) == 2
    with run.lock:
        job = run.job_by_id(real["job"])
        if job is not None:
            job.setdefault("foreign_pods", []).extend(running)
    return {
        "verified": verified,
        "summary": f"{len(running)} of 2 foreign pods Running with the labels of job {real['job']} "
        f"attempt {real['attempt']} rank {real['rank']}: {', '.join(running)}",
        "evidence": {
            "job": real["job"],
            "copied_from": real["name"],
            "labels": labels,
            "pods": made,
            "running": running,
        },
    }
