"""Pods for interactive sessions: list a TrainJob's pods, and run a command in one through `pods/exec`.

pods/exec is a websocket stream (kubernetes.stream): stdout and stderr are read until the server closes the
stream, then the exit status is read from the error channel. `stream()` swaps `call_api` on the ApiClient
it is given for the duration of the call, so every exec here runs on an ApiClient of its own thread, never
on the shared one the other gateway calls use concurrently.

Errors are the typed ones of cluster.errors, naming "Pod namespace/name".
"""

from __future__ import annotations

import ast
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import websocket
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream, ws_client
from kubernetes.stream.stream import _websocket_request
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL

from cluster.client import api_client, request_timeout
from cluster.errors import ClusterError, ClusterUnavailable, NotFound, Rejected
from cluster.gateway import call_api, core, target

POD = "Pod"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class PodInfo:
    """What a session needs to know about one pod."""

    name: str
    namespace: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    replicated_job: str  # the JobSet replicated job the pod belongs to ("" when not a JobSet pod)
    job_index: int
    completion_index: int
    deleting: bool  # has a deletionTimestamp
    containers: tuple[str, ...]
    labels: dict[str, str]
    uid: str = ""
    owner_uid: str = ""  # its controller's (a Job's) uid, "" without one
    owner_kind: str = ""  # its controller's kind ("Job" for a JobSet's pod)
    owner_name: str = ""

    @classmethod
    def from_api(cls, pod: Any) -> PodInfo:
        meta = pod.metadata
        labels = dict(meta.labels or {})
        annotations = meta.annotations or {}
        owner = next((o for o in meta.owner_references or [] if o.controller), None)
        return cls(
            name=meta.name,
            namespace=meta.namespace,
            phase=(pod.status.phase if pod.status else None) or "Unknown",
            replicated_job=labels.get(REPLICATED_JOB_LABEL, ""),
            job_index=_int(labels.get(JOB_INDEX_LABEL)),
            completion_index=_int(annotations.get(COMPLETION_INDEX_ANNOTATION)),
            deleting=meta.deletion_timestamp is not None,
            containers=tuple(c.name for c in (pod.spec.containers if pod.spec else None) or []),
            labels=labels,
            uid=str(meta.uid or ""),
            owner_uid=str(owner.uid) if owner is not None else "",
            owner_kind=str(owner.kind) if owner is not None else "",
            owner_name=str(owner.name) if owner is not None else "",
        )


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def list_pods(namespace: str, label_selector: str) -> list[PodInfo]:
    result = call_api(
        f"Pods in {namespace} ({label_selector})",
        core().list_namespaced_pod,
        namespace,
        label_selector=label_selector,
    )
    return [PodInfo.from_api(p) for p in result.items]


def get_pod(namespace: str, name: str) -> PodInfo | None:
    try:
        pod = call_api(target(POD, namespace, name), core().read_namespaced_pod, name, namespace)
    except NotFound:
        return None
    return PodInfo.from_api(pod)


# ---------------------------------------------------------------- exec


@dataclass(frozen=True)
class ExecOutput:
    stdout: str
    stderr: str
    returncode: int | None  # None: the API server reported no exit code
    truncated: bool  # output beyond max_bytes was dropped
    bytes_out: int  # what the command wrote to stdout and stderr, before any truncation
    status_message: str  # the error channel's message when it reported no exit code


class ExecTimeout(ClusterError):
    """The command was still running when the exec's own timeout ended; the stream was closed."""

    def __init__(self, what: str, message: str, output: ExecOutput) -> None:
        super().__init__(what, message)
        self.output = output


_local = threading.local()


def _exec_core() -> client.CoreV1Api:
    """A CoreV1Api on an ApiClient owned by this thread (stream() mutates the client it runs on)."""
    shared = api_client()
    cached = getattr(_local, "core", None)
    if cached is None or getattr(_local, "configuration", None) is not shared.configuration:
        cached = client.CoreV1Api(client.ApiClient(shared.configuration))
        _local.core = cached
        _local.configuration = shared.configuration
    return cached


