"""Supervision through Kueue v0.19.2 on the local control plane, the user's way: POST /api/v1/jobs (the submit
task runs on commit), supervision cycles (the beat's code: jobs.supervision.cycle), GET /api/v1/jobs/{id}.

Each test's namespace has a LocalQueue `dispatch` on a ClusterQueue of its own (cpu 4, memory 16Gi,
nvidia.com/gpu 2: the fixture `kueue_queue`), so a job asking nvidia.com/gpu 1 per node on dispatch-kind
(2 nodes) takes the whole GPU quota and a second one waits. What Kueue does is checked with the test's own
client (tests.support.kueue: its Recorder watches the namespace's pods), never with dispatch's records.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, TestCase
from kubernetes.client.rest import ApiException

from cluster import kueue as cluster_kueue
from cluster.guard import RESUMED_ANNOTATION
from jobs.models import Execution, Job
from jobs.supervision import cycle
from runtimes.models import SiteSettings
from tests.jobs.observability.test_metrics import samples, scrape
from tests.jobs.supervision.support import supervise_until, wait_job, watching
from tests.support.admission import denying
from tests.support.cluster import REPO, Kube, KueueQueue
from tests.support.dispatch import api_as, get_job, submit_job
from tests.support.kueue import (
    KUEUE,
    Recorder,
    admitted,
    conditions_summary,
    get_trainjob,
    is_true,
    pending_workloads,
    queue_job_body,
    queued_trainjob,
    wait_for,
    wait_workload,
    workload_of,
)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db, pytest.mark.usefixtures("dispatch_kind_allowed")]

MARK = "dispatch.dev/kueue-deactivated"


def _allow_priorities(namespace: str) -> None:
    site = SiteSettings.load()
    site.kueue_priority_classes = {namespace: ["dispatch-low", "dispatch-high"]}
    site.save()


def _pods_of_attempt(recorder: Recorder, job_id: str, attempt: int) -> dict[str, dict[str, Any]]:
    """Every pod of (job, attempt) the test's own watch saw, by UID (its last state)."""
    found: dict[str, dict[str, Any]] = {}
    for observed in recorder.of("Pod"):
        labels = observed.obj["metadata"].get("labels") or {}
        if labels.get("dispatch.dev/job") == job_id and labels.get("dispatch.dev/attempt") == str(attempt):
            found[observed.obj["metadata"]["uid"]] = observed.obj
    return found


def _low_job_running(
    kube: Kube, kueue_queue: KueueQueue, token: str, capture: Any, recorder: Recorder
) -> tuple[str, dict[str, Any], set[str]]:
    """A low-priority job that retries `preempted` once, submitted and supervised until running: its id, its
    attempt-1 TrainJob and the UIDs of its two pods (the test's own pod watch)."""
    body = queue_job_body(
        kueue_queue,
        priority_class="dispatch-low",
        env={"KWOK_STAY_RUNNING": "1"},
        recovery_policy={"retry": {"preempted": 1}, "backoff_seconds": {"preempted": 0}},
    )
    job_id = submit_job(token, body, capture)
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="the low job running")
    first = get_trainjob(kube, kueue_queue.namespace, f"{job_id}-1")
    first_pods = set(_pods_of_attempt(recorder, job_id, 1))
    assert len(first_pods) == 2, first_pods
    return job_id, first, first_pods


