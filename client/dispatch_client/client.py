"""``Client``: the dispatch REST API from Python, and ``Session``: an interactive session in a TrainJob.

from dispatch_client import Client

client = Client("http://127.0.0.1:8000", token)            # or DISPATCH_URL / DISPATCH_TOKEN
job = client.start(runtime="dispatch-kind", namespace="team-a", image="localhost/trainer:v1", num_nodes=2)
client.wait(job.id, "running", timeout=600)

with client.connect(runtime="mpi-interactive", image="local/mpi:v1", num_nodes=4) as session:
    print(session.execute(["mpirun", "hostname"]).stdout)
"""

from __future__ import annotations

import http.client
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import requests

from dispatch_client.errors import (
    ConnectionFailed,
    DispatchError,
    ExecTimedOut,
    JobEnded,
    NotFound,
    SessionNotRunning,
    error_for,
)
from dispatch_client.models import (
    TERMINAL_JOB_STATES,
    ExecResult,
    Job,
    JobChange,
    JobLog,
    Plan,
    Runtime,
    RuntimeList,
    RuntimeRef,
    SessionInfo,
)

logger = logging.getLogger("dispatch_client")

URL_ENV = "DISPATCH_URL"
TOKEN_ENV = "DISPATCH_TOKEN"
NAMESPACE_ENV = "DISPATCH_NAMESPACE"
DEFAULT_URL = "http://127.0.0.1:8000"
# (connect, read) seconds for one request; a long-polling call adds its wait to the read timeout.
DEFAULT_TIMEOUT = (5.0, 60.0)
SESSION_DONE_STATES = frozenset({"closed"})
RuntimeLike = str | Mapping[str, Any] | RuntimeRef | Runtime


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _stale_connection(exc: BaseException) -> bool:
    """Did the server close the (pooled) connection without answering, rather than refuse or time out?"""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
            return True
        # requests wraps urllib3's ProtocolError("Connection aborted.", <the socket's error>)
        pending.extend(
            e for e in (error.__cause__, error.__context__, *error.args) if isinstance(e, BaseException)
        )
    return False


