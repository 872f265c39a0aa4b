"""What the benchmark scripts share: the repository, the bench's Redis database and namespace, a Django setup
for the bench user, wrk, and small helpers."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse, urlunparse

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from dispatch_site.worker_command import worker_command  # noqa: E402 - after the path is set

PY = Path(sys.executable)
DURATION = os.environ.get("BENCH_DURATION", "10s")
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "8"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
BENCH_REDIS_DB = 2  # the bench's own Redis database, flushed afterwards
BENCH_NAMESPACE = "bench"
BENCH_STARTS_NAMESPACE = "bench-starts"  # scripts/bench_starts.py: where the worker starts the bench's jobs


@dataclass(frozen=True)
class Target:
    """One target of `make bench`, as judged: the measure, its value, the target, whether it is met, and
    what it was judged on (the median of the rounds, where there are rounds: never the best one)."""

    measure: str
    value: str
    target: str
    met: bool
    judged_on: str = ""


def median_of(values: list[float]) -> float:
    """The median a target is judged on (make bench never judges the best round)."""
    return float(statistics.median(values))


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_kubeconfig() -> str:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    log("starting the local control plane (scripts/cluster up) ...")
    up = subprocess.run(
        [str(REPO / "scripts" / "cluster"), "up"], capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        sys.exit(f"scripts/cluster up failed:\n{up.stderr[-3000:]}")
    return up.stdout.strip().splitlines()[-1]


def redis_url() -> str:
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:26379/1")
    return re.sub(r"/\d+$", "", base) + f"/{BENCH_REDIS_DB}"


def fresh_database(url: str) -> str:
    """A database of the bench's own beside `url`'s (same PostgreSQL, same role), `<name>_bench`, dropped and
    created afresh: each make bench measures an empty database, not the dead rows and unfolded counts that
    earlier runs and the test suite left in the one they share (the starts ran slower on it)."""
    import psycopg

    parsed = urlparse(url)
    name = f"{parsed.path.lstrip('/')}_bench"
    with psycopg.connect(urlunparse(parsed._replace(path="/postgres")), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path=f"/{name}"))


def setup_django(env: dict[str, str]) -> str:
    """Migrate, create the bench user, allow-list dispatch-kind; return the user's token."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create
    from jobs.models import Job
    from runtimes.models import AllowListEntry

    Job.objects.filter(owner__username="bench").delete()  # left by a bench run that was interrupted
    User.objects.filter(username="bench").delete()
    _, token = user_create(
        username="bench", role=roles.USER, namespaces=[BENCH_NAMESPACE, BENCH_STARTS_NAMESPACE]
    )
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind")
    return token


def cleanup_django() -> int:
    from django.contrib.auth.models import User

    from dispatch_site.models import AuditEvent
    from jobs.models import Job

    user = User.objects.get(username="bench")
    count, _ = Job.objects.filter(owner=user).delete()
    AuditEvent.objects.filter(actor_name="bench").delete()
    user.delete()
    return count


