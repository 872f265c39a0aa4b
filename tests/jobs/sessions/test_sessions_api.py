"""Sessions over REST without a cluster (an unreachable API server): validation, grants, the allow-list
purpose, visibility, who may execute and close, and the 409s of a session that is not running.
tests/jobs/sessions/test_sessions.py opens real sessions and runs real commands."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from dispatch_site.audit import audit_record
from dispatch_site.models import AuditEvent
from jobs.models import Session, SessionState
from runtimes.models import AllowListEntry

pytestmark = pytest.mark.django_db

RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"}
VALID = {"runtime": RUNTIME, "namespace": "team-a", "image": "localhost/trainer:1", "num_nodes": 1}


def _session(owner: User, state: str = SessionState.RUNNING, **fields: Any) -> Session:
    values = {
        "owner": owner,
        "namespace": "team-a",
        "runtime_kind": "ClusterTrainingRuntime",
        "runtime_name": "dispatch-kind",
        "image": "localhost/trainer:1",
        "timeout_seconds": 60,
        "trainer_replicated_job": "node",
        "state": state,
        "pod": "sx-node-0-0-abcde" if state == SessionState.RUNNING else "",
    } | fields
    session = Session(**values)
    session.name = fields.get("name", session.id)
    session.save()
    return session


@pytest.mark.parametrize(
    ("body", "errors_at"),
    [
        (VALID | {"colour": "red"}, ["colour"]),
        (VALID | {"num_nodes": 0}, ["num_nodes"]),
        (VALID | {"namespace": "Team_A"}, ["namespace"]),
        (VALID | {"name": "9lives"}, ["name"]),
        (VALID | {"name": "Upper"}, ["name"]),
        (VALID | {"command": []}, ["command"]),
        (VALID | {"command": "sleep infinity"}, ["command"]),
        (VALID | {"timeout_seconds": 0}, ["timeout_seconds"]),
        (VALID | {"env": {"DISPATCH_ATTEMPT": "7"}}, ["env"]),
        (VALID | {"runtime": {"kind": "TrainingRuntime", "name": "r", "namespace": "other"}}, ["runtime"]),
        ({"namespace": "team-a"}, ["runtime", "image"]),
    ],
)
def test_bad_open_request_is_400_with_field_errors_and_records_nothing(
    user_api: APIClient, body: Any, errors_at: list[str]
) -> None:
    response = user_api.post("/api/v1/sessions", body, format="json")
    assert response.status_code == 400, response.content
    assert sorted(response.json()) == sorted(errors_at)
    assert not Session.objects.exists()


@pytest.mark.parametrize("wait", ["soon", "-1", "301"])
def test_a_wait_that_is_not_0_to_300_seconds_is_400(user_api: APIClient, wait: str) -> None:
    response = user_api.post(f"/api/v1/sessions?wait={wait}", VALID, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["wait"]


def test_an_ungranted_namespace_is_403(user_api: APIClient) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_sessions=True)
    response = user_api.post("/api/v1/sessions", VALID | {"namespace": "team-b"}, format="json")
    assert response.status_code == 403, response.content
    assert "team-b" in response.json()["detail"]
    assert not Session.objects.exists()


def test_a_runtime_listed_for_jobs_only_is_422_saying_so_even_with_the_cluster_down(
    user_api: APIClient,
) -> None:
    AllowListEntry.objects.create(
        kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True, for_sessions=False
    )
    response = user_api.post("/api/v1/sessions", VALID, format="json")
    assert response.status_code == 422, response.content
    body = response.json()
    assert [r["code"] for r in body["reasons"]] == ["runtime-not-allowed"]
    assert "for jobs only, not for sessions" in body["reasons"][0]["message"]
    assert not Session.objects.exists()
    assert AuditEvent.objects.filter(action="session.refuse").count() == 1


def test_an_allowed_runtime_with_the_cluster_down_is_503_naming_the_api_server(user_api: APIClient) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_sessions=True)
    response = user_api.post("/api/v1/sessions", VALID, format="json")
    assert response.status_code == 503, response.content
    assert "Kubernetes API server" in response.json()["detail"]
    assert "127.0.0.1:1" in response.json()["detail"]
    assert not Session.objects.exists()


def test_users_list_their_own_sessions_and_platform_and_oncall_list_all(
    user_api: APIClient,
    platform_api: APIClient,
    oncall_api: APIClient,
    plain_user: tuple[User, str],
    make_user: Any,
) -> None:
    other, _ = make_user("otto", namespaces=("team-a",))
    mine = _session(plain_user[0])
    theirs = _session(other)
    assert [s["id"] for s in user_api.get("/api/v1/sessions").json()["results"]] == [mine.id]
    for api in (platform_api, oncall_api):
        ids = {s["id"] for s in api.get("/api/v1/sessions").json()["results"]}
        assert ids == {mine.id, theirs.id}
    assert user_api.get(f"/api/v1/sessions/{theirs.id}").status_code == 404
    detail = user_api.get(f"/api/v1/sessions/{mine.id}").json()
    assert detail["state"] == "running"
    assert detail["trainjob_name"] == mine.name
    assert detail["pod"] == "sx-node-0-0-abcde"
    assert detail["container"] == "node"


@pytest.mark.parametrize("command", ["", "   ", [], [""], 7, ["ls", 3], "echo \u0000", ["echo", "a\u0000"]])
def test_an_empty_or_malformed_command_is_400(
    user_api: APIClient, plain_user: tuple[User, str], command: Any
) -> None:
    session = _session(plain_user[0])
    response = user_api.post(f"/api/v1/sessions/{session.id}/exec", {"command": command}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["command"]
    assert not AuditEvent.objects.filter(action="session.exec").exists()


def test_a_container_that_is_not_a_container_name_is_400(
    user_api: APIClient, plain_user: tuple[User, str]
) -> None:
    session = _session(plain_user[0])
    response = user_api.post(
        f"/api/v1/sessions/{session.id}/exec", {"command": "true", "container": "Node"}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "DNS-1123" in str(response.json()["container"])


def test_platform_may_read_a_session_but_only_its_owner_executes(
    platform_api: APIClient, plain_user: tuple[User, str]
) -> None:
    session = _session(plain_user[0])
    assert platform_api.get(f"/api/v1/sessions/{session.id}").status_code == 200
    response = platform_api.post(f"/api/v1/sessions/{session.id}/exec", {"command": "id"}, format="json")
    assert response.status_code == 403, response.content
    assert "uma" in response.json()["detail"]
    assert not AuditEvent.objects.filter(action="session.exec").exists()
    assert not AuditEvent.objects.filter(action="session.exec").exists()


@pytest.mark.parametrize("state", [SessionState.STARTING, SessionState.FAILED, SessionState.CLOSED])
def test_executing_in_a_session_that_is_not_running_is_409_with_its_state(
    user_api: APIClient, plain_user: tuple[User, str], state: str
) -> None:
    session = _session(plain_user[0], state=state, message="something to say")
    response = user_api.post(f"/api/v1/sessions/{session.id}/exec", {"command": ["true"]}, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["state"] == state
    assert state in response.json()["detail"]


def test_closing_a_closed_session_again_is_harmless(
    user_api: APIClient, plain_user: tuple[User, str]
) -> None:
    session = _session(plain_user[0], state=SessionState.CLOSED)
    response = user_api.delete(f"/api/v1/sessions/{session.id}")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "closed"
    assert not AuditEvent.objects.filter(action="session.close").exists()


def test_only_owner_oncall_and_platform_close_and_others_do_not_see_it(
    user_api: APIClient, oncall_api: APIClient, make_user: Any
) -> None:
    other, _ = make_user("otto", namespaces=("team-a",))
    session = _session(other, state=SessionState.CLOSED)
    assert user_api.delete(f"/api/v1/sessions/{session.id}").status_code == 404
    assert oncall_api.delete(f"/api/v1/sessions/{session.id}").status_code == 200


def test_the_schema_documents_the_session_endpoints(client: Client) -> None:
    schema = yaml.safe_load(client.get("/api/schema/").content)
    for path in ("/api/v1/sessions", "/api/v1/sessions/{session_id}", "/api/v1/sessions/{session_id}/exec"):
        assert path in schema["paths"], path
    exec_ok = schema["paths"]["/api/v1/sessions/{session_id}/exec"]["post"]["responses"]["200"]
    assert exec_ok["content"]["application/json"]["schema"]["$ref"].endswith("/ExecResult")


# ---------------------------------------------------------------- dashboard pages


def _page_client(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_the_sessions_page_lists_what_the_user_may_see(plain_user: tuple[User, str], make_user: Any) -> None:
    other, _ = make_user("otto", namespaces=("team-a",))
    mine = _session(plain_user[0], pod="mine-node-0-0-aaaaa")
    theirs = _session(other)
    page = _page_client(plain_user[0]).get("/sessions/").content.decode()
    assert mine.id in page and "mine-node-0-0-aaaaa" in page
    assert theirs.id not in page
    assert 'href="/sessions/"' in page  # the nav link


def test_a_session_page_shows_the_trainer_pod_and_each_command_with_its_return_code(
    plain_user: tuple[User, str],
) -> None:
    session = _session(plain_user[0])
    for command, code in (("exit 3", 3), (["true"], 0)):
        audit_record(
            actor=plain_user[0],
            action="session.exec",
            object_type="session",
            object_id=session.id,
            details={"pod": session.pod, "container": "node", "command": command, "returncode": code},
        )
    page = _page_client(plain_user[0]).get(f"/sessions/{session.id}/").content.decode()
    assert session.pod in page
    assert 'data-returncode="3"' in page and 'data-returncode="0"' in page
    assert "exit 3" in page
    assert 'id="session-close"' in page


def test_closing_from_the_page_needs_the_csrf_token_and_is_audited(plain_user: tuple[User, str]) -> None:
    session = _session(plain_user[0])
    client = _page_client(plain_user[0], csrf=True)
    assert client.post(f"/sessions/{session.id}/close/").status_code == 403
    session.refresh_from_db()
    assert session.state == SessionState.RUNNING
    page = client.get(f"/sessions/{session.id}/").content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    response = client.post(f"/sessions/{session.id}/close/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    session.refresh_from_db()
    # The API server cannot be reached here: the session waits in closing for its TrainJob to go.
    assert session.state == SessionState.CLOSING
    event = AuditEvent.objects.get(action="session.close")
    assert (event.actor_name, event.object_id) == ("uma", session.id)


def test_a_session_page_of_someone_else_is_404(plain_user: tuple[User, str], make_user: Any) -> None:
    other, _ = make_user("otto", namespaces=("team-a",))
    session = _session(other)
    client = _page_client(plain_user[0])
    assert client.get(f"/sessions/{session.id}/").status_code == 404
    assert client.post(f"/sessions/{session.id}/close/").status_code == 404


@pytest.mark.parametrize("body", [{}, {"command": []}, {"command": ["true"], "timeout_seconds": 0}])
def test_an_exec_body_with_field_errors_is_the_400_the_schema_documents(
    user_api: APIClient, plain_user: tuple[User, str], body: Any
) -> None:
    """An outside schemathesis run found this 400 documented only as {detail, state} (the exec refused),
    while a body with field errors answers DRF's field errors: the schema now says either."""
    session = _session(plain_user[0])
    response = user_api.post(f"/api/v1/sessions/{session.id}/exec", body, format="json")
    assert response.status_code == 400, response.content
    spec = SchemaGenerator().get_schema(request=None, public=True)
    documented = spec["paths"]["/api/v1/sessions/{session_id}/exec"]["post"]["responses"]["400"]
    schema = documented["content"]["application/json"]["schema"] | {"components": spec["components"]}
    jsonschema_rs.Draft202012Validator(schema).validate(response.json())