def _ran(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _cycles_held(held: list[Callable[[], Any]]) -> None:
    """One supervision cycle whose on-commit work (delete a TrainJob, submit A+1) is held back, as when the
    worker that would run it is busy: the held callbacks run later, in order."""
    with TestCase.captureOnCommitCallbacks(execute=False) as callbacks:
        cycle.supervise()
    held.extend(callbacks)


# ---------------------------------------------------------------- queueing


def test_second_job_is_queued_for_quota_at_position_1_then_starts_when_the_first_ends(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three jobs that each need the ClusterQueue's two GPUs: the second and third are `queued` with Kueue's
    quota reason and positions 1 and 2 in their LocalQueue (the visibility API, read once per LocalQueue
    and cycle however many jobs wait in it: counted by a spy that calls through); the job page shows the
    position; once the first is cancelled, Kueue admits the second and it runs."""
    token = submitter[1]
    calls: list[tuple[str, str]] = []
    real = cluster_kueue.pending_workloads

    def spy(namespace: str, local_queue: str) -> Any:
        calls.append((namespace, local_queue))
        return real(namespace, local_queue)

    monkeypatch.setattr(cluster_kueue, "pending_workloads", spy)
    waits_before = _queue_waits()
    first = submit_job(
        token, queue_job_body(kueue_queue, env={"KWOK_STAY_RUNNING": "1"}), django_capture_on_commit_callbacks
    )
    supervise_until(token, first, lambda d: d["state"] == "running", what="the first job running")
    second = submit_job(
        token,
        queue_job_body(kueue_queue, env={"KWOK_RUN_DURATION": "2s"}),
        django_capture_on_commit_callbacks,
    )
    third = submit_job(
        token,
        queue_job_body(kueue_queue, env={"KWOK_RUN_DURATION": "2s"}),
        django_capture_on_commit_callbacks,
    )

    # Kueue orders equal-priority Workloads by creation time, to the second: two made in the same second may
    # come in either order, so the test reads which one is next instead of assuming it (a flake seen in CI).
    def places() -> dict[str, int | None]:
        return {j: (get_job(token, j)["queued_reason"] or {}).get("position") for j in (second, third)}

    supervise_until(
        token,
        third,
        lambda d: sorted(p or 0 for p in places().values()) == [1, 2],
        what="the two waiting jobs queued at positions 1 and 2",
    )
    second, third = sorted((second, third), key=lambda j: places()[j] or 0)  # second: the next admitted

    # Kueue says why it cannot admit a Workload on the one its scheduler tried (either of the two, a moment
    # later): that job's reason carries Kueue's words; both read awaiting-quota.
    def kueue_said() -> list[str]:
        return [
            str((get_job(token, j)["queued_reason"] or {}).get("message", ""))
            for j in (second, third)
            if "insufficient unused quota"
            in str((get_job(token, j)["queued_reason"] or {}).get("message", ""))
        ]

    supervise_until(token, second, lambda d: bool(kueue_said()), what="Kueue's reason for a waiting job")
    assert "insufficient unused quota for nvidia.com/gpu in flavor dispatch-kwok" in kueue_said()[0]
    waiting = get_job(token, second)
    reason = waiting["queued_reason"]
    assert waiting["state"] == "queued" and reason["reason"] == "awaiting-quota", reason
    assert reason["position"] == 1 and reason["local_queue"] == kueue_queue.name, reason
    calls.clear()
    with TestCase.captureOnCommitCallbacks(execute=True):
        cycle.supervise()
    assert calls == [(kueue_queue.namespace, kueue_queue.name)], calls  # two jobs waiting, one call
    # The job page shows it too.
    page = Client()
    page.force_login(submitter[0])
    html = page.get(f"/jobs/{second}/").content.decode()
    assert f"LocalQueue <code>{kueue_queue.name}</code>" in html and "position 1" in html, html[:2000]
    # The job list shows each waiting job's LocalQueue and place, and the overview the jobs waiting per
    # ClusterQueue (what supervision read of their Workloads).
    listed = page.get("/jobs/?state=queued").content.decode()
    row = listed[listed.index(f'data-job="{second}"') :].split("</tr>", 1)[0]
    assert f"{kueue_queue.name} · position 1" in row, row
    # ... and the ClusterQueue's quota as its plan read it (its usage then depends on how soon Kueue's status
    # counted the first job: only the quota itself is certain).
    assert re.search(r"nvidia\.com/gpu \d+ of 2 free when planned", row), row
    home = page.get("/").content.decode()
    box = home[home.index('id="kueue-waiting"') :].split("</section>", 1)[0]
    assert f"<code>{kueue_queue.cluster_queue}</code> <strong>2</strong> jobs" in box, box

    with django_capture_on_commit_callbacks(execute=True):
        cancelled = api_as(token).post(f"/api/v1/jobs/{first}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.content
    done = supervise_until(
        token,
        second,
        lambda d: d["state"] == "succeeded",
        timeout=120,
        what="the second job ran and succeeded",
    )
    assert done["cause"] == ""
    # dispatch_queue_wait_seconds (GET /metrics) observed the first and the second job's time in Kueue's
    # hands, the second's at least as long as it waited behind the first.
    count, total = (after - before for after, before in zip(_queue_waits(), waits_before, strict=True))
    [attempt] = done["executions"]
    held = (
        datetime.fromisoformat(attempt["started_at"]) - datetime.fromisoformat(attempt["submitted_at"])
    ).total_seconds()
    assert count >= 2 and total >= held > 0, (count, total, held)


def _queue_waits() -> tuple[float, float]:
    """dispatch_queue_wait_seconds' count and sum, as a scrape of /metrics shows them."""
    text = scrape()
    count = samples(text, "dispatch_queue_wait_seconds_count").get((), 0.0)
    return count, samples(text, "dispatch_queue_wait_seconds_sum").get((), 0.0)


# ---------------------------------------------------------------- preemption ends the attempt


def test_kueue_preemption_ends_attempt_1_for_good_and_attempt_2_runs_as_a_new_trainjob(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A low-priority job runs; a high-priority TrainJob arrives in the same ClusterQueue and Kueue preempts
    the low one. Supervision deactivates attempt 1's Workload with dispatch's mark and records `preempted`
    with the Workload's Evicted and Preempted conditions as evidence. The worker that deletes attempt 1's
    TrainJob is held back (its on-commit work waits) until the high job is done and Kueue has admitted
    another workload in its place: without the deactivation Kueue would re-admit attempt 1 first (priority
    100 over 0) and resume the SAME TrainJob, so new pods of attempt 1 would run; the test's own pod watch
    proves none did. Then attempt 2 runs as a new TrainJob whose pods carry DISPATCH_ATTEMPT=2."""
    ns = kueue_queue.namespace
    token = submitter[1]
    _allow_priorities(ns)
    recorder = Recorder(kube, ns).start()
    held: list[Callable[[], Any]] = []
    try:
        job_id, first, first_pods = _low_job_running(
            kube, kueue_queue, token, django_capture_on_commit_callbacks, recorder
        )

        high = queued_trainjob(
            kube, kueue_queue, "high", env={"KWOK_RUN_DURATION": "3s"}, priority="dispatch-high", gpus=True
        )
        wait_workload(kube, first, lambda w: is_true(w, "Evicted", "Preempted"), "attempt 1 preempted")

        def attempt_1_ended() -> bool:
            _cycles_held(held)
            return Execution.objects.get(job_id=job_id, attempt=1).state == "failed"

        wait_for("attempt 1 failed (its delete held back)", attempt_1_ended, timeout=60)
        execution = Execution.objects.get(job_id=job_id, attempt=1)
        assert execution.cause == "preempted", (execution.cause, execution.message)
        fields = {(e["field"], e["value"].split(":")[0]) for e in execution.evidence}
        assert ("status.conditions[Evicted]", "Preempted") in fields, execution.evidence
        assert ("status.conditions[Preempted]", "InClusterQueue") in fields, execution.evidence
        assert "due to prioritization in the ClusterQueue" in execution.message, execution.message
        high_wl = workload_of(kube, high) or {}
        assert f"by workload UID {high_wl['metadata']['uid']}" in execution.message, execution.message

        # The high job finishes; a canary (no priority) takes the quota for a second. Then Kueue has had
        # its chance: attempt 1 is neither admitted nor waiting in the LocalQueue (the visibility API), or,
        # without the deactivation, it is re-admitted and its pods run again (a requeued Workload may wait
        # out a backoff first, so the canary alone proves nothing).
        wait_workload(kube, high, lambda w: is_true(w, "Finished", "Succeeded"), "high finished", timeout=60)
        canary = queued_trainjob(kube, kueue_queue, "canary", env={"KWOK_RUN_DURATION": "1s"}, gpus=True)
        first_wl = (workload_of(kube, first) or {})["metadata"]["name"]

        def rerun_seen() -> bool:
            return bool(set(_pods_of_attempt(recorder, job_id, 1)) - first_pods)

        wait_for(
            "the canary done (or attempt 1 re-admitted)",
            lambda: rerun_seen() or is_true(workload_of(kube, canary) or {}, "Finished", "Succeeded"),
            timeout=60,
        )

        def settled() -> bool:
            if rerun_seen():
                return True
            pending = {i["metadata"]["name"] for i in pending_workloads(kube, kueue_queue).get("items") or []}
            return first_wl not in pending and not admitted(workload_of(kube, first) or {})

        wait_for("attempt 1 out of Kueue's queue (or re-admitted)", settled, timeout=60)
        rerun = {
            uid: pod for uid, pod in _pods_of_attempt(recorder, job_id, 1).items() if uid not in first_pods
        }
        assert rerun == {}, f"attempt 1 ran again under the same identity: {sorted(rerun)}"

        # attempt 1's Workload: deactivated by dispatch, its mark says why (the TrainJob still exists: the
        # worker that deletes it is held back).
        wl = wait_workload(kube, first, lambda w: w["spec"].get("active") is False, "deactivated")
        mark = json.loads(wl["metadata"]["annotations"][MARK])
        assert mark["cause"] == "preempted" and mark["evicted"]["reason"] == "Preempted", mark
        # (Kueue leaves Evicted=True Preempted on a Workload evicted already; on one still admitted it writes
        # Evicted=True Deactivated: either way the mark makes it dispatch's own act, not a user's.)
        # A supervisor reading it now sees dispatch's own deactivation: still preempted.
        for _ in range(2):
            _cycles_held(held)
        assert Job.objects.get(pk=job_id).executions.get(attempt=1).cause == "preempted"

        # The worker catches up: attempt 1's TrainJob is deleted, attempt 2 is a new TrainJob.
        for callback in held:
            callback()
        held.clear()
        done = supervise_until(
            token,
            job_id,
            lambda d: d["current_attempt"] == 2 and d["state"] == "running",
            timeout=120,
            what="attempt 2 running",
        )
        assert done["executions"][0]["cause"] == "preempted", done["executions"]
        second = get_trainjob(kube, ns, f"{job_id}-2")
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        pods_2 = wait_for(
            "attempt 2's pods seen running",
            lambda: [p for p in _pods_of_attempt(recorder, job_id, 2).values() if _ran(p)],
        )
        for pod in pods_2:
            env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env") or []}
            assert env.get("DISPATCH_ATTEMPT") == "2", env
        again = set(_pods_of_attempt(recorder, job_id, 1)) - first_pods
        assert again == set(), f"attempt 1 ran again: {sorted(again)}"
    finally:
        for callback in held:
            callback()
        recorder.stop()


def _kueue_log() -> str:
    state = Path(os.environ.get("DISPATCH_CLUSTER_STATE", REPO / "var" / "cluster"))
    return (state / "logs" / "kueue.log").read_text(errors="replace")


def test_while_dispatch_sees_nothing_kueue_cannot_admit_a_preempted_attempt_again(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """`make chaos` (200 jobs) saw ranks run twice: Kueue preempted attempt 1 while dispatch could not reach
    the API server (30 s), then re-admitted the same Workload, which resumed the same TrainJob, before
    dispatch could deactivate it. The admission guard's Kueue policy (deploy/guard/kueue.yaml, which
    scripts/cluster installs with Kueue) refuses in the API server the status update that would admit an
    evicted dispatch Workload again. Here no supervision cycle runs between the preemption and the end: Kueue
    tries to admit attempt 1 again once the quota is free (its refusal is in Kueue's own log), no pod of
    attempt 1 runs again (the test's own pod watch), and when dispatch looks again attempt 1 is `preempted`
    and attempt 2 runs as a new TrainJob."""
    ns = kueue_queue.namespace
    token = submitter[1]
    _allow_priorities(ns)
    recorder = Recorder(kube, ns).start()
    try:
        job_id, first, first_pods = _low_job_running(
            kube, kueue_queue, token, django_capture_on_commit_callbacks, recorder
        )
        log_before = len(_kueue_log())

        # dispatch is away from here on: no cycle runs.
        high = queued_trainjob(
            kube, kueue_queue, "high", env={"KWOK_RUN_DURATION": "3s"}, priority="dispatch-high", gpus=True
        )
        wait_workload(kube, first, lambda w: is_true(w, "Evicted", "Preempted"), "attempt 1 preempted")
        wait_workload(kube, high, lambda w: is_true(w, "Finished", "Succeeded"), "high finished", timeout=60)
        first_wl = (workload_of(kube, first) or {})["metadata"]["name"]

        def refused() -> bool:
            tail = _kueue_log()[log_before:]
            return f"{first_wl} was evicted before (" in tail

        def rerun() -> set[str]:
            return set(_pods_of_attempt(recorder, job_id, 1)) - first_pods

        # The interleaving: the quota is free and Kueue tried to admit attempt 1 again (refused) ...
        wait_for(
            "Kueue's try to admit attempt 1 again, refused", lambda: refused() or bool(rerun()), timeout=90
        )
        assert rerun() == set(), f"attempt 1 ran again under the same identity: {sorted(rerun())}"
        assert refused()
        # ... and stays refused: not admitted, no pod of attempt 1 (Kueue retries with a backoff).
        wait_for(
            "another refused try",
            lambda: _kueue_log()[log_before:].count(f"{first_wl} was evicted before (") >= 2 or bool(rerun()),
        )
        assert not admitted(workload_of(kube, first) or {})
        assert rerun() == set(), f"attempt 1 ran again under the same identity: {sorted(rerun())}"

        # dispatch looks again: the eviction it did not see ends attempt 1, attempt 2 is a new TrainJob.
        with django_capture_on_commit_callbacks(execute=True):
            done = supervise_until(
                token,
                job_id,
                lambda d: d["current_attempt"] == 2 and d["state"] == "running",
                timeout=120,
                what="attempt 2 running",
            )
        assert done["executions"][0]["cause"] == "preempted", done["executions"]
        assert rerun() == set(), f"attempt 1 ran again: {sorted(rerun())}"
    finally:
        recorder.stop()


RESUMED = RESUMED_ANNOTATION


def test_a_workload_made_again_without_its_eviction_history_cannot_resume_the_attempt(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The gap the Workload policy leaves: Kueue reads an eviction from the Workload's schedulingStats, and a
    Workload made again has none. Attempt 1 runs, is preempted while dispatch sees nothing, and its Workload
    is deleted (here by the test, as a user or Kueue itself on a spec mismatch would: the fault this injects
    is the deletion, which nothing else produces on demand). Kueue makes a new Workload for the suspended
    TrainJob and, once the quota is free, admits it: no history, so the Workload policy lets it through.
    What holds is the TrainJob policy pair (deploy/guard/kueue.yaml, policies 4-5): the API server marked the
    TrainJob when Kueue first resumed it, and refuses the second resume. The test's own pod watch sees no
    pod of attempt 1 run again; dispatch, looking again, runs attempt 2 as a new TrainJob."""
    ns = kueue_queue.namespace
    token = submitter[1]
    _allow_priorities(ns)
    recorder = Recorder(kube, ns).start()
    try:
        job_id, first, first_pods = _low_job_running(
            kube, kueue_queue, token, django_capture_on_commit_callbacks, recorder
        )
        resumed = get_trainjob(kube, ns, f"{job_id}-1")
        assert (resumed["metadata"].get("annotations") or {}).get(RESUMED) == "true", resumed["metadata"]
        log_before = len(_kueue_log())

        # dispatch is away from here on: no cycle runs.
        high = queued_trainjob(
            kube, kueue_queue, "high", env={"KWOK_RUN_DURATION": "5s"}, priority="dispatch-high", gpus=True
        )
        evicted = wait_workload(
            kube, first, lambda w: is_true(w, "Evicted", "Preempted"), "attempt 1 preempted"
        )
        kube.custom.delete_namespaced_custom_object(*KUEUE, ns, "workloads", evicted["metadata"]["name"])
        again = wait_workload(
            kube,
            first,
            lambda w: w["metadata"]["uid"] != evicted["metadata"]["uid"],
            "a Workload made again for attempt 1",
            timeout=60,
        )
        assert not (again.get("status") or {}).get("schedulingStats", {}).get("evictions"), again["status"]
        wait_workload(kube, high, lambda w: is_true(w, "Finished", "Succeeded"), "high finished", timeout=90)

        def rerun() -> set[str]:
            return set(_pods_of_attempt(recorder, job_id, 1)) - first_pods

        refusal = f"TrainJob {ns}/{job_id}-1 ran once and was suspended since"
        wait_for(
            "the Workload made again admitted, and Kueue's resume of attempt 1 refused",
            lambda: refusal in _kueue_log()[log_before:] or bool(rerun()),
            timeout=120,
        )
        assert admitted(workload_of(kube, first) or {}), "the Workload made again was not admitted"
        assert rerun() == set(), f"attempt 1 ran again under the same identity: {sorted(rerun())}"
        held = get_trainjob(kube, ns, f"{job_id}-1")
        assert held["spec"].get("suspend") is True, held["spec"]

        # dispatch looks again: attempt 1 ends, attempt 2 runs as a new TrainJob.
        with django_capture_on_commit_callbacks(execute=True):
            done = supervise_until(
                token,
                job_id,
                lambda d: d["current_attempt"] == 2 and d["state"] == "running",
                timeout=180,
                what="attempt 2 running",
            )
        print("attempt 1 ended:", done["executions"][0]["state"], done["executions"][0]["cause"])
        assert rerun() == set(), f"attempt 1 ran again: {sorted(rerun())}"
    finally:
        recorder.stop()


# ---------------------------------------------------------------- deactivation and PodsReady timeout


def test_a_workload_a_user_deactivates_cancels_the_job_outside_dispatch(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ns = kueue_queue.namespace
    token = submitter[1]
    job_id = submit_job(
        token, queue_job_body(kueue_queue, env={"KWOK_STAY_RUNNING": "1"}), django_capture_on_commit_callbacks
    )
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    trainjob = get_trainjob(kube, ns, f"{job_id}-1")
    wl = workload_of(kube, trainjob) or {}
    kube.custom.patch_namespaced_custom_object(
        *KUEUE, ns, "workloads", wl["metadata"]["name"], {"spec": {"active": False}}
    )
    done = supervise_until(token, job_id, lambda d: d["state"] == "cancelled", what="cancelled")
    assert done["cause"] == "cancelled"
    assert "deactivated outside dispatch" in done["message"], done["message"]
    assert any("Deactivated" in str(e["value"]) for e in done["evidence"]), done["evidence"]
    assert MARK not in ((workload_of(kube, trainjob) or {}).get("metadata", {}).get("annotations") or {})


@pytest.mark.parametrize("path", ["beat", "watch"])
@pytest.mark.django_db(transaction=True)
def test_a_pods_ready_timeout_ends_the_attempt_evicted(
    path: str,
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Pods that never get Ready (KWOK_IMAGE_PULL_ERROR: Pending in ErrImagePull): Kueue evicts the Workload
    PodsReadyTimeout after the plane's 15 s (scripts/cluster sets waitForPodsReady.timeout), well before
    dispatch's own image-pull threshold; dispatch records `evicted` with that evidence, deactivates the
    Workload and deletes the TrainJob (a policy without retries). Through the beat's cycle and through
    `manage.py supervise` (its informers watch the namespace's Workloads)."""
    ns = kueue_queue.namespace
    token = submitter[1]
    body = queue_job_body(
        kueue_queue, env={"KWOK_IMAGE_PULL_ERROR": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    job_id = submit_job(token, body, django_capture_on_commit_callbacks)
    trainjob = get_trainjob(kube, ns, f"{job_id}-1")
    recorder = Recorder(kube, ns).start()
    try:
        if path == "beat":
            done = supervise_until(token, job_id, lambda d: d["state"] == "failed", timeout=90, what="failed")
        else:
            with watching(interval=0.5):
                wait_job(job_id, lambda j: j.state == "failed", timeout=90, what="failed")
            done = get_job(token, job_id)
    finally:
        recorder.stop()
    assert done["cause"] == "evicted", (done["cause"], done["message"])
    assert any(str(e["value"]).startswith("PodsReadyTimeout") for e in done["evidence"]), done["evidence"]
    # dispatch deactivated the Workload with its mark before deleting the TrainJob (the watch's last view).
    seen = [o.obj for o in recorder.of("Workload") if o.obj["metadata"]["name"] == workload_name(trainjob)]
    marked = [w for w in seen if MARK in (w["metadata"].get("annotations") or {})]
    assert marked and marked[-1]["spec"]["active"] is False, [conditions_summary(w) for w in seen]
    assert json.loads(marked[-1]["metadata"]["annotations"][MARK])["cause"] == "evicted"
    wait_for("the TrainJob deleted", lambda: not _exists(kube, ns, f"{job_id}-1"), timeout=30)


@pytest.mark.django_db(transaction=True)
def test_a_job_that_names_a_queue_is_watched_through_its_workload_whatever_dispatch_remembers_of_kueue(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`manage.py supervise` started while Kueue's group answered 404 (Kueue installed after dispatch, or a
    discovery call that failed): it remembers Kueue absent for a minute. The fault is injected by noting that
    answer (cluster.kueue.presence), since the plane's Kueue cannot be uninstalled and back on demand. A job
    that names a queue is watched through its Workload all the same: Kueue's PodsReadyTimeout eviction ends
    it `evicted` with that evidence, and dispatch deactivates the Workload with its mark. (Before, the
    namespace's Workloads were watched only if Kueue was known served at first sight: the job read another
    cause, without the Workload's word.)"""
    ns = kueue_queue.namespace
    token = submitter[1]
    body = queue_job_body(
        kueue_queue, env={"KWOK_IMAGE_PULL_ERROR": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    job_id = submit_job(token, body, django_capture_on_commit_callbacks)
    trainjob = get_trainjob(kube, ns, f"{job_id}-1")
    recorder = Recorder(kube, ns).start()
    asked: list[float] = []

    def remembered_absent() -> bool:
        cluster_kueue.presence.note_absent()
        asked.append(time.monotonic())
        return False

    monkeypatch.setattr(cluster_kueue, "installed", remembered_absent)
    try:
        with watching(interval=0.5):
            wait_job(job_id, lambda j: j.state == "failed", timeout=90, what="failed")
        assert asked, "supervision never read the injected answer (Kueue absent)"
        done = get_job(token, job_id)
    finally:
        cluster_kueue.presence.forget()
        recorder.stop()
    assert done["cause"] == "evicted", (done["cause"], done["message"])
    assert any(str(e["value"]).startswith("PodsReadyTimeout") for e in done["evidence"]), done["evidence"]
    seen = [o.obj for o in recorder.of("Workload") if o.obj["metadata"]["name"] == workload_name(trainjob)]
    marked = [w for w in seen if MARK in (w["metadata"].get("annotations") or {})]
    assert marked and marked[-1]["spec"]["active"] is False, [conditions_summary(w) for w in seen]


def _deactivation_refused(kube: Kube, namespace: str) -> contextlib.AbstractContextManager[str]:
    """Any update turning a Workload's spec.active to false in `namespace` is refused by the API server."""
    return denying(
        kube,
        namespace,
        group="kueue.x-k8s.io",
        resources=["workloads"],
        operations=["UPDATE"],
        expression="!has(object.spec.active) || object.spec.active"
        " || (has(oldObject.spec.active) && !oldObject.spec.active)",
        message="Workloads stay active in this namespace",
    )


@pytest.mark.django_db(transaction=True)
def test_a_workload_the_api_server_will_not_deactivate_holds_the_failure_back_only_a_few_cycles(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Kueue evicts a job's Workload (PodsReadyTimeout) and the API server refuses dispatch's deactivation
    (a policy of the platform's: the fault, real admission). The failure waits DEACTIVATE_TRIES cycles, then
    is applied with a warning naming the refusal: the job reads `evicted` instead of `running` for ever, and
    deleting its TrainJob takes the Workload with it."""
    from jobs.supervision.kueue import DEACTIVATE_TRIES

    ns = kueue_queue.namespace
    token = submitter[1]
    body = queue_job_body(
        kueue_queue, env={"KWOK_IMAGE_PULL_ERROR": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    with _deactivation_refused(kube, ns):
        job_id = submit_job(token, body, django_capture_on_commit_callbacks)
        trainjob = get_trainjob(kube, ns, f"{job_id}-1")
        refusals: list[str] = []

        def ended() -> dict[str, Any] | None:
            report = cycle.supervise()
            if "Workloads stay active" in report.error:
                refusals.append(report.error)
            data = get_job(token, job_id)
            return data if data["state"] == "failed" else None

        done = wait_for("the job failed", ended, timeout=120)
        assert len(refusals) >= DEACTIVATE_TRIES, refusals  # the fault happened, each cycle
        assert done["cause"] == "evicted", (done["cause"], done["message"])
        assert any(str(e["value"]).startswith("PodsReadyTimeout") for e in done["evidence"]), done["evidence"]
        warned = [w for w in done["supervision_warnings"] if w["kind"] == "kueue"]
        assert warned and "Workloads stay active in this namespace" in warned[0]["message"], done
        assert f"({DEACTIVATE_TRIES} tries" in warned[0]["message"]
        wl = workload_of(kube, trainjob)
        assert wl is None or wl["spec"].get("active", True), "the policy let a deactivation through"

        def gone() -> bool:
            cycle.supervise()
            return not _exists(kube, ns, f"{job_id}-1") and workload_of(kube, trainjob) is None

        wait_for("the TrainJob and its Workload gone", gone, timeout=90)


def workload_name(trainjob: dict[str, Any]) -> str:
    from tests.support.kueue import workload_name as name

    return name(trainjob["metadata"]["name"], trainjob["metadata"]["uid"])


def _exists(kube: Kube, namespace: str, name: str) -> bool:
    try:
        get_trainjob(kube, namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


# ---------------------------------------------------------------- the deactivation itself


def test_deactivation_is_a_compare_and_set_that_rereads_after_a_conflict_and_is_idempotent(
    kube: Kube, dispatch_on_cluster: str, kueue_queue: KueueQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster.kueue.deactivate_workload against the real API server. Between its read and its patch another
    writer changes the Workload (the test's own client adds an annotation, as Kueue's status writes do
    around an eviction): the patch, conditioned on the resourceVersion it read, is refused 409; it reads
    again and patches again, keeping the other writer's change. A second call (a second supervisor) finds
    it inactive and writes nothing; a Workload of another UID under that name is left alone."""
    from cluster import gateway

    ns = kueue_queue.namespace
    tj = queued_trainjob(kube, kueue_queue, "victim", env={"KWOK_STAY_RUNNING": "1"}, gpus=True)
    wl = wait_workload(kube, tj, admitted, "admitted")
    name, uid = wl["metadata"]["name"], wl["metadata"]["uid"]
    verbs: list[str] = []
    real = gateway.call_api

    def interleaved(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        verb = fn.__name__.split("_")[0]
        try:
            result = real(what, fn, *args, **kwargs)
        except Exception as exc:
            verbs.append(f"{verb}:{type(exc).__name__}")
            raise
        verbs.append(verb)
        if verbs == ["get"]:  # the other writer, between dispatch's read and its patch
            kube.custom.patch_namespaced_custom_object(
                *KUEUE, ns, "workloads", name, {"metadata": {"annotations": {"test.example/other": "1"}}}
            )
        return result

    monkeypatch.setattr(gateway, "call_api", interleaved)
    mark = {"dispatch.dev/kueue-deactivated": json.dumps({"cause": "preempted"})}
    outcome = cluster_kueue.deactivate_workload(namespace=ns, name=name, uid=uid, annotations=mark)
    assert outcome == cluster_kueue.DEACTIVATED
    assert verbs == ["get", "patch:Conflict", "get", "patch"], verbs
    now = workload_of(kube, tj) or {}
    assert now["spec"]["active"] is False
    notes = now["metadata"]["annotations"]
    assert notes["test.example/other"] == "1" and json.loads(notes[MARK]) == {"cause": "preempted"}

    verbs.clear()
    again = cluster_kueue.deactivate_workload(namespace=ns, name=name, uid=uid, annotations=mark)
    assert (again, verbs) == (cluster_kueue.ALREADY, ["get"])
    verbs.clear()
    other = cluster_kueue.deactivate_workload(namespace=ns, name=name, uid="another-uid", annotations=mark)
    assert (other, verbs) == (cluster_kueue.GONE, ["get"])


# ---------------------------------------------------------------- without Kueue


def test_without_kueue_the_workload_list_is_one_404_remembered_and_supervision_goes_on(
    kube: Kube,
    namespace: str,
    dispatch_on_cluster: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster whose API server does not serve the Workloads' group (here: the Resource pointed at a group
    no API server serves, since this plane may have Kueue's CRDs): the first cycle's list answers 404, the
    job is supervised as before with no warning and no error, and the next cycles list no Workloads at all
    (the answer is remembered for a minute)."""
    from cluster import gateway

    monkeypatch.setattr(
        gateway, "WORKLOADS", gateway.Resource("Workload", "absent.dispatch.test", "v1beta2", "workloads")
    )
    cluster_kueue.presence.forget()
    listed: list[str] = []
    real = gateway.list_objects

    def spy(resource: Any, ns: Any, **kwargs: Any) -> Any:
        if resource.kind == "Workload":
            listed.append(str(ns))
        return real(resource, ns, **kwargs)

    monkeypatch.setattr(gateway, "list_objects", spy)
    token = submitter[1]
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    try:
        job_id = submit_job(token, body, django_capture_on_commit_callbacks)
        data = supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
        assert not data.get("supervision_warnings"), data["supervision_warnings"]
        for _ in range(3):
            report = cycle.supervise()
            assert report.ran and report.error == "", report.error
        assert listed == [namespace], listed  # one 404, remembered
    finally:
        cluster_kueue.presence.forget()


def test_a_queued_job_skipped_while_its_namespace_lists_is_judged_once_the_lists_are_in(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A cycle of `manage.py supervise` skips the executions of a namespace whose informers have not all
    listed yet. A skipped execution used to leave the cycle's due set, and a queued job changes nothing by
    itself: when the last list to come in (here the Events') brought nothing of it, it waited for the full
    re-read (60 s). The Kueue bench's job took 17 s to be observed on an idle machine and over 60 s under
    load. Now it stays due, and an informer's first list wakes the supervisor. The job waits for the GPUs a
    running job holds, so Kueue does not admit it: nothing of it changes. (A job asking more than its queue
    can ever give is refused at plan now, queue-over-capacity.) The Events' first list is held back until
    released and brings nothing (a slow list the API server does not produce on demand); every other list
    is real."""
    import threading

    from cluster import gateway
    from cluster.informer import Informer
    from jobs.supervision.cache import CacheSource

    released = threading.Event()

    class EventsListLate(Informer):
        def _list(self) -> None:
            if self.resource is not gateway.EVENTS or self.synced.is_set():
                super()._list()
                return
            released.wait(30)
            keep, self._keep = self._keep, lambda event: False
            try:
                super()._list()
            finally:
                self._keep = keep

    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    holder = submit_job(
        submitter[1],
        queue_job_body(kueue_queue, resources_per_node=gpu, env={"KWOK_STAY_RUNNING": "1"}),
        django_capture_on_commit_callbacks,
    )
    wait_workload(
        kube,
        get_trainjob(kube, kueue_queue.namespace, Execution.objects.get(job_id=holder).trainjob_name),
        admitted,
        "admitted",
    )
    job_id = submit_job(
        submitter[1],
        queue_job_body(kueue_queue, resources_per_node=gpu),
        django_capture_on_commit_callbacks,
    )
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    trainjob = get_trainjob(kube, kueue_queue.namespace, execution.trainjob_name)
    wait_workload(
        kube,
        trainjob,
        lambda w: ("QuotaReserved", "False") in [c[:2] for c in conditions_summary(w)],
        "pending",
    )
    source = CacheSource(informer=EventsListLate)
    try:
        source.prepare()  # tracks the job's execution: its namespace's informers start listing
        informers = source._namespaces[kueue_queue.namespace].informers
        wait_for(
            "every list but the Events'",
            lambda: all(i.synced.is_set() for (kind, _), i in informers.items() if kind != "Event"),
        )
        cycle.supervise(source=source)
        execution.refresh_from_db()
        assert execution.observed_at is None  # skipped: its namespace was still listing
        source.wake.clear()
        released.set()
        # The cycle runs once the Events' list is in (a watch event of another informer may wake the
        # supervisor first: a cycle then would still skip the namespace, which is not what is tested here).
        events = next(i for (kind, _), i in informers.items() if kind == "Event")
        wait_for("the Events' first list", events.synced.is_set, timeout=10)
        assert source.wait(10), "the Events' first list did not wake the supervisor"
        cycle.supervise(source=source)
        execution.refresh_from_db()
        assert execution.observed_at is not None
        assert Job.objects.get(pk=job_id).state == "queued"
    finally:
        released.set()
        source.close()
