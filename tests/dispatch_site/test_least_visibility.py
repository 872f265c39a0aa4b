"""Least visibility (issue 22): a user of namespace A sees nothing of namespace B on any page.

Namespace B holds a refused job, a session, an allow-listed TrainingRuntime whose re-check refused it, and
its owner's audit rows; the supervisor's last cycle failed with an error naming B's objects, and the API
server cannot be read (its error names its address). A user granted only A walks every dashboard URL (the
URL resolver's list, B's ids in the path parameters) and every API list, and no answer names anything of B
or shows the API server's or the supervisor's error text. Before: the overview's "verdict changes" and the
refusals page listed B's runtime with its rule messages, and /overview/cluster/ showed both errors.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.services import user_create
from jobs.models import Job, JobState, Session, SupervisorCycle
from jobs.observability.models import WebhookEndpoint
from runtimes.models import AllowListEntry, RuntimeVerdict, SiteSettings
from runtimes.services import runtime_verdict_record

pytestmark = pytest.mark.django_db

B_RUNTIME = "bravo-secret-runtime"
B_RULE_MESSAGE = "bravo-rule-message-xyzzy"
SUPERVISOR_ERROR = "supervisor-error-naming-bravo-objects"
B_WEBHOOK = "https://bravo-hooks.example/receive"
B_MARKERS = [
    "team-bravo",
    B_RUNTIME,
    B_RULE_MESSAGE,
    "bravo-owner",
    SUPERVISOR_ERROR,
    "127.0.0.1:1",
    B_WEBHOOK,
    "bravo-queue",
    "bravo-urgent",
]


def _refused_verdict(name: str, namespace: str, message: str) -> dict[str, Any]:
    reason = {"code": "restart-policy", "message": message, "path": "spec", "waived": False}
    return {"refused": True, "reasons": [reason], "identity_warning": None, "capabilities": []}


@pytest.fixture
def bravo() -> dict[str, str]:
    owner, _ = user_create(
        username="bravo-owner", role=roles.USER, namespaces=["team-bravo"], password="pw-b0b0b0b0b0"
    )
    job = Job.objects.create(
        owner=owner,
        namespace="team-bravo",
        display_name="bravo-job",
        runtime_kind="TrainingRuntime",
        runtime_namespace="team-bravo",
        runtime_name=B_RUNTIME,
        spec={"namespace": "team-bravo"},
        state=JobState.REFUSED,
        reasons=[{"code": "restart-policy", "message": B_RULE_MESSAGE, "path": "spec"}],
    )
    session = Session.objects.create(
        owner=owner,
        namespace="team-bravo",
        name="bravo-session",
        runtime_kind="TrainingRuntime",
        runtime_namespace="team-bravo",
        runtime_name=B_RUNTIME,
        image="img",
        timeout_seconds=60,
        trainer_replicated_job="node",
    )
    AllowListEntry.objects.create(
        kind="TrainingRuntime", namespace="team-bravo", name=B_RUNTIME, for_sessions=True
    )
    body = {"metadata": {"name": B_RUNTIME, "namespace": "team-bravo"}}
    # The re-check's history: accepted, then refused (a verdict change on the overview).
    accepted: dict[str, Any] = {"refused": False, "reasons": [], "identity_warning": None, "capabilities": []}
    for number, verdict in enumerate((accepted, _refused_verdict(B_RUNTIME, "team-bravo", B_RULE_MESSAGE))):
        RuntimeVerdict.objects.create(
            kind="TrainingRuntime",
            namespace="team-bravo",
            name=B_RUNTIME,
            refused=bool(verdict["refused"]),
            verdict=verdict,
            runtime=body,
            resource_version=str(number),
        )
    audit_record(actor=owner, action="session.open", object_type="session", object_id=session.id, details={})
    SupervisorCycle.objects.update_or_create(
        name="supervisor",
        defaults={"finished_at": timezone.now(), "error": SUPERVISOR_ERROR},
    )
    # B's Kueue settings (issue 33: GET /api/v1/settings and the settings page showed every namespace's).
    SiteSettings.objects.update_or_create(
        pk=1,
        defaults={
            "kueue_default_queues": {"team-bravo": "bravo-queue", "team-alpha": "alpha-queue", "*": "shared"},
            "kueue_priority_classes": {"team-bravo": ["bravo-urgent"], "*": ["low"]},
        },
    )
    endpoint = WebhookEndpoint.objects.create(
        owner=owner, url=B_WEBHOOK, namespace="team-bravo", secret="whsec_" + "b" * 32
    )
    return {"job": job.id, "session": session.id, "runtime": B_RUNTIME, "endpoint": str(endpoint.pk)}


def _dashboard_paths(ids: dict[str, str]) -> list[str]:
    """Every dashboard URL, its parameters filled with B's objects."""
    values = {
        "job_id": ids["job"],
        "session_id": ids["session"],
        "kind": "TrainingRuntime",
        "namespace": "team-bravo",
        "name": ids["runtime"],
        "token_id": "1",
        "endpoint_id": ids["endpoint"],
        "action": "pause",
    }
    paths = []

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            route = str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + route)
                continue
            path = prefix + route
            for key, value in values.items():
                for converter in ("str", "int"):
                    path = path.replace(f"<{converter}:{key}>", value)
            assert "<" not in path, path
            paths.append("/" + path)

    resolver = get_resolver()
    dashboard = next(p for p in resolver.url_patterns if getattr(p, "namespace", "") == "dashboard")
    assert isinstance(dashboard, URLResolver)
    walk(dashboard.url_patterns, "")
    return paths


