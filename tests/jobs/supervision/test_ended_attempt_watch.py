"""Attempt A is watched until A+1 starts (issue 32): a pod of A that appears after dispatch ended A is an
identity finding on A, written once however many supervisors look.

The cluster test runs on the real plane with the real Trainer v2.3.0, which rebuilds the JobSet of a Failed
TrainJob when that JobSet is deleted (status-facts §12). The injected faults are two
admission policies (tests.support.admission.denying: a platform policy or a stuck webhook refuses the same
way): one refuses every write to attempt 1's TrainJob, so dispatch cannot stop it; the other every write to
the namespace, so dispatch's fence (cluster/fence.py, which would otherwise refuse the rebuilt pods at the
door) cannot be written, as on a cluster without the guard. The test then deletes the JobSet, as a cleanup
job would.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from kubernetes.client.exceptions import ApiException

from jobs.naming import trainjob_name
from jobs.supervision import retries
from jobs.supervision.status.identity import ended_attempt_findings
from tests.jobs.supervision.support import supervise_until
from tests.support.admission import denying
from tests.support.cluster import Kube
from tests.support.dispatch import get_job, job_body, submit_job, wait_for

ENDED = datetime(2026, 12, 4, 12, 0, 0, 400_000, tzinfo=UTC)


def _pod(name: str, uid: str, rank: int, created: str, restart: int = 0) -> dict[str, Any]:
    return {
        "uid": uid,
        "name": name,
        "rank": rank,
        "attempt": 1,
        "restart_attempt": restart,
        "created": created,
    }


# ---------------------------------------------------------------- the rule (pure)


def test_a_rebuilt_pod_of_a_remembered_rank_ran_that_rank_twice() -> None:
    remembered = [_pod("j-1-node-0-0-a", "u1", 0, "2026-12-04T11:59:50Z")]
    new = [_pod("j-1-node-0-0-b", "u2", 0, "2026-12-04T12:00:05Z")]
    [finding] = ended_attempt_findings(remembered, new, attempt=1, ended_at=ENDED, warned=False)
    assert finding["rank"] == 0 and finding["pods"] == ["j-1-node-0-0-a", "j-1-node-0-0-b"]
    assert "2 pods ran rank 0 in attempt 1" in finding["why"] and finding["expected"] is False


def test_a_pod_made_after_the_attempt_ended_is_a_finding_and_one_made_in_its_last_second_is_not() -> None:
    late = _pod("j-1-node-0-1-x", "u3", 1, "2026-12-04T12:00:01Z")
    same_second = _pod("j-1-node-0-0-y", "u4", 0, "2026-12-04T12:00:00Z")  # may predate the end (0.4 s)
    findings = ended_attempt_findings([], [late, same_second], attempt=1, ended_at=ENDED, warned=True)
    assert [f["pods"] for f in findings] == [["j-1-node-0-1-x"]]
    assert "after attempt 1 ended" in findings[0]["why"]
    assert findings[0]["expected"] is False  # no plan foresees a rank running after dispatch ended it


def test_pods_of_another_attempt_or_already_remembered_findings_are_not_repeated() -> None:
    remembered = [
        _pod("a", "u1", 0, "2026-12-04T11:59:50Z"),
        _pod("b", "u2", 0, "2026-12-04T11:59:55Z"),  # already a finding while A ran
    ]
    other = {**_pod("c", "u5", 0, "2026-12-04T12:00:09Z"), "attempt": 2}
    assert ended_attempt_findings(remembered, [other], attempt=1, ended_at=ENDED, warned=False) == []


# ---------------------------------------------------------------- on the real plane


def _pods_of(kube: Kube, namespace: str, job_id: str) -> dict[str, str]:
    """uid -> name of the job's attempt-1 pods, by the test's own list."""
    listed = kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={job_id}").items
    return {
        p.metadata.uid: p.metadata.name
        for p in listed
        if p.metadata.labels.get("dispatch.dev/attempt") == "1"
    }


def _refused(kube: Kube, namespace: str, name: str) -> bool:
    """A server-side dry run of a write to the TrainJob is refused: the policy is in force (a new policy
    takes the API server a moment)."""
    try:
        kube.custom.patch_namespaced_custom_object(
            "trainer.kubeflow.org",
            "v1alpha1",
            namespace,
            "trainjobs",
            name,
            {"metadata": {"annotations": {"test.dispatch.dev/probe": "1"}}},
            dry_run="All",
        )
    except ApiException as exc:
        return exc.status in (403, 422) and "may not change" in str(exc.body)
    return False


def _fence_refused(kube: Kube, namespace: str) -> bool:
    try:
        kube.core.patch_namespace(
            namespace, {"metadata": {"annotations": {"test.dispatch.dev/probe": "1"}}}, dry_run="All"
        )
    except ApiException as exc:
        return exc.status in (403, 422) and "may not change" in str(exc.body)
    return False


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("dispatch_kind_allowed")
def test_a_jobset_rebuilt_for_an_ended_attempt_is_an_identity_finding_written_once(
    kube: Kube, namespace: str, submitter: tuple[User, str]
) -> None:
    """Attempt 1 fails (both ranks exit 3) while a policy refuses every write to its TrainJob, so dispatch
    can neither stop nor delete it, and the job waits for it before attempt 2. Its JobSet is then deleted;
    the Trainer builds it again and attempt 1's ranks run again under attempt 1's identity. Two supervisors'
    retry passes look at once: the job's timeline gets one identity finding naming the new pods, and attempt
    2 still waits. Before, nothing looked at attempt 1 once it had ended: the new pods went unseen."""
    token = submitter[1]
    env = {"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "1s"}
    policy = {"retry": {"app-error": 1}, "backoff_seconds": {"app-error": 0}, "budgets": {"user": 1}}
    job_id = submit_job(
        token, job_body(namespace, env=env, recovery_policy=policy), TestCase.captureOnCommitCallbacks
    )
    name = trainjob_name(job_id, 1)
    with (
        denying(
            kube,
            namespace,
            group="trainer.kubeflow.org",
            resources=["trainjobs"],
            operations=["UPDATE", "DELETE"],
            expression=f"oldObject.metadata.name != '{name}'",
            message="held by the test: attempt 1's TrainJob may not change",
        ),
        denying(
            kube,
            namespace,
            group="",
            resources=["namespaces"],
            operations=["UPDATE"],
            expression="false",
            message="held by the test: the namespace may not change",
        ),
    ):
        wait_for(lambda: _refused(kube, namespace, name), timeout=30, what="the policy in force")
        wait_for(lambda: _fence_refused(kube, namespace), timeout=30, what="the fence's policy in force")
        supervise_until(
            token, job_id, lambda d: d["executions"][0]["state"] == "failed", what="attempt 1 failed"
        )
        first = _pods_of(kube, namespace, job_id)
        assert first, "attempt 1 ran no pod"
        kube.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)
        rebuilt = wait_for(
            lambda: {u: n for u, n in _pods_of(kube, namespace, job_id).items() if u not in first},
            timeout=90,
            what="the Trainer's rebuilt JobSet running attempt 1's ranks again",
        )
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def a_supervisors_retry_pass() -> None:
            try:
                barrier.wait(10)
                retries.start_due_retries()
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connection.close()

        def found() -> list[dict[str, Any]]:
            threads = [threading.Thread(target=a_supervisors_retry_pass) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not errors, errors
            timeline = get_job(token, job_id)["timeline"]
            return [e for e in timeline if e["kind"] == "identity-finding" and e["attempt"] == 1]

        events = wait_for(found, timeout=60, interval=1, what="an identity finding on attempt 1")
        for _ in range(3):  # and again: the finding is written once
            events = found()
        data = get_job(token, job_id)
    [event] = events
    assert event["cause"] == "identity-violation"
    named = {pod for finding in event["details"]["findings"] for pod in finding["pods"]}
    assert named & set(rebuilt.values()), (named, rebuilt)
    assert data["current_attempt"] == 1, "attempt 2 started beside attempt 1's rebuilt JobSet"
    assert f"waiting for attempt 1's TrainJob {name}" in data["message"]
    [execution] = data["executions"]
    assert execution["identity_findings"] == event["details"]["findings"]