def wrk(url: str, token: str, body: dict[str, Any] | None = None, duration: str = "") -> dict[str, float]:
    script = f"""
wrk.headers["Authorization"] = "Token {token}"
wrk.headers["Content-Type"] = "application/json"
{"wrk.method = 'POST'" if body is not None else ""}
{"wrk.body = " + json.dumps(json.dumps(body)) if body is not None else ""}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(script)
    result = subprocess.run(
        [
            "wrk",
            "-t",
            "2",
            "-c",
            str(CONNECTIONS),
            "-d",
            duration or DURATION,
            "--latency",
            "-s",
            lua.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    Path(lua.name).unlink()
    out = result.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p99_ms = 0.0
    if p99:
        p99_ms = float(p99.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return {"rps": rps, "requests": total, "non_2xx": int(bad.group(1)) if bad else 0, "p99_ms": p99_ms}


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"server did not answer {url}")


# ---------------------------------------------------------------- starting the servers the benches measure

BENCH_SECRET_KEY = "bench-only-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz"


def server_env(
    database_url: str, kubeconfig: str, *, allowed_hosts: str = "127.0.0.1,localhost,testserver"
) -> dict[str, str]:
    """The environment of the dispatch processes a bench starts (web, worker, supervisor)."""
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url(),
        "KUBECONFIG": kubeconfig,
        "LOG_LEVEL": "WARNING",
        # One bench user sends hundreds of requests a second: the per-user API throttle would cap it.
        "THROTTLE_API_USER": "off",
        # As in production: DEBUG off (Django then keeps no per-query log); plain HTTP on 127.0.0.1.
        "DEBUG": "false",
        "SECRET_KEY": BENCH_SECRET_KEY,
        # testserver (the default): the dashboard bench's test client
        "ALLOWED_HOSTS": allowed_hosts,
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_HSTS_SECONDS": "0",
    }


def gunicorn_command(port: int, workers: int | None = None, threads: int | None = None) -> list[str]:
    """gunicorn serving dispatch on 127.0.0.1:`port` as `make up` and the Deployment run it: the one web
    server configuration (dispatch_site/gunicorn.conf.py: threaded workers, WEB_WORKERS x WEB_THREADS,
    keep-alive, the access log on stdout). `workers` and `threads` override it where a bench says why."""
    return [
        str(PY.parent / "gunicorn"),
        "-c",
        str(REPO / "dispatch_site" / "gunicorn.conf.py"),
        "--bind",
        f"127.0.0.1:{port}",
        *(["--workers", str(workers)] if workers is not None else []),
        *(["--threads", str(threads)] if threads is not None else []),
        "--log-level",
        "warning",
    ]


def web_shape() -> str:
    """The web server's processes x threads, as gunicorn_command runs it (the environment's WEB_WORKERS and
    WEB_THREADS, else the defaults)."""
    from dispatch_site.config import load_config

    config = load_config({**os.environ, "SECRET_KEY": BENCH_SECRET_KEY, "DEBUG": "false"})
    return f"{config.web_workers} processes x {config.web_threads} threads, gthread"


def web_log(name: str) -> IO[bytes]:
    """Where a bench's gunicorn writes its access log (stdout, as in `make up`): var/bench/<name>-web.log."""
    path = REPO / "var" / "bench" / f"{name}-web.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("wb")


def celery_worker_command(concurrency: int, name: str, prefetch: str = "") -> list[str]:
    """A Celery worker of dispatch's (threads pool, `concurrency` threads), named `name` (e.g. bench0@%h)."""
    extra = ["--prefetch-multiplier", prefetch] if prefetch else []
    return worker_command(pool="threads", concurrency=concurrency, name=name, loglevel="WARNING", extra=extra)


def migrated_django() -> None:
    """Django set up on the environment's settings and its database migrated."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# ------------------------------------------------------------ what the figures were measured on (issue 34)

DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")


def postgres_durability(database_url: str) -> dict[str, str]:
    """fsync, synchronous_commit and full_page_writes as the server at `database_url` reports them (SHOW)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        return {
            name: str((conn.execute(f"SHOW {name}").fetchone() or ("?",))[0]) for name in DURABILITY_SETTINGS
        }


def etcd_unsafe_no_fsync(kubeconfig: str) -> bool | None:
    """Whether the plane's running etcd was started with --unsafe-no-fsync: its pid from scripts/cluster's
    pid file (<state>/pids/etcd.pid, the state directory holding admin.kubeconfig), its command line from
    /proc. None when not known (a plane whose processes are not recorded beside the kubeconfig, or etcd not
    running)."""
    pid_file = Path(kubeconfig).resolve().parent / "pids" / "etcd.pid"
    try:
        pid = int(pid_file.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if not argv or b"etcd" not in Path(argv[0].decode(errors="replace")).name.encode():
        return None  # not running, or the pid now names another process
    return b"--unsafe-no-fsync" in argv
