"""The processes this run owns: its own PostgreSQL (durable settings) and Redis (on ports free at run time),
and dispatch's web server, Celery workers, Celery beat and pod watch in the shape `make up` runs them
(scripts/up): gunicorn from dispatch_site/gunicorn.conf.py (gthread), threads workers at their default
concurrency, the default intervals and timeouts; `--pool solo` runs solo workers instead."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dispatch_site.worker_command import worker_command
from scripts.chaoslib.common import PY, REPO

DURABILITY_SETTINGS: Final = ("fsync", "synchronous_commit", "full_page_writes")


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin() -> Path:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()],
    )
    if not found:
        sys.exit("chaos: PostgreSQL is not installed (scripts/services up installs it)")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class OwnPostgres:
    """A PostgreSQL server this run initialised in its own data directory and started itself."""

    def __init__(self, data: Path, port: int) -> None:
        self.data, self.port, self.bin = data, port, _pg_bin()
        self.log = data / "server.log"

    def init(self) -> None:
        self.data.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            # Durable, as a deployment runs it: the crash fault kills the server, and whatever a 202 answered
            # must be there after the crash recovery. fsync, synchronous_commit and full_page_writes stay at
            # PostgreSQL's defaults (on); the run reads them back (durability()).
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.data}'\nmax_connections = 300\n"
            )

    def start(self) -> int:
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return self.pid()

    def stop(self) -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"]
            ),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def processes(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, WAL writer, ...)."""
        postmaster = self.pid()
        return [postmaster, *children(postmaster)]

    def crash(self) -> list[int]:
        """SIGKILL the postmaster and all its processes at once, as a crash of the machine or an OOM kill of
        the container would: no shutdown checkpoint, nothing flushed that was not. Waits until every one is
        gone (a backend left would hold the shared memory and keep the next start out). The pids killed."""
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(running(pid) for pid in pids):
            time.sleep(0.05)
        return pids

    def durability(self) -> dict[str, str]:
        """fsync, synchronous_commit and full_page_writes as the running server reports them."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", connect_timeout=5
        ) as conn:
            return {
                name: str((conn.execute(f"SHOW {name}").fetchone() or ("?",))[0])
                for name in DURABILITY_SETTINGS
            }

    def answer(self) -> tuple[bool, str]:
        """(True, data directory) when a server accepts a connection on our port; (False, the error)."""
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", connect_timeout=3
            ) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
                return True, str(row[0] if row else "")
        except psycopg.OperationalError as exc:
            return False, str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE ROLE dispatch LOGIN CREATEDB PASSWORD 'dispatch'")
            conn.execute("CREATE DATABASE dispatch OWNER dispatch")


class OwnRedis:
    """A Redis server this run started (foreground, so its pid is ours), nothing kept on disk."""

    def __init__(self, directory: Path, port: int) -> None:
        self.dir, self.port = directory, port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            if self.ping()[0]:
                break
            time.sleep(0.1)
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def ping(self) -> tuple[bool, str]:
        """(True, the answering server's process_id) or (False, the error)."""
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2, socket_timeout=2)
            client.ping()
            return True, str(client.info("server").get("process_id"))
        except redis.RedisError as exc:
            return False, str(exc)


@dataclass(frozen=True)
class Shape:
    """How the run runs dispatch: `threads` is `make up`'s shape (scripts/up: a threads worker at its default
    concurrency, here two of them so a kill leaves one; gunicorn from dispatch_site/gunicorn.conf.py; every
    interval and timeout at its default); `solo` runs one-task solo workers instead (the shape of earlier
    runs), everything else the same."""

    pool: str = "threads"
    workers: int = 2

    def describe(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The shape as it runs, read from dispatch's own configuration of the run's environment."""
        from dispatch_site.config import load_config

        config = load_config(env)
        return {
            "workers": self.workers,
            "worker_pool": self.pool,
            "worker_concurrency": config.worker_concurrency if self.pool == "threads" else 1,
            "web": f"gunicorn -c dispatch_site/gunicorn.conf.py: {config.web_workers} processes x "
            f"{config.web_threads} threads, gthread",
            "beat": True,
            "pod_watch": "manage.py supervise",
            "supervisor_interval_seconds": config.supervisor_interval_seconds,
            "kube_timeout_seconds": config.kube_timeout_seconds,
            "overridden": sorted(k for k in TIMING_SETTINGS if k in env),
        }


# What the earlier runs shortened; `make up` leaves every one at its default, and so does the run.
TIMING_SETTINGS: Final = ("SUPERVISOR_INTERVAL_SECONDS", "KUBE_TIMEOUT_SECONDS", "WORKER_CONCURRENCY")


@dataclass
class Stack:
    env: dict[str, str]
    run_dir: Path
    web_port: int
    shape: Shape = field(default_factory=Shape)
    cwd: Path = REPO  # the checkout dispatch runs from (a broken copy: scripts/chaoslib/breaks.py)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each worker's Celery node name, by index
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    every_worker: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)  # (index, process)
    killed: set[int] = field(default_factory=set)  # pids this run SIGKILLed
    log_from: dict[int, int] = field(default_factory=dict)  # worker index -> its log's size when it started

    def worker_log_since_start(self, index: int) -> str:
        """What the running worker `index` logged (its log is appended to by every worker it replaced)."""
        with (self.run_dir / f"worker-{index}.log").open("rb") as log:
            log.seek(self.log_from.get(index, 0))
            return log.read().decode(errors="replace")

    def workers_that_exited(self) -> list[dict[str, Any]]:
        """Workers that ended without this run killing them (a worker process should never exit)."""
        ended = []
        for index, process in self.every_worker:
            if process.poll() is None or process.pid in self.killed:
                continue
            log_text = (self.run_dir / f"worker-{index}.log").read_text(errors="replace")
            why = [line[:300] for line in log_text.splitlines() if "Unrecoverable error" in line]
            ended.append({"worker": index, "pid": process.pid, "exit": process.returncode, "log": why[-3:]})
        return ended

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (self.run_dir / f"{name}.log").open("ab")
        return subprocess.Popen(args, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def start_worker(self, index: int) -> subprocess.Popen[bytes]:
        name = f"chaos{index}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        log_path = self.run_dir / f"worker-{index}.log"
        self.log_from[index] = log_path.stat().st_size if log_path.exists() else 0
        # As scripts/up starts it: the pool, nothing else (its concurrency is the settings' default).
        process = self._spawn(f"worker-{index}", worker_command(pool=self.shape.pool, name=name, python=PY))
        if index < len(self.workers):
            self.workers[index], self.names[index] = process, name
        else:
            self.workers.append(process)
            self.names.append(name)
        self.every_worker.append((index, process))
        return process

    def start(self, pod_watch: bool) -> None:
        gunicorn = str(Path(PY).parent / "gunicorn")
        config = str(self.cwd / "dispatch_site" / "gunicorn.conf.py")
        self.others.append(
            self._spawn("web", [gunicorn, "-c", config, "--bind", f"127.0.0.1:{self.web_port}"])
        )
        self.others.append(
            self._spawn(
                "beat",
                [
                    PY,
                    "-m",
                    "celery",
                    "-A",
                    "dispatch_site",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "-s",
                    str(self.run_dir / "celerybeat-schedule"),
                ],
            )
        )
        if pod_watch:
            self.others.append(self._spawn("supervise", [PY, "manage.py", "supervise"]))
        for i in range(self.shape.workers):
            self.start_worker(i)

    def stop(self) -> None:
        for process in [*self.workers, *self.others]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, *self.others]:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
