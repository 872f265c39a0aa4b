"""make bench, Kueue part (scripts/bench_kueue.py): dispatch's side, its REST API as the bench user and the
processes it runs (gunicorn, a Celery worker, `manage.py supervise`)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import celery_worker_command, gunicorn_command  # noqa: E402 - needs the repository on sys.path first
from scripts.bench_kueue_cluster import FAULT, FAULT_DELAY, POLL  # noqa: E402


class Api:
    """dispatch's REST API over one kept-alive connection, as the bench user."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, etag: str = ""
    ) -> tuple[int, dict[str, Any], str]:
        """(status, body, ETag); with `etag`, If-None-Match: a 304 (unchanged) answers an empty body."""
        headers = {"Authorization": f"Token {self.token}", "Content-Type": "application/json"}
        if etag:
            headers["If-None-Match"] = etag
        payload = json.dumps(body) if body is not None else None
        for attempt in (1, 2):
            try:
                self.conn.request(method, f"/api/v1/{path}", body=payload, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, json.loads(data or b"{}"), response.getheader("ETag") or ""
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def job(self, job_id: str, etag: str = "") -> tuple[dict[str, Any] | None, str]:
        """GET /api/v1/jobs/<id>: (the job, its ETag), or (None, etag) when unchanged since `etag`."""
        status, body, tag = self.call("GET", f"jobs/{job_id}", etag=etag)
        if status == 304:
            return None, etag
        if status != 200:
            raise RuntimeError(f"GET /api/v1/jobs/{job_id}: {status} {body}")
        return body, tag

    def state(self, job_id: str) -> str:
        body, _ = self.job(job_id)
        assert body is not None
        return str(body["state"])

    def wait_observed(self, job_id: str, timeout: float = 60) -> None:
        """Until the job reads `queued` and supervision has observed its execution (observed_at set): it
        is tracked and watched, as any job is that has waited in a queue longer than one supervision
        interval (a new execution is first tracked at the supervisor's next periodic cycle)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body, _ = self.job(job_id)
            assert body is not None
            executions = body.get("executions") or []
            if body["state"] == "queued" and executions and executions[-1].get("observed_at"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"job {job_id}: supervision did not observe it queued within {timeout} s")

    def wait_state(self, job_id: str, states: set[str], timeout: float = 90) -> tuple[float, str]:
        """Poll until the job's state is one of `states`: (the instant that answer arrived, the state). As a
        polite client polls: If-None-Match with the last ETag, so an unchanged job costs a 304."""
        deadline = time.monotonic() + timeout
        state, etag = "", ""
        while time.monotonic() < deadline:
            body, etag = self.job(job_id, etag)
            at = time.monotonic()
            if body is not None:
                state = str(body["state"])
            if state in states:
                return at, state
            if state in ("failed", "cancelled", "succeeded", "identity-violation"):
                raise RuntimeError(f"job {job_id} ended {state} while the bench waited for {states}")
            time.sleep(POLL)
        raise RuntimeError(f"job {job_id} not {states} within {timeout} s (last: {state})")


def supervisor_main(fault: str) -> None:
    """`python scripts/bench_kueue.py supervisor [slowcycle]`: `manage.py supervise`, as it runs, with the
    deliberate fault when asked (each cycle starts FAULT_DELAY seconds late)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    if fault == "slowcycle":
        from jobs.supervision import cycle

        original = cycle.supervise

        def late(*args: Any, **kwargs: Any) -> Any:
            time.sleep(FAULT_DELAY)
            return original(*args, **kwargs)

        cycle.supervise = late
    elif fault:
        sys.exit(f"unknown BENCH_KUEUE_FAULT {fault!r} (known: slowcycle)")
    if os.environ.get("BENCH_KUEUE_STATS") == "1":
        from jobs.supervision import cycle as traced

        inner = traced.supervise

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            report = inner(*args, **kwargs)
            line = {"began": began, "ended": time.monotonic(), "derived": report.derived}
            print(
                json.dumps(line | {"transitions": report.transitions, "phases": report.phases_ms}), flush=True
            )
            return report

        traced.supervise = timed
    from django.core.management import call_command

    call_command("supervise")


def start_processes(env: dict[str, str], log: Path, port: int) -> list[subprocess.Popen[bytes]]:
    """gunicorn (one threaded worker process), a Celery worker (threads) and the supervisor, all on `env`."""
    out = log.open("ab")
    commands = [
        gunicorn_command(port, workers=1),
        celery_worker_command(4, "bench-kueue@%h"),
        [sys.executable, str(REPO / "scripts" / "bench_kueue.py"), "supervisor", FAULT],
    ]
    return [
        subprocess.Popen(c, cwd=REPO, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT)
        for c in commands
    ]