class _Tls:
    """The TLS side of this thread's exec connections to one API server: one SSLContext (its CA and client
    certificate read from disk once, not per exec) and the last TLS session, offered again on the next
    connection so the API server can resume it instead of a full handshake with certificate checks."""

    def __init__(self, configuration: client.Configuration) -> None:
        self.context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.assert_hostname is not None:
            self.context.check_hostname = bool(configuration.assert_hostname)
        if configuration.cert_file:
            self.context.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.server_hostname = configuration.tls_server_name or None
        self.session: ssl.SSLSession | None = None

    def connect(self, url: str, timeout: float) -> ssl.SSLSocket:
        parsed = urlparse(url)
        host = parsed.hostname or ""
        raw = socket.create_connection((host, parsed.port or 443), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock = self.context.wrap_socket(
                raw, server_hostname=self.server_hostname or host, session=self.session
            )
        except BaseException:
            raw.close()
            raise
        sock.settimeout(timeout)
        return sock

    def remember(self, sock: Any) -> None:
        """Keep the connection's session (TLS 1.3 sends its ticket after the handshake, so read it late).
        A resumed connection keeps the session it resumed (reading `session` costs most of a millisecond);
        once the server declines it, the next full handshake's session replaces it."""
        if self.session is not None and getattr(sock, "session_reused", False):
            return
        session = getattr(sock, "session", None)
        if session is not None:
            self.session = session


def _tls(configuration: client.Configuration) -> _Tls | None:
    """This thread's TLS state for the configuration; None when the exec should take kubernetes.stream's own
    connection path (plain http, no certificate check, a proxy)."""
    if not configuration.host.startswith("https://") or not configuration.verify_ssl or configuration.proxy:
        return None
    cached: _Tls | None = getattr(_local, "tls", None)
    if cached is None or getattr(_local, "tls_configuration", None) is not configuration:
        cached = _Tls(configuration)
        _local.tls = cached
        _local.tls_configuration = configuration
    return cached


class _ExecClient(ws_client.WSClient):
    """kubernetes.stream's WSClient on a socket from _Tls (the library opens a new SSLContext per call)."""

    def __init__(self, tls: _Tls, url: str, headers: dict[str, str] | None, timeout: float) -> None:
        self._connected = False
        self._channels: dict[int, Any] = {}
        self._closed_channels: set[int] = set()
        self.binary = False
        self.newline = "\n"
        self._all = ws_client._IgnoredIO()  # type: ignore[assignment]  # as capture_all=False does
        header = [f"sec-websocket-protocol: {ws_client.V5_CHANNEL_PROTOCOL},{ws_client.V4_CHANNEL_PROTOCOL}"]
        if headers and "authorization" in headers:
            header.append(f"authorization: {headers['authorization']}")
        sock = tls.connect(url, timeout)
        self.sock = websocket.WebSocket(skip_utf8_validation=False)
        try:
            self.sock.connect(url, header=header, socket=sock, timeout=timeout)
        except BaseException:
            sock.close()
            raise
        self.subprotocol = getattr(self.sock, "subprotocol", None)
        self._connected = True
        self._returncode = None
        self._tls = tls

    def close(self, **kwargs: Any) -> None:
        if self.sock is not None and self.sock.sock is not None:
            self._tls.remember(self.sock.sock)
        if not self._connected and self.sock is not None:
            # update() saw the server's close frame and websocket-client answered it: the closing handshake
            # is complete, so close the socket instead of sending a second close frame and waiting for EOF.
            self.sock.shutdown()
            return
        super().close(**kwargs)


def _exec_stream(tls: _Tls, timeout: float) -> Any:
    """kubernetes.stream.stream with the websocket opened by _ExecClient: the same request (URL, query,
    authorization header built by the generated API method), the same channel protocol."""

    def websocket_call(configuration: Any, _method: str, url: str, **kwargs: Any) -> Any:
        url = ws_client.get_websocket_url(url, kwargs.get("query_params"))
        try:
            return _ExecClient(tls, url, kwargs.get("headers"), timeout)
        except Exception as exc:  # as kubernetes.stream's websocket_call reports a failed connection
            raise ApiException(status=0, reason=str(exc)) from None

    return lambda api_method, *args, **kwargs: _websocket_request(
        websocket_call, None, api_method, *args, **kwargs
    )


_HANDSHAKE = re.compile(r"Handshake status (\d{3})")


def translate_handshake(exc: ApiException, what: str) -> ClusterError:
    """The websocket client reports a refused handshake as status 0 with the HTTP status and the API
    server's Status body in the reason text: turn it into the typed error that status means."""
    if exc.status:
        from cluster.gateway import translate

        return translate(exc, what)
    text = str(exc.reason or "")
    status_match = _HANDSHAKE.search(text)
    status = int(status_match.group(1)) if status_match else 0
    # Without a Status body to read, the handshake's text (headers and all) is not shown to users.
    message = _status_message(text) or (
        f"the API server answered HTTP {status} to the exec request" if status else text
    )
    if status == 404:
        return NotFound(what, message, status=status)
    if 400 <= status < 500 and status != 429:
        return Rejected(what, message, status=status)
    return ClusterUnavailable(what, f"exec failed: {message}" if message else "exec failed", status=status)


def _status_message(text: str) -> str:
    """The API server's Status message from a handshake failure's text: "Handshake status 404 Not Found
    -+-+- {headers} -+-+- b'{...Status JSON...}'". "" when there is none to read."""
    start = max(text.rfind("b'"), text.rfind('b"'))
    if start < 0:
        return ""
    try:
        body = ast.literal_eval(text[start:].strip())
        status = json.loads(body)
    except (ValueError, SyntaxError, TypeError):
        return ""
    return str(status.get("message", "")) if isinstance(status, dict) else ""


def parse_exec_status(text: str) -> tuple[int | None, str]:
    """(exit code, message) from the error channel's v1.Status: Success is 0; NonZeroExitCode carries the
    code as the ExitCode cause; anything else (or nothing at all) reports no exit code. Pure."""
    if not text.strip():
        return None, "the API server sent no exit status"
    try:
        status = yaml.safe_load(text)
    except yaml.YAMLError:
        return None, text.strip()
    if not isinstance(status, dict):
        return None, text.strip()
    if status.get("status") == "Success":
        return 0, ""
    causes = (status.get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "")), ""
            except ValueError:
                break
    return None, str(status.get("message") or text.strip())