def _shows_bravo(content: bytes) -> list[str]:
    text = content.decode(errors="replace")
    return [marker for marker in B_MARKERS if marker in text]


def test_a_user_of_namespace_a_sees_nothing_of_namespace_b_on_any_page(
    client: Client, bravo: dict[str, str]
) -> None:
    user_create(username="alpha-user", role=roles.USER, namespaces=["team-alpha"], password="pw-alpha-alpha")
    assert client.login(username="alpha-user", password="pw-alpha-alpha")
    paths = _dashboard_paths(bravo)
    assert len(paths) >= 15, paths
    for path in paths:
        for query in ("", "?window=7d", "?code=restart-policy", "?namespace=team-bravo"):
            response = client.get(path + query)
            assert response.status_code in (200, 302, 403, 404, 405), (path, response.status_code)
            # (a filter form echoes the namespace asked for: that is the user's own input, not B's)
            shown = [
                m for m in _shows_bravo(response.content) if not (query.endswith(m) and m == "team-bravo")
            ]
            assert shown == [], (path + query, shown)
        response = client.post(path)  # the forms: close, cancel, revoke, allow-list, settings
        assert response.status_code < 500, (path, response.status_code)
        assert _shows_bravo(response.content) == [], (path, _shows_bravo(response.content))
    # B's objects are untouched by A's posts.
    assert Session.objects.get(pk=bravo["session"]).state == "starting"
    assert Job.objects.get(pk=bravo["job"]).state == JobState.REFUSED
    assert WebhookEndpoint.objects.get(pk=bravo["endpoint"]).active


def test_the_api_lists_show_nothing_of_namespace_b(bravo: dict[str, str], make_user: Any) -> None:
    _, token = make_user("alpha-api", roles.USER, ("team-alpha",))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    for path in (
        "/api/v1/jobs",
        "/api/v1/sessions",
        "/api/v1/runtimes",
        "/api/v1/audit",
        "/api/v1/tokens",
        "/api/v1/me",
        "/api/v1/settings",
        f"/api/v1/jobs/{bravo['job']}",
        f"/api/v1/sessions/{bravo['session']}",
        f"/api/v1/runtimes/TrainingRuntime/team-bravo/{B_RUNTIME}",
        "/api/v1/events",
        "/api/v1/webhooks",
        f"/api/v1/webhooks/{bravo['endpoint']}",
    ):
        response = api.get(path)
        assert _shows_bravo(response.content) == [], (path, _shows_bravo(response.content))


def test_a_user_reads_the_settings_of_their_own_namespaces_and_the_default(
    bravo: dict[str, str], make_user: Any
) -> None:
    _, token = make_user("alpha-settings", roles.USER, ("team-alpha",))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    seen = api.get("/api/v1/settings").json()
    assert seen["kueue_default_queues"] == {"team-alpha": "alpha-queue", "*": "shared"}
    assert seen["kueue_priority_classes"] == {"*": ["low"]}
    assert SiteSettings.load().kueue_default_queues["team-bravo"] == "bravo-queue"  # nothing was written


def test_the_platform_role_still_sees_namespace_b_and_the_errors(
    client: Client, bravo: dict[str, str], platform_user: tuple[User, str]
) -> None:
    """The control: the same pages show B's runtime and both errors to the platform role."""
    assert client.login(username="pat", password="pw-pat")
    home = client.get("/").content.decode()
    assert B_RUNTIME in home and SUPERVISOR_ERROR in home
    cluster = client.get("/overview/cluster/").content.decode()
    assert "127.0.0.1:1" in cluster and SUPERVISOR_ERROR in cluster
    assert B_RULE_MESSAGE in client.get("/refusals/").content.decode()
    assert "bravo-queue" in client.get("/settings/").content.decode()


def test_refusals_for_runtime_names_that_do_not_exist_make_no_verdict_changes(
    client: Client, platform_user: tuple[User, str]
) -> None:
    """Every typo (or fuzzed name) put on the allow-list and re-checked recorded a "runtime-not-found" verdict
    that the overview listed as a verdict change. A runtime that never existed changes nothing now; one that
    existed and went away still shows."""
    for name in ("typo-runtime-qwerty", "fuzzed-runtime-zzz"):
        AllowListEntry.objects.create(kind="ClusterTrainingRuntime", namespace="", name=name, for_jobs=True)
        not_found = {
            "refused": True,
            "reasons": [
                {"code": "runtime-not-found", "message": "x", "path": "metadata.name", "waived": False}
            ],
            "identity_warning": None,
            "capabilities": [],
        }
        runtime_verdict_record(
            kind="ClusterTrainingRuntime",
            namespace="",
            name=name,
            runtime=None,
            verdict=not_found,
            previous=None,
        )
    assert client.login(username="pat", password="pw-pat")
    home = client.get("/").content.decode()
    assert "typo-runtime-qwerty" not in home and "fuzzed-runtime-zzz" not in home
