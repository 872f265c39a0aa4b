"""Execute round trip through dispatch / a direct exec to the same pod (target <= 1.5).

Called by scripts/bench.py while its gunicorn server runs: opens one session (ClusterTrainingRuntime
dispatch-kind, allow-listed for sessions for the run), then runs `true` ROUNDS times each way, interleaved
(service, direct, direct-fresh, service, ...) so a slow moment of the machine hits all alike, and reports p50
and p95 of each and the ratios. The service path is what a user's execute costs: HTTP to gunicorn, token
authentication, the session read, pods/exec through the gateway, the history row and the audit row.

Two direct clients, both holding pods/exec themselves:
- direct (the baseline of the target): a client that reuses its connection state the way dispatch's gateway
  does (cluster/exec.py): one SSLContext with the CA and client certificate loaded once, and the last TLS
  session offered again so the API server resumes it. Each exec is still its own websocket (pods/exec has
  no other form), as it is for dispatch.
- direct-fresh: the library's `kubernetes.stream` as documented, which builds a new SSLContext (reading the
  certificate files) and does a full TLS handshake on every call. The README once compared dispatch against
  this one only, which flattered dispatch by the handshake it saves (issue 20).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import requests

from scripts.bench_common import Target

ROUNDS = int(os.environ.get("BENCH_SESSION_ROUNDS", "100"))
WARMUP = 5
COMMAND = ["true"]
RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _kube(kubeconfig: str) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))


def _ensure_namespace(core: Any, namespace: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while True:  # pods are refused until the namespace's default ServiceAccount exists
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class ReusingExecClient:
    """pods/exec over a websocket on a TLS connection made from one SSLContext (CA and client certificate read
    once) that offers the previous connection's TLS session, as dispatch's gateway does. Speaks the channel
    protocol (v5/v4): data frames carry the channel number first; channel 3 carries the Status whose
    details give the exit code."""

    def __init__(self, kubeconfig: str) -> None:
        import ssl

        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.host = configuration.host
        self.context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            self.context.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.server_hostname = configuration.tls_server_name or None
        token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
        self.authorization = (
            token if token and token.startswith("Bearer ") else (f"Bearer {token}" if token else "")
        )
        self.session: Any = None
        self.resumed = 0
        self.calls = 0

    def run(self, namespace: str, pod: str, container: str, command: list[str]) -> int | None:
        import json
        import socket
        from urllib.parse import urlencode, urlparse

        import websocket

        parsed = urlparse(self.host)
        query = urlencode(
            [("container", container), ("stdout", "true"), ("stderr", "true")]
            + [("command", c) for c in command]
        )
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/exec?{query}"
        url = f"wss://{parsed.hostname}:{parsed.port or 443}{path}"
        raw = socket.create_connection((parsed.hostname or "", parsed.port or 443), timeout=60)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.context.wrap_socket(
            raw, server_hostname=self.server_hostname or parsed.hostname, session=self.session
        )
        header = ["sec-websocket-protocol: v5.channel.k8s.io,v4.channel.k8s.io"]
        if self.authorization:
            header.append(f"authorization: {self.authorization}")
        ws = websocket.WebSocket()
        code: int | None = None
        try:
            ws.connect(url, header=header, socket=sock, timeout=60)
            while True:
                try:
                    opcode, data = ws.recv_data()
                except websocket.WebSocketConnectionClosedException:
                    break
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if data and data[0] == 3:  # the error channel: a Status
                    status = json.loads(data[1:].decode() or "{}")
                    if status.get("status") == "Success":
                        code = 0
                    else:
                        causes = (status.get("details") or {}).get("causes") or []
                        code = next(
                            (int(c["message"]) for c in causes if c.get("reason") == "ExitCode"), None
                        )
        finally:
            self.calls += 1
            self.resumed += bool(getattr(sock, "session_reused", False))
            if self.session is None or not sock.session_reused:
                self.session = sock.session
            ws.shutdown()
        return code


def _direct_exec(core: Any, namespace: str, pod: str) -> int | None:
    from kubernetes.stream import stream

    resp = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container="node",
        command=COMMAND,
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    try:
        resp.run_forever(timeout=60)
        code: int | None = resp.returncode
    finally:
        resp.close()
    return code


def run(base: str, token: str, kubeconfig: str, namespace: str) -> dict[str, Any]:
    """Measure; returns the timings (seconds) and ratios. Leaves nothing behind."""
    from jobs.models import Session
    from runtimes.models import AllowListEntry

    core = _kube(kubeconfig)
    _ensure_namespace(core, namespace)
    entry, _ = AllowListEntry.objects.get_or_create(kind=RUNTIME["kind"], namespace="", name=RUNTIME["name"])
    was_for_sessions = entry.for_sessions
    AllowListEntry.objects.filter(pk=entry.pk).update(for_sessions=True)
    http = requests.Session()
    http.headers["Authorization"] = f"Token {token}"
    session_id = ""
    try:
        opened = http.post(
            f"{base}/api/v1/sessions?wait=120",
            json={"runtime": RUNTIME, "namespace": namespace, "image": "localhost/bench:1", "num_nodes": 1},
            timeout=150,
        )
        opened.raise_for_status()
        session = opened.json()
        session_id = session["id"]
        if session["state"] != "running":
            raise RuntimeError(f"the bench session did not start: {session}")
        pod = session["pod"]
        url = f"{base}/api/v1/sessions/{session_id}/exec"

        def via_service() -> float:
            start = time.perf_counter()
            answer = http.post(url, json={"command": COMMAND}, timeout=60)
            elapsed = time.perf_counter() - start
            if answer.status_code != 200 or answer.json()["returncode"] != 0:
                raise RuntimeError(f"exec through dispatch failed: {answer.status_code} {answer.text}")
            return elapsed

        reusing = ReusingExecClient(kubeconfig)

        def direct() -> float:
            start = time.perf_counter()
            code = reusing.run(namespace, pod, "node", COMMAND)
            elapsed = time.perf_counter() - start
            if code != 0:
                raise RuntimeError(f"direct exec (reusing) returned {code}")
            return elapsed

        def direct_fresh() -> float:
            start = time.perf_counter()
            code = _direct_exec(core, namespace, pod)
            elapsed = time.perf_counter() - start
            if code != 0:
                raise RuntimeError(f"direct exec (kubernetes.stream) returned {code}")
            return elapsed

        for _ in range(WARMUP):
            via_service()
            direct()
            direct_fresh()
        service_times: list[float] = []
        direct_times: list[float] = []
        fresh_times: list[float] = []
        for _ in range(ROUNDS):
            service_times.append(via_service())
            direct_times.append(direct())
            fresh_times.append(direct_fresh())
    finally:
        if session_id:
            http.delete(f"{base}/api/v1/sessions/{session_id}?wait=60", timeout=90)
        Session.objects.filter(owner__username="bench").delete()
        AllowListEntry.objects.filter(pk=entry.pk).update(for_sessions=was_for_sessions)
    result: dict[str, Any] = {
        "rounds": ROUNDS,
        "service_p50": statistics.median(service_times),
        "service_p95": _percentile(service_times, 0.95),
        "direct_p50": statistics.median(direct_times),
        "direct_p95": _percentile(direct_times, 0.95),
        "direct_resumed": f"{reusing.resumed} of {reusing.calls}",
        "direct_fresh_p50": statistics.median(fresh_times),
        "direct_fresh_p95": _percentile(fresh_times, 0.95),
    }
    result["ratio_p50"] = result["service_p50"] / result["direct_p50"]
    result["ratio_p95"] = result["service_p95"] / result["direct_p95"]
    result["ratio_fresh_p50"] = result["service_p50"] / result["direct_fresh_p50"]
    result["ratio_fresh_p95"] = result["service_p95"] / result["direct_fresh_p95"]
    return result


TARGET = 1.5


def targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target(
            f"session execute through dispatch / a direct client reusing its TLS state, {which}",
            f"{result[f'ratio_{which}']:.2f}",
            f"<= {TARGET}",
            result[f"ratio_{which}"] <= TARGET,
            f"{which} of {result['rounds']} interleaved executes each way "
            f"({result[f'service_{which}'] * 1000:.1f} / {result[f'direct_{which}'] * 1000:.1f} ms)",
        )
        for which in ("p50", "p95")
    ]


def report_lines(result: dict[str, Any]) -> list[str]:
    met = lambda ratio: "yes" if ratio <= TARGET else "NO"  # noqa: E731
    return [
        "",
        "## Session execute: through dispatch / a direct client reusing its TLS state (target <= 1.5)",
        "",
        f"{result['rounds']} interleaved rounds of `true` in one trainer pod. direct: one SSLContext, TLS"
        f" session resumed ({result['direct_resumed']} resumed), as dispatch's gateway does; direct-fresh:"
        " `kubernetes.stream` as documented (a new SSLContext and a full handshake per call).",
        "",
        "| percentile | through dispatch ms | direct ms | ratio | target met | direct-fresh ms "
        "| ratio to fresh |",
        "|---|---|---|---|---|---|---|",
        f"| p50 | {result['service_p50'] * 1000:.1f} | {result['direct_p50'] * 1000:.1f} | "
        f"{result['ratio_p50']:.2f} | {met(result['ratio_p50'])} | {result['direct_fresh_p50'] * 1000:.1f} | "
        f"{result['ratio_fresh_p50']:.2f} |",
        f"| p95 | {result['service_p95'] * 1000:.1f} | {result['direct_p95'] * 1000:.1f} | "
        f"{result['ratio_p95']:.2f} | {met(result['ratio_p95'])} | {result['direct_fresh_p95'] * 1000:.1f} | "
        f"{result['ratio_fresh_p95']:.2f} |",
    ]


def main() -> None:
    """Only this measurement, on its own gunicorn server (make bench runs it with the rest)."""
    import subprocess
    import sys

    from scripts import bench_common as bench

    kubeconfig = bench.cluster_kubeconfig()
    # The environment make bench's server has (DEBUG off, as in production: no per-query log).
    database_url = os.environ.get("DATABASE_URL", "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch")
    env = bench.server_env(database_url, kubeconfig)
    token = bench.setup_django(env)
    port = bench.free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(  # as `make up` runs it (dispatch_site/gunicorn.conf.py)
        bench.gunicorn_command(port),
        cwd=bench.REPO,
        env=os.environ | env,
        stdout=bench.web_log("sessions"),
        stderr=subprocess.STDOUT,
    )
    try:
        bench.wait_http(f"{base}/healthz")
        result = run(base, token, kubeconfig, bench.BENCH_NAMESPACE)
    finally:
        server.terminate()
        server.wait(timeout=30)
        bench.cleanup_django()
        import redis

        redis.Redis.from_url(bench.redis_url()).flushdb()  # the watcher tasks the bench's sessions enqueued
    sys.stdout.write("\n".join(report_lines(result)) + "\n")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
