"""Start trusts only what it judged (issue 11), against the real control plane and a real worker.

- The identity warnings on a job are those of the runtime judged at start, not at submission: a runtime that
  gains a rule allowRankRestart waives between submission and start shows the new warning on the job's API
  answer and page, and the timeline records the change.
- The Trainer's TrainJob webhook reads runtimes through its informer cache, so right after dispatch creates
  the runtime copy it can deny the TrainJob with "... specified trainingRuntime must be created before the
  TrainJob is created" (measured through `make up`: 4 of 100 jobs submitted at once ended
  failed/config-error that way while their copy existed). That denial is waited out in the same delivery
  (a few short waits, about 3 s in all), then retried by the task with backoff; a burst of
  100 jobs through a real Celery worker ends with none in config-error. (The race is real here too: in one
  run on this control plane, 2 of the 100 got the denial on their first try, per the worker's log.)
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from cluster import gateway
from cluster.errors import Rejected
from dispatch_site.causes import Cause
from jobs import objects
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.submission import errors, start
from runtimes.models import SiteSettings
from tests.jobs.submission.test_worker_end_to_end import worker  # noqa: F401 - the real worker fixture
from tests.support.dispatch import GROUP, VERSION, trainer_job, wait_for

pytestmark = [pytest.mark.cluster]

BACKOFF_WARNING = (
    "allowRankRestart: the runtime's trainer job states backoffLimitPerIndex, so a failed rank can rerun "
    "under the same DISPATCH_ATTEMPT and one execution can contain a restarted rank"
)


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _body(namespace: str, runtime: str = "team-runtime") -> dict[str, Any]:
    return {
        "runtime": {"kind": "TrainingRuntime", "name": runtime},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }


def _allow_rank_restart() -> None:
    site = SiteSettings.load()
    site.allow_rank_restart = True
    site.save()


@pytest.mark.django_db
def test_a_runtime_that_gains_a_waived_rule_before_start_shows_the_new_warning(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    _allow_rank_restart()
    namespaced_runtime()
    api = _api(submitter[1])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.post("/api/v1/jobs", _body(namespace), format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}").json()["identity_warnings"] == []  # judged clean at submission

    # Between submission and start, the runtime gains backoffLimitPerIndex (waived by allowRankRestart).
    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(original)["template"]["spec"]["backoffLimitPerIndex"] = 1
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )
    for callback in callbacks:  # the start task runs now (eager in tests)
        callback()

    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "queued", job
    assert job["identity_warnings"] == [BACKOFF_WARNING]
    event = JobEvent.objects.get(job_id=job_id, kind="identity-warnings")
    assert BACKOFF_WARNING in event.message
    assert (event.details["before"], event.details["after"]) == ([], [BACKOFF_WARNING])
    # The copy that ran is the runtime that was judged: it carries backoffLimitPerIndex.
    copy = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", f"{job_id}-1"
    )
    assert trainer_job(copy)["template"]["spec"]["backoffLimitPerIndex"] == 1

    client = APIClient()
    client.force_login(submitter[0])
    page = client.get(f"/jobs/{job_id}/")
    assert page.status_code == 200
    assert "states backoffLimitPerIndex, so a failed rank can rerun" in page.content.decode()


@pytest.mark.django_db
def test_a_waived_rule_removed_before_start_clears_the_warning(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    _allow_rank_restart()
    namespaced_runtime(
        mutate=lambda body: trainer_job(body)["template"]["spec"].update(backoffLimitPerIndex=1)
    )
    api = _api(submitter[1])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_id = api.post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}").json()["identity_warnings"] == [BACKOFF_WARNING]

    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    del trainer_job(original)["template"]["spec"]["backoffLimitPerIndex"]
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )
    for callback in callbacks:
        callback()

    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "queued", job
    assert job["identity_warnings"] == []
    event = JobEvent.objects.get(job_id=job_id, kind="identity-warnings")
    assert (event.details["before"], event.details["after"]) == ([BACKOFF_WARNING], [])


# The Trainer's denial, or, where Kueue runs (DISPATCH_CLUSTER_KUEUE=1), Kueue's: both webhooks validate the
# TrainJob in parallel and the API server answers with whichever denial comes first.
RUNTIME_NOT_SEEN = re.compile(
    r"must be created before the TrainJob|denied the request: runtime '[^']+' not found"
)


def _lagging_create(monkeypatch: pytest.MonkeyPatch, lagging: int) -> list[Rejected]:
    """The Trainer's cache lag cannot be produced on demand, so it is injected: the first `lagging` TrainJob
    creates are sent to the real API server naming a runtime copy that does not exist yet, and the real
    Trainer webhook (or Kueue's, where it runs) denies them with its real message, which is exactly what a
    lagging cache answers."""
    real_create = gateway.create_namespaced
    denials: list[Rejected] = []

    def lagging_create(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind == objects.TRAINJOB and len(denials) < lagging:
            unseen = {**body, "spec": {**body["spec"], "runtimeRef": {**body["spec"]["runtimeRef"]}}}
            unseen["spec"]["runtimeRef"]["name"] = f"{body['spec']['runtimeRef']['name']}-unseen"
            try:
                return real_create(kind, unseen)
            except Rejected as exc:
                denials.append(exc)
                raise
        return real_create(kind, body)

    monkeypatch.setattr(gateway, "create_namespaced", lagging_create)
    return denials


def _accepted_not_started(
    namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any], capture: Any
) -> tuple[str, Execution]:
    """A job POSTed on an allow-listed TrainingRuntime, its submission held back (the test delivers it)."""
    namespaced_runtime()
    with capture(execute=False):
        job_id = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    return job_id, Execution.objects.get(job_id=job_id)


@pytest.mark.django_db
def test_a_brief_runtime_not_found_denial_is_waited_out_in_the_same_delivery(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache lag of a few hundred milliseconds (two denials) does not cost the job a task retry."""
    job_id, execution = _accepted_not_started(
        namespace, submitter, namespaced_runtime, django_capture_on_commit_callbacks
    )
    denials = _lagging_create(monkeypatch, lagging=2)

    start.execution_submit(execution_id=execution.pk, holder="chain-1")
    assert len(denials) == 2 and all(RUNTIME_NOT_SEEN.search(d.message) for d in denials), denials
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED, job.message
    trainjob = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", f"{job_id}-1")
    assert trainjob["spec"]["runtimeRef"]["name"] == f"{job_id}-1"


@pytest.mark.django_db
def test_the_trainers_runtime_not_found_denial_is_retried_not_a_config_error(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lag that outlasts the delivery's own waits makes the task retry later; the job stays pending."""
    job_id, execution = _accepted_not_started(
        namespace, submitter, namespaced_runtime, django_capture_on_commit_callbacks
    )
    denials = _lagging_create(monkeypatch, lagging=len(objects.COPY_SEEN_WAITS) + 1)

    with pytest.raises(errors.TransientSubmitError, match=RUNTIME_NOT_SEEN):
        start.execution_submit(execution_id=execution.pk, holder="chain-1")
    assert len(denials) == len(objects.COPY_SEEN_WAITS) + 1  # the real webhook answered every time
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.cause) == (JobState.PENDING, "")  # still waiting for its retry, not failed
    # The copy exists, and stays for the retry.
    copy = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", f"{job_id}-1"
    )
    assert copy["metadata"]["labels"]["dispatch.dev/job"] == job_id

    start.execution_submit(execution_id=execution.pk, holder="chain-1")  # the chain's retry
    job.refresh_from_db()
    assert job.state == JobState.QUEUED, job.message
    trainjob = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", f"{job_id}-1")
    assert trainjob["spec"]["runtimeRef"]["name"] == f"{job_id}-1"


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_100_jobs_through_a_real_worker_ends_with_none_in_config_error(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    worker: subprocess.Popen[str],  # noqa: F811 - the fixture imported above
) -> None:
    namespaced_runtime()
    api = _api(submitter[1])
    started = time.monotonic()
    ids = []
    for _ in range(100):
        response = api.post("/api/v1/jobs", _body(namespace), format="json")
        assert response.status_code == 202, response.json()
        ids.append(response.json()["id"])

    def settled() -> bool:
        return not Job.objects.filter(pk__in=ids, state=JobState.PENDING).exists()

    wait_for(settled, timeout=600, interval=1, what="the worker to start all 100 executions")
    elapsed = time.monotonic() - started
    states = dict(Job.objects.filter(pk__in=ids).values_list("id", "state"))
    config_errors = list(
        Job.objects.filter(pk__in=ids, cause=Cause.CONFIG_ERROR).values_list("id", "message")
    )
    assert config_errors == []
    assert sorted(set(states.values())) == [JobState.QUEUED], states
    trainjobs = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    assert len(trainjobs) == 100
    assert worker.poll() is None
    print(f"100 jobs started by one worker in {elapsed:.1f}s")