class Client:
    """The dispatch API. ``url`` and ``token`` default to ``DISPATCH_URL`` and ``DISPATCH_TOKEN``;
    ``namespace`` (for ``connect`` and ``start`` when the call names none) to ``DISPATCH_NAMESPACE``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        session: requests.Session | None = None,
    ) -> None:
        self.url = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.namespace = namespace or os.environ.get(NAMESPACE_ENV) or None
        self.timeout = timeout
        self._http = session or requests.Session()
        self._http.headers["Accept"] = "application/json"
        self._http.headers["User-Agent"] = "dispatch-client/0.1"
        if token:
            self._http.headers["Authorization"] = f"Token {token}"

    # ------------------------------------------------------------------ plumbing
    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        accept: Iterable[int] = (),
    ) -> tuple[int, Any]:
        """One API call: (status, parsed body). A status >= 400 that is not in ``accept`` raises the typed
        error for it; no answer raises ``ConnectionFailed``."""
        url = path if path.startswith("http") else f"{self.url}{path}"
        what = f"{method} {path}"
        timeout = self.timeout if read_timeout is None else (self.timeout[0], read_timeout)
        headers = dict(headers or {})
        # A pooled keep-alive connection the server closes as the request goes out answers nothing
        # ("Remote end closed connection without response"); the request never reached the application, and
        # a read or an idempotent submission is sent once more on a fresh connection.
        resend = method.upper() in _SAFE_METHODS or "Idempotency-Key" in headers
        for last in (not resend, True):
            try:
                response = self._http.request(
                    method, url, json=json, params=params, headers=headers, timeout=timeout
                )
                break
            except requests.ConnectionError as exc:
                if last or not _stale_connection(exc):
                    raise ConnectionFailed(f"{what}: no answer from {self.url}: {exc}") from exc
                logger.debug("%s: the server closed a pooled connection; sending again", what)
            except requests.RequestException as exc:
                raise ConnectionFailed(f"{what}: no answer from {self.url}: {exc}") from exc
        body: Any
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400 and response.status_code not in set(accept):
            raise error_for(response.status_code, body, what=what)
        return response.status_code, body

    def close(self) -> None:
        """Closes the HTTP connections (not any session)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _namespace(self, namespace: str | None) -> str:
        ns = namespace or self.namespace
        if not ns:
            raise ValueError(f"no namespace: pass namespace=... or set {NAMESPACE_ENV}")
        return ns

    def _job_body(self, spec: Mapping[str, Any] | None, fields: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = dict(spec or {})
        body.update({k: v for k, v in fields.items() if v is not None})
        if "runtime" in body:  # "name", "Kind/name", a dict without kind, a Runtime: the API's shape
            body["runtime"] = RuntimeRef.parse(body["runtime"]).to_api()
        if "namespace" not in body and self.namespace:
            body["namespace"] = self.namespace
        return body

    # ------------------------------------------------------------------ who am I
    def me(self) -> dict[str, Any]:
        """The caller: user name, roles and granted namespaces."""
        _, body = self.request("GET", "/api/v1/me")
        return dict(body)

    # ------------------------------------------------------------------ jobs
    def plan(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Plan:
        """What ``start`` would do with this job, creating nothing. A refusal is an answer, not an error:
        ``plan.refused`` and ``plan.reasons``. The job is ``spec`` (the API's body, e.g. loaded from a file)
        and/or keyword fields (``runtime``, ``namespace``, ``image``, ``num_nodes``, ``env``, ...)."""
        _, body = self.request("POST", "/api/v1/plan", json=self._job_body(spec, fields))
        return Plan.from_api(body)

    def start(
        self, spec: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> Job:
        """Submits a job; returns it accepted (state ``pending``, a worker creates the TrainJob). A refused
        job raises ``Refused`` with every reason (``err.codes``; the refusal is recorded as ``err.job_id``).
        With ``idempotency_key`` a retry returns the same job instead of starting a second one."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        _, body = self.request("POST", "/api/v1/jobs", json=self._job_body(spec, fields), headers=headers)
        return Job.from_api(body)

    def get(self, job_id: str) -> Job:
        """One job with its plan and executions."""
        _, body = self.request("GET", f"/api/v1/jobs/{job_id}")
        return Job.from_api(body)

    def jobs(
        self,
        *,
        state: str | None = None,
        runtime: str | None = None,
        namespace: str | None = None,
        owner: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs the caller may see, newest first (every page, or at most ``limit`` jobs)."""
        params = {
            k: v
            for k, v in {"state": state, "runtime": runtime, "namespace": namespace, "owner": owner}.items()
            if v
        }
        found: list[Job] = []
        next_url: str | None = "/api/v1/jobs"
        while next_url:
            _, body = self.request("GET", next_url, params=params if next_url == "/api/v1/jobs" else None)
            found.extend(Job.from_api(j) for j in body.get("results", []))
            if limit is not None and len(found) >= limit:
                return found[:limit]
            next_url = body.get("next")
        return found

    def wait(
        self,
        job_id: str,
        state: str | Iterable[str] | None = None,
        *,
        timeout: float = 600,
        polling_interval: float = 2,
    ) -> Job:
        """Polls the job until it reaches ``state`` (one state or several), or any terminal state when no
        state is given. A job that ends in a terminal state it was not asked to reach raises ``JobEnded``
        (``err.job`` is the job); the job not getting there within ``timeout`` seconds raises
        ``TimeoutError`` naming its last state."""
        if polling_interval <= 0:
            raise ValueError("polling_interval must be positive")
        wanted = frozenset([state] if isinstance(state, str) else state or TERMINAL_JOB_STATES)
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in wanted:
                return job
            if job.terminal:
                why = f" ({job.cause}: {job.message})" if job.cause or job.message else ""
                raise JobEnded(
                    f"job {job_id} ended {job.state}{why}, not {' or '.join(sorted(wanted))}", job=job
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"job {job_id} is still {job.state} after {timeout:g}s "
                    f"(waiting for {' or '.join(sorted(wanted))})"
                )
            time.sleep(min(polling_interval, remaining))

    def feed_cursor(self) -> str:
        """The change feed's cursor now: ``watch(after=cursor)`` yields what changes from here on."""
        _, body = self.request("GET", "/api/v1/events", params={"after": "now"})
        return str(body.get("cursor") or "")

    def watch(
        self,
        *,
        after: str | None = "now",
        job: str | None = None,
        polling_interval: float = 2,
        timeout: float | None = None,
        page_size: int = 500,
    ) -> Iterator[JobChange]:
        """Follows the change feed (``GET /api/v1/events``): yields every change of the jobs the caller may
        see, in order, as ``JobChange`` records. ``after`` is where to start: ``"now"`` (the default) for
        changes from now on, ``None`` or ``""`` for every change the feed holds, or a ``change.cursor`` seen
        before (nothing is skipped or repeated across reconnects). ``job`` follows one job only. Polls every
        ``polling_interval`` seconds while nothing new is there; returns after ``timeout`` seconds (never,
        when None)."""
        if polling_interval <= 0:
            raise ValueError("polling_interval must be positive")
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = self.feed_cursor() if after == "now" else after or ""
        while True:
            params: dict[str, Any] = {"after": cursor, "limit": page_size}
            if job:
                params["job"] = job
            _, body = self.request("GET", "/api/v1/events", params=params)
            for item in body.get("events") or []:
                yield JobChange.from_api(item)
            cursor = str(body.get("cursor") or cursor)
            if body.get("more"):
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return
            pause = (
                polling_interval if deadline is None else min(polling_interval, deadline - time.monotonic())
            )
            time.sleep(max(0.0, pause))

    def cancel(self, job_id: str) -> Job:
        """Cancels a job: the service deletes its TrainJob; state ``cancelled``."""
        _, body = self.request("POST", f"/api/v1/jobs/{job_id}/cancel")
        return Job.from_api(body)

    def logs(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        rank: int | None = None,
        container: str | None = None,
        tail: int | None = None,
        restart_attempt: int | None = None,
    ) -> JobLog:
        """One rank's log (``GET /api/v1/jobs/{id}/logs``): by default the current attempt's failing rank, or
        rank 0, its last 1,000 lines. A rank, attempt or container that has no log raises ``NotFound`` whose
        message names the ones that have."""
        params = _log_params(attempt, rank, container, tail, restart_attempt)
        response = self._get_text(f"/api/v1/jobs/{job_id}/logs", params=params, stream=False)
        with response:
            return JobLog.from_response(response.text, response.headers)

    def follow_logs(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        rank: int | None = None,
        container: str | None = None,
        tail: int | None = None,
    ) -> Iterator[str]:
        """One rank's log as it is written (``follow=true``), chunk by chunk, until the container ends or
        the service's limit on one stream (five minutes) is reached; a pod that ended gives its log once."""
        params = {**_log_params(attempt, rank, container, tail, None), "follow": "true"}
        response = self._get_text(f"/api/v1/jobs/{job_id}/logs", params=params, stream=True)
        with response:
            response.encoding = response.encoding or "utf-8"
            try:
                for chunk in response.iter_content(chunk_size=None, decode_unicode=True):
                    if chunk:
                        yield chunk
            except requests.RequestException as exc:
                raise ConnectionFailed(f"GET /api/v1/jobs/{job_id}/logs: the stream broke: {exc}") from exc

    def usage(
        self,
        *,
        group_by: str = "namespace",
        since: str | None = None,
        until: str | None = None,
        step: str | None = None,
        namespace: str | None = None,
        owner: str | None = None,
        queue: str | None = None,
    ) -> list[dict[str, Any]]:
        """GPU-hours, lost GPU-hours, CPU-hours, jobs, attempts and queue waits per group (``GET
        /api/v1/usage``) over the days since..until (ISO dates, UTC; default the last 30 days), one row per
        group, or per group and period with ``step`` (day or week). Only what the caller may see."""
        params = _usage_params(group_by, since, until, step, namespace, owner, queue)
        _, body = self.request("GET", "/api/v1/usage", params=params)
        return list(body.get("results", []))

    def usage_csv(self, *, group_by: str = "namespace", **filters: str | None) -> str:
        """The same rows as a spreadsheet (``?format=csv``): a header line, then a line per row."""
        params = _usage_params(group_by, **filters) | {"format": "csv"}
        response = self._get_text("/api/v1/usage", params=params, stream=False, accept="text/csv")
        with response:
            return response.text

    def _get_text(
        self, path: str, *, params: Mapping[str, Any], stream: bool, accept: str = "text/plain"
    ) -> requests.Response:
        """A GET whose success is text, not JSON (a log); an error answer raises the typed error for it."""
        what = f"GET {path}"
        try:
            response = self._http.get(
                f"{self.url}{path}",
                params=params,
                headers={"Accept": f"{accept}, application/json"},
                timeout=(self.timeout[0], None) if stream else self.timeout,
                stream=stream,
            )
        except requests.RequestException as exc:
            raise ConnectionFailed(f"{what}: no answer from {self.url}: {exc}") from exc
        if response.status_code >= 400:
            with response:
                try:
                    body: Any = response.json() if response.content else None
                except ValueError:
                    body = response.text
            raise error_for(response.status_code, body, what=what)
        return response

    def runtimes(self) -> RuntimeList:
        """Allow-listed runtimes and the cluster's other runtimes, each with its verdict and purposes;
        ``.cluster_error`` says why the cluster's own list is missing, when it is."""
        _, body = self.request("GET", "/api/v1/runtimes")
        return RuntimeList(
            [Runtime.from_api(r) for r in body.get("results", [])], body.get("cluster_error") or None
        )

    # ------------------------------------------------------------------ sessions
    def open_session(
        self,
        *,
        runtime: RuntimeLike,
        image: str,
        num_nodes: int | None = None,
        namespace: str | None = None,
        command: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_seconds: int | None = None,
        name: str | None = None,
        wait: int | None = None,
        queue_name: str | None = None,
    ) -> SessionInfo:
        """Creates a session (its TrainJob) and returns it as the API reports it, usually ``starting``.
        ``command`` replaces the keep-alive ``sleep infinity`` (a string runs with ``sh -c``); ``name``
        names the TrainJob (default: the session id); ``queue_name`` the Kueue LocalQueue (default: the
        namespace's default queue, if the site sets one). ``wait`` (seconds, at most 300) lets the service
        hold the answer until the session runs."""
        body: dict[str, Any] = {
            "runtime": RuntimeRef.parse(runtime).to_api(),
            "namespace": self._namespace(namespace),
            "image": image,
        }
        if num_nodes is not None:
            body["num_nodes"] = num_nodes
        if command is not None:
            body["command"] = ["sh", "-c", command] if isinstance(command, str) else list(command)
        if env:
            body["env"] = dict(env)
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if name:
            body["name"] = name
        if queue_name:
            body["queue_name"] = queue_name
        params = {"wait": wait} if wait else None
        read = None if not wait else self.timeout[1] + wait
        _, data = self.request("POST", "/api/v1/sessions", json=body, params=params, read_timeout=read)
        return SessionInfo.from_api(data)

    def get_session(self, session_id: str) -> SessionInfo:
        _, data = self.request("GET", f"/api/v1/sessions/{session_id}")
        return SessionInfo.from_api(data)

    def sessions(self, *, state: str | None = None) -> list[SessionInfo]:
        """The sessions the caller may see, newest first (every page)."""
        found: list[SessionInfo] = []
        next_url: str | None = "/api/v1/sessions"
        params = {"state": state} if state else None
        while next_url:
            _, data = self.request("GET", next_url, params=params if next_url == "/api/v1/sessions" else None)
            found.extend(SessionInfo.from_api(s) for s in data.get("results", []))
            next_url = data.get("next")
        return found

    def execute(
        self,
        session_id: str,
        command: str | Sequence[str],
        *,
        container: str | None = None,
        timeout_seconds: int | None = None,
    ) -> ExecResult:
        """Runs a command in the session's trainer pod: a string with ``sh -c``, a list directly.
        A session that is not running raises ``SessionNotRunning`` (a ``RuntimeError``); a command that
        outlives ``timeout_seconds`` raises ``ExecTimedOut`` (a ``TimeoutError``) with its output so far."""
        if not command:
            raise ValueError("empty command")
        body: dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
        if container:
            body["container"] = container
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        read = None if timeout_seconds is None else self.timeout[1] + timeout_seconds
        status, data = self.request(
            "POST", f"/api/v1/sessions/{session_id}/exec", json=body, read_timeout=read, accept=(409, 504)
        )
        if status in (409, 504):
            err = error_for(status, data, what=f"POST /api/v1/sessions/{session_id}/exec")
            cls = SessionNotRunning if status == 409 else ExecTimedOut
            raise cls(str(err), status=status, body=data)
        return ExecResult.from_api(data)

    def close_session(self, session_id: str) -> SessionInfo | None:
        """Asks the service to close a session (delete its TrainJob); idempotent. None when it is gone."""
        try:
            _, data = self.request("DELETE", f"/api/v1/sessions/{session_id}")
        except NotFound:
            return None
        return SessionInfo.from_api(data) if isinstance(data, dict) and data else None

    def connect(
        self,
        runtime: RuntimeLike,
        image: str,
        num_nodes: int | None = None,
        command: str | Sequence[str] | None = None,
        timeout: float = 600,
        polling_interval: float = 2,
        *,
        namespace: str | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> Session:
        """Opens an interactive session: creates a TrainJob kept alive with ``sleep infinity`` (unless
        ``command`` is given), waits until its trainer pod runs and returns a ``Session``.

        A trainer pod that already finished raises ``RuntimeError`` with the service's message; no running
        pod within ``timeout`` seconds raises ``TimeoutError`` saying the TrainJob was created and how to
        delete it."""
        if polling_interval <= 0:
            raise ValueError("polling_interval must be positive")
        deadline = time.monotonic() + timeout
        info = self.open_session(
            runtime=runtime,
            image=image,
            num_nodes=num_nodes,
            namespace=namespace,
            command=command,
            env=env,
            timeout_seconds=max(1, int(timeout)),
            name=name,
        )
        while True:
            if info.state == "running":
                return Session(self, info)
            late = time.monotonic() >= deadline
            if info.state == "failed" or info.state in ("closing", "closed"):
                if late:
                    raise TimeoutError(_open_timeout_message(info, timeout))
                raise RuntimeError(
                    f"session {info.id} (TrainJob {info.namespace}/{info.trainjob_name}) is {info.state}: "
                    f"{info.message}"
                )
            if late:
                raise TimeoutError(_open_timeout_message(info, timeout))
            time.sleep(max(0.0, min(polling_interval, deadline - time.monotonic())))
            info = self.get_session(info.id)


def _log_params(
    attempt: int | None,
    rank: int | None,
    container: str | None,
    tail: int | None,
    restart_attempt: int | None,
) -> dict[str, Any]:
    given = {
        "attempt": attempt,
        "rank": rank,
        "container": container,
        "tail": tail,
        "restart_attempt": restart_attempt,
    }
    return {key: value for key, value in given.items() if value is not None}


def _open_timeout_message(info: SessionInfo, timeout: float) -> str:
    return (
        f"session {info.id}: the TrainJob {info.namespace}/{info.trainjob_name} was created but its trainer "
        f"pod did not run within {timeout:g}s (state {info.state}"
        + (f": {info.message}" if info.message else "")
        + "). It is not deleted: delete it with `dispatch session close "
        f"{info.id}` (or Client.close_session({info.id!r}), or "
        f"`kubectl -n {info.namespace} delete trainjob {info.trainjob_name}`)."
    )


class Session:
    """A running interactive session. ``name`` is its TrainJob's name. Use it as a context manager, or
    call ``close()`` (idempotent) when done."""

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self._client = client
        self.info = info
        self.id = info.id
        self.name = info.trainjob_name
        self.namespace = info.namespace
        self._closed = False

    @property
    def pod(self) -> str | None:
        """The trainer pod the commands run in."""
        return self.info.pod

    @property
    def closed(self) -> bool:
        return self._closed

    def execute(
        self,
        command: str | Sequence[str],
        *,
        container: str | None = None,
        timeout_seconds: int | None = None,
    ) -> ExecResult:
        """Runs a command in the trainer pod: a string with ``sh -c``, a list of arguments directly.
        Raises ``RuntimeError`` once the session is closed."""
        if self._closed:
            raise RuntimeError(f"session {self.id} (TrainJob {self.name}) is closed")
        return self._client.execute(self.id, command, container=container, timeout_seconds=timeout_seconds)

    def close(self, timeout: float = 180, polling_interval: float = 1) -> None:
        """Deletes the TrainJob and waits until its pods are gone (the service reports ``closed``). Pods
        still there after ``timeout`` seconds log a warning instead of raising. Calling it again does
        nothing."""
        if self._closed:
            return
        self._closed = True
        info = self._client.close_session(self.id)
        deadline = time.monotonic() + timeout
        while info is not None and info.state not in SESSION_DONE_STATES:
            if time.monotonic() >= deadline:
                logger.warning(
                    "session %s: TrainJob %s/%s still %s after %gs; its pods may outlive the session",
                    self.id,
                    self.namespace,
                    self.name,
                    info.state,
                    timeout,
                )
                return
            time.sleep(max(0.0, min(polling_interval, deadline - time.monotonic())))
            try:
                info = self._client.get_session(self.id)
            except NotFound:
                info = None
            except DispatchError as exc:
                logger.warning("session %s: could not read its state while closing: %s", self.id, exc)
                return
        if info is not None:
            self.info = info

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.info.state
        return f"Session(id={self.id!r}, name={self.name!r}, pod={self.pod!r}, state={state!r})"


def _usage_params(
    group_by: str,
    since: str | None = None,
    until: str | None = None,
    step: str | None = None,
    namespace: str | None = None,
    owner: str | None = None,
    queue: str | None = None,
) -> dict[str, str]:
    given = {
        "since": since,
        "until": until,
        "step": step,
        "namespace": namespace,
        "owner": owner,
        "queue": queue,
    }
    return {"group_by": group_by} | {k: v for k, v in given.items() if v}
