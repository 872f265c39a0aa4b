"""Long requests cannot take the web tier down (issue 22): a real gunicorn started exactly as `make up` starts
it (`gunicorn -c dispatch_site/gunicorn.conf.py`, here with 1 process of 6 threads, 3 long-request slots per
process and 2 per user), real execs (`sleep`) into real sessions on the local control plane.

N + 1 long requests from one user: N run, the next is a 429 with Retry-After. Another user's long requests
take the process's last slot, and the one after is a 503 with Retry-After. Meanwhile /healthz and a plan
answer within 1 s. Before (sync workers, `nproc + 1` of them in `make up`), the long requests held every
worker and /healthz went unanswered until they ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth.models import User

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Session, SessionState
from jobs.sessions import services
from jobs.sessions.rules import SessionRequest
from jobs.spec import RuntimeRef
from runtimes.models import AllowListEntry
from tests.client.conftest import BIN, Process, free_port, service_env, start_process
from tests.jobs.sessions.test_sessions import IMAGE, plain_runtime
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

PER_USER, PER_PROCESS, THREADS = 2, 3, 6
LONG_SECONDS = 12  # each long request runs `sleep` this long


@pytest.fixture
def web(kubeconfig: str, tmp_path: Path) -> Iterator[str]:
    env = service_env(kubeconfig) | {
        "WEB_WORKERS": "1",
        "WEB_THREADS": str(THREADS),
        "LONG_REQUESTS_PER_PROCESS": str(PER_PROCESS),
        "LONG_REQUESTS_PER_USER": str(PER_USER),
        "WEB_WORKER_TMP_DIR": str(tmp_path),
    }
    port = free_port()
    # The command scripts/up runs (its --bind names the port); the config file is the image's and deploy's.
    server: Process = start_process(
        "web",
        [str(BIN / "gunicorn"), "-c", "dispatch_site/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}"],
        env,
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{url}/healthz"), timeout=60, what=f"gunicorn up:\n{server.tail()}")
        yield url
    finally:
        server.stop()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _user(name: str, namespace: str) -> tuple[User, str]:
    return user_create(username=name, role=roles.USER, namespaces=[namespace], password=f"pw-{name}-long")


def _running_session(owner: User, namespace: str, runtime: str, name: str) -> Session:
    request = SessionRequest(
        runtime=RuntimeRef(kind="TrainingRuntime", name=runtime, namespace=namespace),
        namespace=namespace,
        image=IMAGE,
        num_nodes=1,
        name=name,
    )
    session = services.session_wait(session=services.session_open(owner=owner, request=request), seconds=90)
    assert session.state == SessionState.RUNNING, session.message
    return session


def _slots_held(user: User) -> int:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(client.zcard(f"dispatch-long:{settings.LONG_REQUESTS_KEY_PREFIX}:user:{user.pk}"))
    finally:
        client.close()


def _clear_slots(*users: User) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for user in users:  # a run killed earlier may have left slots of a user with the same pk
            client.delete(f"dispatch-long:{settings.LONG_REQUESTS_KEY_PREFIX}:user:{user.pk}")
    finally:
        client.close()


def test_n_plus_one_long_requests_leave_the_probes_and_a_plan_answering_within_a_second(
    kube: Any, namespace: str, dispatch_on_cluster: str, web: str
) -> None:
    runtime = plain_runtime(kube, namespace)
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    alice, alice_token = _user(f"alice-{namespace[-6:]}", namespace)
    bob, bob_token = _user(f"bob-{namespace[-6:]}", namespace)
    _, carol_token = _user(f"carol-{namespace[-6:]}", namespace)
    _clear_slots(alice, bob)
    alices = _running_session(alice, namespace, runtime, "alice")
    bobs = _running_session(bob, namespace, runtime, "bob")

    results: dict[str, requests.Response] = {}

    def long_exec(name: str, token: str, session_id: str) -> threading.Thread:
        def run() -> None:
            results[name] = requests.post(
                f"{web}/api/v1/sessions/{session_id}/exec",
                json={"command": ["sleep", str(LONG_SECONDS)], "timeout_seconds": 120},
                headers={"Authorization": f"Token {token}"},
                timeout=120,
            )

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    # Alice's N long requests run (their slots held: the state that shows them in flight) ...
    running = [long_exec(f"alice-{i}", alice_token, alices.id) for i in range(PER_USER)]
    wait_for(lambda: _slots_held(alice) == PER_USER, timeout=30, what="alice's long requests in flight")
    # ... her N + 1st is refused at once, with Retry-After.
    started = time.monotonic()
    refused = requests.post(
        f"{web}/api/v1/sessions/{alices.id}/exec",
        json={"command": ["true"]},
        headers={"Authorization": f"Token {alice_token}"},
        timeout=5,
    )
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    assert time.monotonic() - started < 1.0
    # Bob takes the process's last long-request slot; the next long request of anyone is a 503.
    running.append(long_exec("bob-0", bob_token, bobs.id))
    wait_for(lambda: _slots_held(bob) == 1, timeout=30, what="bob's long request in flight")
    busy = requests.post(
        f"{web}/api/v1/sessions/{bobs.id}/exec",
        json={"command": ["true"]},
        headers={"Authorization": f"Token {bob_token}"},
        timeout=5,
    )
    assert busy.status_code == 503, busy.text
    assert int(busy.headers["Retry-After"]) >= 1

    # While every long-request slot is taken: the probes and a plan answer, each within a second.
    plan_body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": IMAGE,
        "num_nodes": 1,
    }
    as_carol = {"Authorization": f"Token {carol_token}"}
    for _ in range(3):
        for method, path, body in (
            ("get", "/healthz", None),
            ("get", "/readyz", None),
            ("post", "/api/v1/plan", plan_body),
        ):
            started = time.monotonic()
            answer = requests.request(method, f"{web}{path}", json=body, headers=as_carol, timeout=5)
            took = time.monotonic() - started
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
            assert took < 1.0, f"{path} took {took:.2f}s while long requests ran"
        assert all(t.is_alive() for t in running)  # the long requests were still running throughout

    for thread in running:
        thread.join(120)
    for name in ("alice-0", "alice-1", "bob-0"):
        assert results[name].status_code == 200, results[name].text
        assert results[name].json()["returncode"] == 0
    assert _slots_held(alice) == _slots_held(bob) == 0  # every slot given back
    for session in (alices, bobs):
        services.session_close(actor=session.owner, session=session)
        services.session_wait(session=session, seconds=60, closing=True)
