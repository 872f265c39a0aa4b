"""The change feed (GET /api/v1/events): every change of the jobs a caller may see, in commit order, after a
cursor; and the outbox rows (jobs.observability.models.Change) the signals write in the same transaction."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from rest_framework.test import APIClient

from dispatch_site import roles
from jobs.models import Job, JobEvent, JobState
from jobs.naming import new_job_id
from jobs.observability import cursors, feed
from jobs.observability.models import Change
from jobs.submission import records

pytestmark = pytest.mark.django_db(transaction=True)


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _events(api: APIClient, **params: Any) -> dict[str, Any]:
    response = api.get("/api/v1/events", params)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def people(make_user: Any) -> dict[str, tuple[User, str]]:
    return {
        "uma": make_user("uma", roles.USER, ("team-a",)),
        "bob": make_user("bob", roles.USER, ("team-b",)),
        "olive": make_user("olive", roles.ONCALL),
    }


def make_job(owner: User, *, state: str = JobState.PENDING, namespace: str = "team-a") -> Job:
    """A job row as submission writes it (no timeline entry for an accepted one; its row is the entry, and its
    Change is inserted with it)."""
    job = Job(
        id=new_job_id(),
        owner=owner,
        namespace=namespace,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec={"runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"}, "namespace": namespace},
        state=state,
    )
    records.insert_together(job)
    return job


def _transition(job: Job, old: str, new: str, **fields: Any) -> JobEvent:
    Job.objects.filter(pk=job.pk).update(state=new)
    return JobEvent.objects.create(
        job_id=job.pk,
        attempt=1,
        kind="transition",
        from_state=old,
        to_state=new,
        message=f"{old} → {new}",
        **fields,
    )


def test_a_submission_and_each_transition_is_in_the_feed_in_order(
    people: dict[str, tuple[User, str]],
) -> None:
    uma, token = people["uma"]
    job = make_job(uma, state=JobState.PENDING)
    _transition(job, "pending", "queued")
    _transition(
        job,
        "queued",
        "failed",
        cause="app-error",
        details={"evidence": [{"object": "Pod team-a/p", "field": "exitCode", "value": 3, "at": None}]},
    )
    body = _events(_api(token))
    kinds = [(e["kind"], e["from_state"], e["to_state"], e["cause"]) for e in body["events"]]
    assert kinds == [
        ("submitted", "", "pending", ""),
        ("transition", "pending", "queued", ""),
        ("transition", "queued", "failed", "app-error"),
    ]
    assert [e["type"] for e in body["events"]] == ["job.state_changed"] * 3
    assert body["events"][-1]["evidence"] == [
        {"object": "Pod team-a/p", "field": "exitCode", "value": "3", "at": ""}
    ]
    assert body["cursor"] == body["events"][-1]["cursor"] and body["more"] is False
    # Reading on from the cursor: nothing new, the cursor stays.
    again = _events(_api(token), after=body["cursor"])
    assert again == {"events": [], "cursor": body["cursor"], "more": False}


def test_a_refused_submission_names_its_reason_codes(people: dict[str, tuple[User, str]]) -> None:
    uma, token = people["uma"]
    reasons = [{"code": "restart-policy", "message": "restartPolicy: OnFailure", "waived": False}]
    job = Job.objects.create(
        id=new_job_id(),
        owner=uma,
        namespace="team-a",
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="bad",
        spec={},
        state=JobState.REFUSED,
        reasons=reasons,
    )
    JobEvent.objects.create(
        job=job, kind="refused", message="refused: restart-policy", details={"reasons": reasons}
    )
    (event,) = _events(_api(token))["events"]
    assert (event["kind"], event["from_state"], event["to_state"]) == ("refused", "", "refused")
    assert event["reasons"] == ["restart-policy"]


def test_each_caller_sees_the_changes_of_the_jobs_they_may_see(people: dict[str, tuple[User, str]]) -> None:
    uma, uma_token = people["uma"]
    bob, bob_token = people["bob"]
    mine = make_job(uma, state=JobState.PENDING)
    theirs = make_job(bob, state=JobState.PENDING, namespace="team-b")
    assert {e["job"] for e in _events(_api(uma_token))["events"]} == {mine.pk}
    assert {e["job"] for e in _events(_api(bob_token))["events"]} == {theirs.pk}
    assert {e["job"] for e in _events(_api(people["olive"][1]))["events"]} == {mine.pk, theirs.pk}
    # ?job= narrows to one job, and someone else's job id shows nothing.
    assert {e["job"] for e in _events(_api(people["olive"][1]), job=mine.pk)["events"]} == {mine.pk}
    assert _events(_api(uma_token), job=theirs.pk)["events"] == []


def test_after_now_limit_and_bad_cursors(people: dict[str, tuple[User, str]], anon_api: APIClient) -> None:
    uma, token = people["uma"]
    for _ in range(3):
        make_job(uma, state=JobState.PENDING)
    now = _events(_api(token), after="now")
    newest = Change.objects.order_by("-seq").first()
    assert newest is not None and newest.seq is not None
    assert now["events"] == [] and cursors.unseal(now["cursor"], uma.pk) == newest.seq
    later = make_job(uma, state=JobState.PENDING)
    assert [e["job"] for e in _events(_api(token), after=now["cursor"])["events"]] == [later.pk]
    first = _events(_api(token), limit=2)
    assert len(first["events"]) == 2 and first["more"] is True
    rest = _events(_api(token), after=first["cursor"], limit=2)
    assert len(rest["events"]) == 2 and rest["more"] is False
    for bad in ("abc", "-1", "1" * 30, "5"):
        response = _api(token).get("/api/v1/events", {"after": bad})
        assert response.status_code == 400 and "after" in response.json()
    # Shaped like a cursor, but none handed to this user: a valid request dispatch cannot honour.
    forged = _api(token).get("/api/v1/events", {"after": "A" * 22})
    assert forged.status_code == 422 and "not a cursor this feed handed you" in forged.json()["detail"]
    for bad in ("0", "1001", "x"):
        assert _api(token).get("/api/v1/events", {"limit": bad}).status_code == 400
    assert anon_api.get("/api/v1/events").status_code == 401


def test_a_change_that_commits_after_a_later_one_is_not_skipped(people: dict[str, tuple[User, str]]) -> None:
    """The commit-order gap: transaction A inserts its change first (the lower id) but commits last. A reader
    that had already moved its cursor past B's change must still get A's. A is held open by a paused thread,
    and pg_stat_activity shows it idle in its transaction while B commits and the reader reads."""
    uma, token = people["uma"]
    job = make_job(uma, state=JobState.QUEUED)
    api = _api(token)
    start = _events(api, after="now")["cursor"]
    inserted, release = threading.Event(), threading.Event()
    a_row: dict[str, Any] = {}

    def transaction_a() -> None:
        try:
            with transaction.atomic():
                event = JobEvent.objects.create(
                    job_id=job.pk, attempt=1, kind="attempt", message="A: inserted first, committed last"
                )
                a_row["change"] = Change.objects.get(event_id=event.pk).pk
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    a_row["pid"] = cursor.fetchone()[0]
                inserted.set()
                assert release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=transaction_a)
    thread.start()
    try:
        assert inserted.wait(30)
        b_event = JobEvent.objects.create(
            job_id=job.pk, attempt=1, kind="attempt", message="B: committed first"
        )
        b_change = Change.objects.get(event_id=b_event.pk).pk
        assert b_change > a_row["change"]  # B has the later id ...
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [a_row["pid"]])
            assert cursor.fetchone()[0] == "idle in transaction"  # ... and A has not committed
        first = _events(api, after=start)
        assert [e["message"] for e in first["events"]] == ["B: committed first"]
    finally:
        release.set()
        thread.join(30)
    second = _events(api, after=first["cursor"])
    assert [e["message"] for e in second["events"]] == ["A: inserted first, committed last"]
    assert cursors.unseal(second["cursor"], uma.pk) > cursors.unseal(first["cursor"], uma.pk)


def test_the_sequencer_numbers_only_committed_rows_in_id_order(people: dict[str, tuple[User, str]]) -> None:
    uma, _ = people["uma"]
    jobs = [make_job(uma, state=JobState.PENDING) for _ in range(5)]
    assert Change.objects.filter(seq__isnull=True).count() == 5
    assert feed.sequence() == 5
    assert feed.sequence() == 0
    ordered = list(Change.objects.order_by("seq").values_list("job_id", flat=True))
    assert ordered == [j.pk for j in jobs]


def test_a_cursor_says_nothing_of_other_teams_activity(people: dict[str, tuple[User, str]]) -> None:
    """The feed's positions are one platform-wide counter. Handed out as numbers, ?after=now and the gaps
    between a user's own changes told anyone how busy every other team is (issue 33). Cursors are sealed:
    while bob's team makes 50 changes, uma's cursor from 'now' and her own changes' cursors carry no count
    of them, and a number, or a cursor sealed for bob, is not hers to read from."""
    uma, uma_token = people["uma"]
    bob, bob_token = people["bob"]
    mine = make_job(uma, state=JobState.PENDING)
    before = _events(_api(uma_token), after="now")["cursor"]
    for _ in range(25):
        make_job(bob, state=JobState.PENDING, namespace="team-b")
    after_bob = _events(_api(uma_token), after="now")["cursor"]
    _transition(mine, "pending", "queued")
    own = _events(_api(uma_token))["events"]
    shown = [before, after_bob, *(e["cursor"] for e in own)]
    for cursor in shown:
        assert len(cursor) == cursors.LENGTH and not cursor.isdigit(), cursor
    # The same position, sealed for another user, is another string and no cursor of hers.
    bobs_now = _events(_api(bob_token), after="now")["cursor"]
    assert bobs_now != after_bob
    refused = _api(uma_token).get("/api/v1/events", {"after": bobs_now})
    assert refused.status_code == 422 and "not a cursor this feed handed you" in refused.json()["detail"]
    # A bare position is refused: a user cannot probe where her own changes sit on the platform's counter.
    seq = Change.objects.filter(job=mine).order_by("seq").first()
    assert seq is not None
    assert _api(uma_token).get("/api/v1/events", {"after": str(seq.seq)}).status_code == 400
    # Her own cursors still read on exactly where they should.
    assert [e["job"] for e in _events(_api(uma_token), after=before)["events"]] == [mine.pk]
