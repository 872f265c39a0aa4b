"""Kueue v0.19.2 MultiKueue on the local planes: `scripts/cluster up --multikueue` (the session's plane as the
manager, worker planes worker-1 and worker-2 behind it) really dispatches a TrainJob to a worker, and a worker
stopped with `down --worker` is lost to the manager, then comes back.

Raw TrainJobs on dispatch-kind created as the manager's admin with the tests' own client (no dispatch code),
on the LocalQueue `default/multi` (scripts/k8s/multikueue-manager.yaml), labelled as dispatch labels its
TrainJobs (app.kubernetes.io/managed-by=dispatch), so the workers' admission guard meets the MultiKueue
identity creating and deleting a dispatch TrainJob (scripts/k8s/guard-multikueue-worker). KWOK plays the
kubelet on every plane: pods follow their env vars (scripts/k8s/kwok-stages.yaml).

The planes are started once per session (``multikueue_planes``: `up --multikueue`, which returns once both
MultiKueueClusters are Active) and the workers stopped at its end if the session started them
(`down --multikueue`); Kueue runs on the manager for this module's tests only (``manager``), as the ``kueue``
fixture does for the other Kueue modules. DISPATCH_MULTIKUEUE_PLANES=0 skips the module (a machine that cannot
run three planes).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.cluster import (
    KUEUE_EVERYWHERE,
    REPO,
    UP_TIMEOUT,
    Kube,
    _cluster_or_fail,
    _run_cluster,
    _TimeoutApiClient,
)
from tests.support.kueue import (
    JOBSET,
    KUEUE,
    QUEUE_LABEL,
    RUNTIME,
    TRAINER,
    Recorder,
    conditions_summary,
    is_true,
    wait_for,
    workload_of,
)

pytestmark = pytest.mark.cluster

WORKERS = ("worker-1", "worker-2")
STATE = Path(os.environ.get("DISPATCH_CLUSTER_STATE", REPO / "var" / "cluster"))
NAMESPACE = "default"  # MultiKueue copies into the manager's namespace: `default` exists on every plane
QUEUE = "multi"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"  # the manager TrainJob's spec.managedBy, and the AdmissionCheck's
TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"  # the Trainer's default spec.managedBy
# v0.19.2 writes it as an annotation (feature gate WorkloadIdentifierAnnotations, beta, on), not as the label
# older releases and status-facts §13 describe.
PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
MANAGED_BY = {"app.kubernetes.io/managed-by": "dispatch"}
# A lost worker: the manager's watch of it breaks when its kube-apiserver stops, Kueue reconnects and fails.
LOST_WITHIN = 90
# Three planes on two busy cores: dispatch (quota on the manager, admission on a worker, the TrainJob copy,
# the worker's Trainer, JobSet and Job controllers) takes a few seconds, more under load.
DISPATCH_WITHIN = 180


def kube_for(kubeconfig: Path) -> Kube:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api_client = _TimeoutApiClient(configuration=configuration)
    return Kube(
        api_client=api_client,
        core=client.CoreV1Api(api_client),
        batch=client.BatchV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
    )


def workers_running() -> set[str]:
    """The workers `scripts/cluster status` says run (one line per worker once they were started)."""
    out = _run_cluster("status", timeout=120).stdout
    return {w for w in WORKERS if re.search(rf"^{re.escape(w)}\s+running ", out, re.M)}


def kueue_runs_on_the_manager() -> bool:
    out = _run_cluster("status", timeout=120).stdout
    return re.search(r"^kueue\s+running ", out, re.M) is not None


@pytest.fixture(scope="session")
def multikueue_planes(kubeconfig: str) -> Iterator[dict[str, Kube]]:
    """The worker planes (and Kueue with the MultiKueue setup on the manager), started once per session."""
    if os.environ.get("DISPATCH_MULTIKUEUE_PLANES") == "0":
        pytest.skip("DISPATCH_MULTIKUEUE_PLANES=0: no MultiKueue worker planes on this machine")
    already = workers_running()
    # Workers the session starts start empty, like the session's own plane.
    _cluster_or_fail("up", "--multikueue", *([] if already else ["--fresh"]))
    kubes = {w: kube_for(STATE / "workers" / f"{w}.kubeconfig") for w in WORKERS}
    try:
        yield kubes
    finally:
        for kube in kubes.values():
            kube.api_client.close()
        if not already and os.environ.get("DISPATCH_CLUSTER_KEEP") != "1":
            down = _run_cluster("down", "--multikueue", timeout=300)
            if down.returncode != 0:
                print(f"scripts/cluster down --multikueue failed ({down.returncode}):\n{down.stderr}")


@pytest.fixture(scope="module")
def manager(kube: Kube, multikueue_planes: dict[str, Kube]) -> Iterator[Kube]:
    """The manager (the session's plane) with Kueue and its MultiKueue objects for this module's tests; Kueue
    is stopped and unregistered after them, so the other modules see the plane as they expect."""
    from cluster.kueue import presence  # what this process remembers of Kueue being installed or not

    if not kueue_runs_on_the_manager():
        _cluster_or_fail("up", "--multikueue")
    presence.forget()
    try:
        yield kube
    finally:
        if not KUEUE_EVERYWHERE:
            _cluster_or_fail("down", "--kueue")
            presence.forget()


def multi_trainjob(kube: Kube, name: str, env: dict[str, str]) -> dict[str, Any]:
    body = {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE} | MANAGED_BY},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {"env": [{"name": k, "value": v} for k, v in env.items()]},
        },
    }
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        *TRAINER, NAMESPACE, "trainjobs", body
    )
    return created


def trainjob_or_none(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            *TRAINER, NAMESPACE, "trainjobs", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def delete_trainjob(kube: Kube, name: str) -> None:
    try:
        kube.custom.delete_namespaced_custom_object(
            *TRAINER, NAMESPACE, "trainjobs", name, propagation_policy="Background"
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def multikueue_cluster(kube: Kube, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_cluster_custom_object(*KUEUE, "multikueueclusters", name)
    return found


def dispatched_to(manager: Kube, trainjob: dict[str, Any], timeout: float = DISPATCH_WITHIN) -> str:
    """The worker the manager's Workload of the TrainJob names in status.clusterName."""

    def probe() -> str | None:
        wl = workload_of(manager, trainjob)
        name = ((wl or {}).get("status") or {}).get("clusterName")
        return str(name) if name else None

    cluster: str = wait_for(
        f"the Workload of {trainjob['metadata']['name']} to name its worker (status.clusterName)",
        probe,
        timeout,
        state=lambda: conditions_summary(workload_of(manager, trainjob)),
    )
    return cluster


def jobsets(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(*JOBSET, NAMESPACE, "jobsets")[
        "items"
    ]
    return items


def pods_of(kube: Kube, trainjob: str) -> list[Any]:
    return list(
        kube.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"jobset.sigs.k8s.io/jobset-name={trainjob}"
        ).items
    )


def delete_everywhere(manager: Kube, workers: dict[str, Kube], name: str, timeout: float = 90) -> None:
    """Delete the manager's TrainJob and wait (without failing: this is cleanup) until MultiKueue removed the
    workers' copies, so that no pod of the test keeps running on a worker."""
    delete_trainjob(manager, name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [w for w, kube in workers.items() if trainjob_or_none(kube, name) is not None]
        if trainjob_or_none(manager, name) is None and not left:
            return
        time.sleep(1)
    print(f"cleanup: TrainJob {name} still on {left} after {timeout}s")


def phases(recorder: Recorder, pod: str) -> list[str]:
    """The pod's phases in the order the watch saw them, repeats dropped."""
    out: list[str] = []
    for observed in recorder.of("Pod", pod):
        phase = (observed.obj.get("status") or {}).get("phase")
        if phase and (not out or out[-1] != phase):
            out.append(phase)
    return out


def test_a_trainjob_on_multi_runs_on_the_worker_kueue_picks_and_the_manager_mirrors_it(
    manager: Kube, multikueue_planes: dict[str, Kube]
) -> None:
    name = f"mk-run-{uuid.uuid4().hex[:6]}"
    recorders = {
        w: Recorder(kube, NAMESPACE).start(("Pod", "TrainJob", "Workload"))
        for w, kube in multikueue_planes.items()
    }
    try:
        created = multi_trainjob(manager, name, {"KWOK_RUN_DURATION": "4s"})
        # Kueue's TrainJob webhook on the manager: a TrainJob of a queue with a MultiKueue admission check is
        # managed by MultiKueue, so the manager's Trainer leaves it alone (no JobSet, no pods there).
        assert created["spec"]["managedBy"] == MULTIKUEUE
        assert created["spec"]["suspend"] is True

        worker = dispatched_to(manager, created)
        assert worker in WORKERS
        other = next(w for w in WORKERS if w != worker)

        # The manager's TrainJob mirrors the worker's status: Complete once the worker's job is.
        done = wait_for(
            f"the manager's TrainJob {name} to be Complete",
            lambda: (tj := trainjob_or_none(manager, name)) and is_true(tj, "Complete") and tj,
            DISPATCH_WITHIN,
            state=lambda: conditions_summary(trainjob_or_none(manager, name)),
        )
        assert done["spec"]["managedBy"] == MULTIKUEUE
        wl = workload_of(manager, created)
        assert wl is not None and wl["status"]["clusterName"] == worker
        [check] = [c for c in wl["status"]["admissionChecks"] if c["name"] == "dispatch-multi"]
        assert check["state"] == "Ready", check
        assert not [j for j in jobsets(manager) if j["metadata"]["name"] == name]
        assert not pods_of(manager, name)

        # The worker: MultiKueue created the copy (linked to the prebuilt Workload, without managedBy, so the
        # worker's Trainer runs it), and its two pods ran, then succeeded.
        rec = recorders[worker]
        seen = rec.of("TrainJob", name)
        assert seen, f"{worker} never had the TrainJob {name}"
        copy = seen[0].obj
        assert copy["metadata"]["annotations"][PREBUILT] == wl["metadata"]["name"]
        assert copy["metadata"]["labels"][ORIGIN_LABEL] == "multikueue"
        assert copy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dispatch"
        assert copy["spec"].get("managedBy") in (None, TRAINER_CONTROLLER), copy["spec"]
        pods = sorted({o.name for o in rec.of("Pod") if o.name.startswith(f"{name}-")})
        assert len(pods) == 2, pods
        wait_for(
            f"the watch of {worker} to see both pods Running, then Succeeded",
            lambda: all(phases(rec, pod)[-2:] == ["Running", "Succeeded"] for pod in pods),
            30,
            state=lambda: {pod: phases(rec, pod) for pod in pods},
        )
        worker_final = wait_for(
            f"the watch of {worker} to see its TrainJob Complete",
            lambda: [o.obj for o in rec.of("TrainJob", name) if is_true(o.obj, "Complete")],
            30,
            state=lambda: [conditions_summary(o.obj) for o in rec.of("TrainJob", name)],
        )
        mirrored = [(c["type"], c["status"], c.get("reason")) for c in done["status"]["conditions"]]
        on_worker = [
            (c["type"], c["status"], c.get("reason")) for c in worker_final[-1]["status"]["conditions"]
        ]
        assert mirrored == on_worker

        # The other worker never ran it: AllAtOnce copies the Workload to both workers, the TrainJob only to
        # the one that admitted it first.
        assert not recorders[other].of("TrainJob", name)
        assert not [o for o in recorders[other].of("Pod") if o.name.startswith(f"{name}-")]

        # Once the Workload finished, MultiKueue deletes the worker's copy (as the MultiKueue identity,
        # through the worker's guard, which names it).
        wait_for(
            f"MultiKueue to delete the TrainJob {name} from {worker}",
            lambda: trainjob_or_none(multikueue_planes[worker], name) is None,
            120,
        )
    finally:
        for recorder in recorders.values():
            recorder.stop()
        delete_everywhere(manager, multikueue_planes, name)


def test_a_worker_stopped_with_down_worker_is_lost_to_the_manager_and_comes_back_with_up(
    manager: Kube, multikueue_planes: dict[str, Kube]
) -> None:
    name = f"mk-long-{uuid.uuid4().hex[:6]}"
    created = multi_trainjob(manager, name, {"KWOK_STAY_RUNNING": "1"})
    try:
        worker = dispatched_to(manager, created)
        wait_for(
            f"the pods of {name} Running on {worker}",
            lambda: [p for p in pods_of(multikueue_planes[worker], name) if p.status.phase == "Running"],
            DISPATCH_WITHIN,
        )
        other = next(w for w in WORKERS if w != worker)

        down = _run_cluster("down", "--worker", worker, timeout=300)
        assert down.returncode == 0, down.stderr
        # The manager and the other worker keep running.
        status = _run_cluster("status", timeout=120).stdout
        assert re.search(rf"^{worker}\s+stopped", status, re.M), status
        assert re.search(rf"^{other}\s+running ", status, re.M), status
        assert re.search(r"^kube-apiserver\s+running ", status, re.M), status

        def active(cluster: str) -> dict[str, Any] | None:
            conditions = multikueue_cluster(manager, cluster).get("status", {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Active"), None)

        t0 = time.monotonic()
        lost = wait_for(
            f"the manager's MultiKueueCluster {worker} to be not Active",
            lambda: (c := active(worker)) is not None and c["status"] != "True" and c,
            LOST_WITHIN,
            state=lambda: active(worker),
        )
        print(f"{worker} not Active after {time.monotonic() - t0:.1f}s: {lost}")
        assert (active(other) or {}).get("status") == "True"

        up = subprocess.run(
            [str(REPO / "scripts" / "cluster"), "up", "--multikueue"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT,
            check=False,
        )
        assert up.returncode == 0, up.stderr[-4000:]
        back = active(worker)
        assert back is not None and back["status"] == "True", back
    finally:
        delete_everywhere(manager, multikueue_planes, name)
