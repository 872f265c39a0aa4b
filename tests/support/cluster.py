"""Fixtures for tests against the real local Kubernetes control plane (scripts/cluster).

- ``kubeconfig`` (session): brings the control plane up once per run with ``scripts/cluster up``, or reuses
  one that is already running; stops it at the end only if this fixture started it (DISPATCH_CLUSTER_KEEP=1
  leaves it running). If it cannot come up the tests fail with the script's output; nothing is skipped.
- ``kube`` (session): CoreV1Api, BatchV1Api and CustomObjectsApi on that kubeconfig, with a default request
  timeout on every call.
- ``namespace`` (function): a fresh namespace per test (its default ServiceAccount exists when the test
  starts), deleted afterwards without waiting.
- ``kueue`` (module): Kueue runs for the tests of the module that asks for it (``scripts/cluster up --kueue``)
  and is stopped and unregistered after them (``scripts/cluster down --kueue``, about 1 s; adding it takes
  about 4 s), so every other test sees the plane without Kueue, whatever the order.
- ``kueue_queue`` (function, with ``kueue``): a Kueue LocalQueue in the test's namespace, on a ClusterQueue of
  the test's own with the quota, flavor and preemption of the shared ClusterQueue ``dispatch``
  (scripts/k8s/kueue-queues.yaml); TrainJobs join it with the label
  ``kueue.x-k8s.io/queue-name: <kueue_queue.name>``. The ClusterQueue is deleted afterwards (Kueue keeps it
  until its workloads are gone).

DISPATCH_CLUSTER_KUEUE=1 runs the whole session with Kueue instead, as on a cluster where Kueue is installed:
its TrainJob webhooks then see every TrainJob, queued or not (they append an empty runtimePatch with manager
``kueue.x-k8s.io/manager``, and the validating one refuses a TrainJob whose runtime Kueue's informer cache has
not seen, with its own message: README, "Kueue"). Without it, a plane left running with Kueue
(DISPATCH_CLUSTER_KEEP) has Kueue stopped at the start of the session.

Everything talks to the API server on 127.0.0.1 only; pod and service IPs are fake (KWOK) and never dialled.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "cluster"

# Connect and read timeouts (seconds) for every API call that does not pass its own _request_timeout.
REQUEST_TIMEOUT = (5, 30)
# Cold start of the control plane takes about a minute on 2 busy cores; a missing build takes far longer.
UP_TIMEOUT = float(os.environ.get("DISPATCH_CLUSTER_UP_TIMEOUT", "3600"))
# DISPATCH_CLUSTER_KUEUE=1: Kueue for the whole session; otherwise only for the modules that ask for it.
KUEUE_EVERYWHERE = os.environ.get("DISPATCH_CLUSTER_KUEUE") == "1"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
SHARED_CLUSTER_QUEUE = "dispatch"  # scripts/k8s/kueue-queues.yaml


class _TimeoutApiClient(client.ApiClient):
    """ApiClient whose requests default to REQUEST_TIMEOUT instead of waiting forever."""

    def call_api(
        self,
        method: Any,
        url: Any,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return super().call_api(
            method,
            url,
            header_params=header_params,
            body=body,
            post_params=post_params,
            _request_timeout=REQUEST_TIMEOUT if _request_timeout is None else _request_timeout,
        )


@dataclass(frozen=True)
class Kube:
    """The API clients. Typed Any on purpose: the generated models make every field Optional, which would
    bury the tests under None checks for fields a real API server always fills in."""

    api_client: client.ApiClient
    core: Any  # client.CoreV1Api
    batch: Any  # client.BatchV1Api
    custom: Any  # client.CustomObjectsApi


def _run_cluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLUSTER_SCRIPT), *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cluster_or_fail(*args: str) -> subprocess.CompletedProcess[str]:
    result = _run_cluster(*args, timeout=UP_TIMEOUT)
    if result.returncode != 0:
        pytest.fail(
            f"`scripts/cluster {' '.join(args)}` failed with exit code {result.returncode}; logs under "
            f"{os.environ.get('DISPATCH_CLUSTER_STATE', REPO / 'var' / 'cluster')}/logs\n"
            f"--- stderr (last 6000 chars) ---\n{result.stderr[-6000:]}\n"
            f"--- stdout ---\n{result.stdout[-2000:]}",
            pytrace=False,
        )
    return result


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    already_up = _run_cluster("status", timeout=60).returncode == 0
    # A plane the suite starts itself starts empty (a stopped one keeps its etcd data otherwise).
    up = _cluster_or_fail(
        "up", *([] if already_up else ["--fresh"]), *(["--kueue"] if KUEUE_EVERYWHERE else [])
    )
    if not KUEUE_EVERYWHERE:
        _cluster_or_fail("down", "--kueue")
    lines = up.stdout.strip().splitlines()
    path = lines[-1] if lines else ""
    if not path or not Path(path).is_file():
        pytest.fail(
            f"`scripts/cluster up` printed no kubeconfig path; stdout was {up.stdout!r}", pytrace=False
        )
    try:
        yield path
    finally:
        if not already_up and os.environ.get("DISPATCH_CLUSTER_KEEP") != "1":
            down = _run_cluster("down", timeout=180)
            if down.returncode != 0:
                print(f"scripts/cluster down failed ({down.returncode}):\n{down.stderr}")


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Iterator[Kube]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    api_client = _TimeoutApiClient(configuration=configuration)
    try:
        yield Kube(
            api_client=api_client,
            core=client.CoreV1Api(api_client),
            batch=client.BatchV1Api(api_client),
            custom=client.CustomObjectsApi(api_client),
        )
    finally:
        api_client.close()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{stem}-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"dispatch.test/cluster": "true"}))
    )
    try:
        # Pods are refused until the ServiceAccount controller has created the namespace's default account.
        deadline = time.monotonic() + 30
        while True:
            try:
                kube.core.read_namespaced_service_account("default", name)
                break
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield name
    finally:
        try:
            kube.core.delete_namespace(name, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise


@dataclass(frozen=True)
class KueueQueue:
    """A LocalQueue ``name`` in ``namespace`` on the ClusterQueue ``cluster_queue``."""

    name: str
    namespace: str
    cluster_queue: str


@pytest.fixture(scope="module")
def kueue(kubeconfig: str) -> Iterator[None]:
    """Kueue runs for this module's tests (see the module docstring)."""
    from cluster.kueue import presence  # what this process remembers of Kueue being installed or not

    if KUEUE_EVERYWHERE:
        yield
        return
    _cluster_or_fail("up", "--kueue")
    presence.forget()
    try:
        yield
    finally:
        _cluster_or_fail("down", "--kueue")
        presence.forget()


@pytest.fixture
def kueue_queue(kube: Kube, namespace: str, kueue: None) -> Iterator[KueueQueue]:
    """A LocalQueue in the test's namespace on a ClusterQueue of its own, a copy of the shared ClusterQueue
    ``dispatch`` (same flavor, quota and preemption), so that no other test's workloads take its quota."""
    shared = kube.custom.get_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", SHARED_CLUSTER_QUEUE
    )
    queue = KueueQueue(name="dispatch", namespace=namespace, cluster_queue=namespace)
    kube.custom.create_cluster_custom_object(
        KUEUE_GROUP,
        KUEUE_VERSION,
        "clusterqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": queue.cluster_queue, "labels": {"dispatch.test/cluster": "true"}},
            "spec": shared["spec"],
        },
    )
    try:
        kube.custom.create_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            "localqueues",
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "LocalQueue",
                "metadata": {"name": queue.name},
                "spec": {"clusterQueue": queue.cluster_queue},
            },
        )
        yield queue
    finally:
        try:
            kube.custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", queue.cluster_queue
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
