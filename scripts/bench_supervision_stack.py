"""make bench, supervision part (scripts/bench_supervision.py): its settings, the kubernetes client, namespace
and fake nodes it uses, and the supervisor process it measures (`bench_supervision.py supervisor`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

NAMESPACE = "bench-supervision"
SIZES = tuple(int(s) for s in os.environ.get("BENCH_SUPERVISION_SIZES", "10,100,1000").split(","))
FAULT = os.environ.get("BENCH_SUPERVISION_FAULT", "")
# BENCH_SUPERVISION_FAIL: how many pods fail per size (default 1% of the pods, at least 1).
FAIL = os.environ.get("BENCH_SUPERVISION_FAIL", "")
RANKS = 4
INTERVAL = 2.0
QUIET_CYCLES = 5
NODE_PREFIX = "bench-sup-node-"
PODS_PER_NODE = 1100


def log(message: str) -> None:
    print(f"[bench supervision] {message}", file=sys.stderr, flush=True)


def kube_client(kubeconfig: str) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = 32
    return client.ApiClient(configuration)


def ensure_namespace(api_client: Any, name: str) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except client.ApiException:
            time.sleep(0.2)
    raise RuntimeError(f"namespace {name}: no default ServiceAccount")


def make_nodes(api_client: Any, count: int) -> list[str]:
    """Fake nodes for the bench's pods (KWOK manages every node): enough pod slots and CPU for them."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    names = [f"{NODE_PREFIX}{i}" for i in range(count)]
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(PODS_PER_NODE)}
    for name in names:
        try:
            core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                        "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                    },
                    "status": {"allocatable": capacity, "capacity": capacity},
                }
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = 0
        for name in names:
            node = core.read_node(name)
            ready += any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        if ready == len(names):
            return names
        time.sleep(1)
    raise RuntimeError("the bench's nodes did not become Ready")


# ---------------------------------------------------------------- the supervisor process


def supervisor_main(fault: str) -> None:
    """`python scripts/bench_supervision.py supervisor`: the `manage.py supervise` loop (run_forever with its
    informer cache) printing one JSON line per cycle, with a deliberate fault when asked."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    import signal

    from cluster import gateway
    from jobs.management.commands.supervise import _rss_kib
    from jobs.supervision import worker_watch as watch_module  # builds the informers (TRIMS, trim_event)
    from jobs.supervision.cache import CacheSource
    from jobs.supervision.watch import run_forever

    interval = INTERVAL
    source: CacheSource | None = CacheSource()
    if fault == "nowatch":
        source = None
    elif fault == "deriveall":
        original_due = CacheSource.due

        def due_all(self: CacheSource) -> Any:
            with self._lock:
                self._dirty |= set(self._by_key)
            return original_due(self)

        CacheSource.due = due_all  # type: ignore[method-assign]
    elif fault == "nowake":
        interval = 10.0

        def sleepy(self: CacheSource, timeout: float) -> bool:
            time.sleep(timeout)
            return False

        CacheSource.wait = sleepy  # type: ignore[method-assign]
    elif fault == "untrimmed":
        for kind in list(watch_module.TRIMS):
            watch_module.TRIMS[kind] = lambda obj: dict(obj)
        CacheSource._keep_event = lambda self, event: True  # type: ignore[method-assign]
        CacheSource._keeper = lambda self, domain: lambda obj: True  # type: ignore[method-assign]
        watch_module.trim_event = lambda event: dict(event)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))

    def stats(report: Any) -> None:
        line = {
            key: getattr(report, key)
            for key in (
                "ran",
                "executions",
                "derived",
                "transitions",
                "api_requests",
                "lists",
                "gets",
                "bytes_received",
                "duration_ms",
                "cpu_ms",
                "prepare_cpu_ms",
                "resynced",
                "error",
                "phases_ms",
            )
        }
        line["at"] = time.time()
        line["rss_kib"] = _rss_kib()
        line["process_traffic"] = gateway.traffic.snapshot()
        if source is not None:
            line["informers"] = source.informer_count()
            line["cached"] = source.cached_objects()
        print(json.dumps(line), flush=True)

    profile = os.environ.get("BENCH_SUPERVISION_PROFILE", "")
    profiler = None
    if profile:  # the cycles' thread only (cProfile follows one thread)
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    run_forever(
        lambda: stop["now"], interval=interval, watch=source is not None, on_cycle=stats, source=source
    )
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    if source is not None:
        source.close()


class Supervisor:
    """The supervisor subprocess and the cycle lines it prints."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "bench_supervision.py"), "supervisor", FAULT],
            cwd=REPO,
            env=os.environ | env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                self.lines.append(line)

    def save(self, path: Path) -> None:
        with self._lock:
            path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))

    def since(self, at: float) -> list[dict[str, Any]]:
        with self._lock:
            return [line for line in self.lines if line["at"] >= at and line["ran"]]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