class _Capped:
    """Collects a stream's text up to a byte budget shared with the other stream."""

    def __init__(self, budget: list[int]) -> None:
        self.parts: list[str] = []
        self.budget = budget  # [bytes left], shared between stdout and stderr
        self.total = 0
        self.truncated = False

    def add(self, text: str) -> None:
        if not text:
            return
        data = text.encode()
        self.total += len(data)
        left = self.budget[0]
        if len(data) <= left:
            self.parts.append(text)
            self.budget[0] = left - len(data)
            return
        self.truncated = True
        if left > 0:
            self.parts.append(data[:left].decode(errors="ignore"))
            self.budget[0] = 0

    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class ExecStream:
    """An exec whose command runs: the stream is open (exec_open), its output not read yet (exec_collect)."""

    what: str
    resp: Any
    timeout: float


def exec_open(namespace: str, pod: str, container: str, argv: list[str], *, timeout: float) -> ExecStream:
    """Start argv (no TTY, no stdin) in the pod's container: once this returns, the API server has the
    stream open and the command runs. NotFound: the pod is gone. Rejected: the API server refused (no such
    container, pod not running). ClusterUnavailable: the API server could not be reached."""
    what = target(POD, namespace, pod)
    connect_timeout, _ = request_timeout()
    exec_core = _exec_core()
    socket_timeout = max(connect_timeout, float(timeout))
    try:
        tls = _tls(exec_core.api_client.configuration)
        if tls is None:
            # The websocket client has no per-call connect timeout: its module default applies to new sockets.
            websocket.setdefaulttimeout(socket_timeout)
        opener = stream if tls is None else _exec_stream(tls, socket_timeout)
        resp = opener(
            exec_core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=container,
            command=argv,
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
    except ApiException as exc:
        raise translate_handshake(exc, what) from None
    except (OSError, websocket.WebSocketException) as exc:
        raise ClusterUnavailable(what, f"exec failed: {exc}") from None
    return ExecStream(what=what, resp=resp, timeout=float(timeout))


def exec_collect(started: ExecStream, *, max_bytes: int) -> ExecOutput:
    """Read an open exec's stdout and stderr until the command ends, at most its timeout from now; then its
    exit status. ExecTimeout: still running after the timeout (the stream is closed). ClusterUnavailable: the
    stream broke."""
    what, resp, timeout = started.what, started.resp, started.timeout
    budget = [max_bytes]
    out, err = _Capped(budget), _Capped(budget)
    status_text: list[str] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while resp.is_open():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            resp.update(timeout=min(left, 1.0))
            if resp.peek_channel(STDOUT_CHANNEL):
                out.add(resp.read_channel(STDOUT_CHANNEL))
            if resp.peek_channel(STDERR_CHANNEL):
                err.add(resp.read_channel(STDERR_CHANNEL))
        out.add(resp.read_channel(STDOUT_CHANNEL))
        err.add(resp.read_channel(STDERR_CHANNEL))
        status_text.append(resp.read_channel(ERROR_CHANNEL))
    except (OSError, websocket.WebSocketException) as exc:
        raise ClusterUnavailable(what, f"exec stream broke: {exc}") from None
    finally:
        resp.close()

    returncode, message = (None, "") if timed_out else parse_exec_status("".join(status_text))
    output = ExecOutput(
        stdout=out.text(),
        stderr=err.text(),
        returncode=returncode,
        truncated=out.truncated or err.truncated,
        bytes_out=out.total + err.total,
        status_message=message,
    )
    if timed_out:
        raise ExecTimeout(what, f"the command was still running after {timeout:g}s", output)
    return output


def exec_in_pod(
    namespace: str,
    pod: str,
    container: str,
    argv: list[str],
    *,
    timeout: float,
    max_bytes: int,
) -> ExecOutput:
    """Run argv (no TTY, no stdin) in the pod's container; wait at most `timeout` seconds for it
    (exec_open, then exec_collect: their errors)."""
    return exec_collect(exec_open(namespace, pod, container, argv, timeout=timeout), max_bytes=max_bytes)
