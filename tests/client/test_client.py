"""dispatch_client.Client against a real dispatch server process, a real worker and the real control plane:
plan, start, get, wait, cancel, runtimes, jobs, and the typed errors a user catches."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from dispatch_client import (
    BadRequest,
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    JobEnded,
    NotFound,
    Refused,
    ServiceUnavailable,
    Unauthorized,
)
from kubernetes.client.rest import ApiException

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import AllowListEntry
from tests.client.conftest import Dispatch, free_port, service_env, start_web
from tests.support.dispatch import GROUP, VERSION, runtime_body, trainer_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

IMAGE = "localhost/trainer:v1"


@pytest.fixture
def allow_dispatch_kind() -> None:
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime",
        namespace="",
        name="dispatch-kind",
        defaults={"for_jobs": True, "for_sessions": True},
    )


@pytest.fixture
def client(dispatch_server: Dispatch, namespace: str, allow_dispatch_kind: None) -> Client:
    """A plain user granted only the test's namespace."""
    _, token = user_create(username=f"cu-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace])
    return Client(dispatch_server.url, token, namespace=namespace)


def _trainjob(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainjobs", name
        )
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_plan_shows_the_trainjob_start_would_create(client: Client) -> None:
    plan = client.plan(runtime="dispatch-kind", image=IMAGE, num_nodes=3)

    assert plan.refused is False
    assert plan.reasons == []
    train_job = plan.objects["train_job"] if plan.objects else {}
    assert train_job["spec"]["trainer"]["numNodes"] == 3
    assert train_job["spec"]["trainer"]["image"] == IMAGE
    assert client.jobs() == []  # plan created nothing


def test_start_wait_and_cancel_a_real_trainjob(client: Client, kube: Any, namespace: str) -> None:
    job = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=2, display_name="from the client")
    assert job.state == "pending"
    assert job.namespace == namespace

    queued = client.wait(job.id, "queued", timeout=90, polling_interval=0.5)
    assert queued.state == "queued"
    assert queued.trainjob_name == f"{job.id}-1"
    trainjob = _trainjob(kube, namespace, f"{job.id}-1")
    assert trainjob is not None, "the worker did not create the TrainJob"
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert client.get(job.id).data["display_name"] == "from the client"
    assert [j.id for j in client.jobs(state="queued")] == [job.id]

    # Waiting for a state the job cannot reach in time names its last state.
    with pytest.raises(TimeoutError, match=r"still queued after 1s"):
        client.wait(job.id, "succeeded", timeout=1, polling_interval=0.5)

    cancelled = client.cancel(job.id)
    assert cancelled.state == "cancelled"
    assert client.wait(job.id, timeout=10).state == "cancelled"  # no state: any terminal one
    with pytest.raises(JobEnded) as ended:
        client.wait(job.id, "running", timeout=10)
    assert ended.value.job.state == "cancelled"
    wait_for(lambda: _trainjob(kube, namespace, f"{job.id}-1") is None, timeout=60, what="TrainJob deleted")

    with pytest.raises(Conflict) as again:  # a cancelled job cannot be cancelled again
        client.cancel(job.id)
    assert again.value.status == 409


def test_a_refused_start_raises_with_every_reason_code(
    client: Client, kube: Any, namespace: str, dispatch_server: Dispatch
) -> None:
    body = runtime_body("TrainingRuntime", "bad-rt", namespace)
    node = trainer_job(body)
    node["template"]["spec"]["backoffLimit"] = 4
    node["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", body)
    AllowListEntry.objects.create(kind="TrainingRuntime", namespace=namespace, name="bad-rt", for_jobs=True)

    plan = client.plan(runtime="TrainingRuntime/bad-rt", image=IMAGE)
    assert plan.refused is True
    assert {"restart-policy", "backoff-limit"} <= set(plan.codes)

    with pytest.raises(Refused) as refused:
        client.start(runtime={"kind": "TrainingRuntime", "name": "bad-rt"}, image=IMAGE)
    assert refused.value.status == 422
    assert {"restart-policy", "backoff-limit"} <= set(refused.value.codes)
    assert refused.value.job_id is not None
    recorded = client.get(refused.value.job_id)  # the refusal is recorded, with its reasons
    assert recorded.state == "refused"
    assert set(recorded.codes) == set(refused.value.codes)
    assert _trainjob(kube, namespace, f"{refused.value.job_id}-1") is None


def test_a_runtime_nobody_allow_listed_is_refused_by_code(client: Client) -> None:
    with pytest.raises(Refused) as refused:
        client.start(runtime="never-reviewed", image=IMAGE)
    assert refused.value.codes[:1] == ["runtime-not-allowed"]


def test_idempotency_key_returns_the_same_job_and_a_reused_key_conflicts(client: Client) -> None:
    first = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=1, idempotency_key="run-42")
    again = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=1, idempotency_key="run-42")
    assert again.id == first.id

    with pytest.raises(Conflict) as conflict:
        client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=2, idempotency_key="run-42")
    assert conflict.value.status == 409
    assert "run-42" in conflict.value.detail or "key" in conflict.value.detail.lower()
    client.cancel(first.id)


def test_typed_errors_for_bad_input_auth_grants_and_missing_jobs(
    client: Client, dispatch_server: Dispatch
) -> None:
    with pytest.raises(BadRequest) as bad:
        client.plan(runtime="dispatch-kind", image=IMAGE, num_nodes=0, num_node=2)
    assert set(bad.value.field_errors) == {"num_nodes", "num_node"}
    assert bad.value.field_errors["num_node"] == ["unknown field"]

    with pytest.raises(Forbidden) as forbidden:
        client.start(runtime="dispatch-kind", image=IMAGE, namespace="not-granted-here")
    assert forbidden.value.status == 403
    assert "not-granted-here" in forbidden.value.detail

    with pytest.raises(NotFound):
        client.get("jaaaaaaaaaa")

    with pytest.raises(Unauthorized):
        Client(dispatch_server.url, "not-a-token").jobs()

    with pytest.raises(ConnectionFailed):
        Client(f"http://127.0.0.1:{free_port()}", "x", timeout=(1, 2)).runtimes()


def test_runtimes_lists_the_allow_listed_runtime_with_its_verdict(client: Client) -> None:
    runtimes = {(r.kind, r.name): r for r in client.runtimes()}

    kind = runtimes[("ClusterTrainingRuntime", "dispatch-kind")]
    assert kind.allow_listed is True
    assert set(kind.purposes) == {"jobs", "sessions"}
    assert kind.refused is False


def test_the_cluster_being_down_is_a_503_naming_it(
    dispatch_server: Dispatch,
    namespace: str,
    allow_dispatch_kind: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A second server whose kubeconfig names a port nothing listens on: a real unreachable API server."""
    kubeconfig = tmp_path_factory.mktemp("down") / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: down, cluster: {{server: "https://127.0.0.1:{free_port()}"}}}}]\n'
        "users: [{name: u, user: {token: none}}]\n"
        "contexts: [{name: down, context: {cluster: down, user: u}}]\ncurrent-context: down\n"
    )
    env = service_env(str(kubeconfig)) | {"KUBE_TIMEOUT_SECONDS": "2"}
    url, web = start_web(env, dispatch_server.logs, name="web-no-cluster")
    try:
        _, token = user_create(username=f"cd-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace])
        with pytest.raises(ServiceUnavailable) as down:
            Client(url, token, namespace=namespace).plan(runtime="dispatch-kind", image=IMAGE)
        assert down.value.status == 503
        assert "cluster" in down.value.detail
    finally:
        web.stop()
