"""A PostgreSQL instance of the bench's own, with PostgreSQL's durable defaults (fsync, synchronous_commit and
full_page_writes on), started like scripts/services starts the test one (Debian's binaries, its own port and
data directory, 127.0.0.1 only) and removed afterwards. The shared test instance runs with all three off
(scripts/services: throwaway test data), and fsync and full_page_writes cannot be turned on per session, so
submissions are measured here."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from scripts.bench_common import free_port, log

DURABLE_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")


def _pg_bin() -> Path:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: [int(x) for x in p.parent.name.split(".")]
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL binaries not found under /usr/lib/postgresql (scripts/services up installs them)"
        )
    return found[-1]


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def durable_postgres() -> Iterator[tuple[str, dict[str, str]]]:
    """(DATABASE_URL, the durability settings as the server reports them)."""
    pg = _pg_bin()
    port = free_port()
    data = Path(f"/var/tmp/dispatch-bench-pg-{port}")
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        _as_postgres([str(pg / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    with (data / "postgresql.conf").open("a") as conf:
        # Only where it listens: every durability setting keeps PostgreSQL's default.
        conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{data}'\n")
    subprocess.run(
        _as_postgres(
            [str(pg / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "-t", "60", "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:

        def psql(sql: str) -> str:
            done = subprocess.run(
                [str(pg / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-Atc", sql],
                check=True,
                capture_output=True,
                text=True,
            )
            return done.stdout.strip()

        psql("CREATE ROLE dispatch LOGIN PASSWORD 'dispatch'")
        psql("CREATE DATABASE dispatch_bench OWNER dispatch")
        settings = {name: psql(f"SHOW {name}") for name in DURABLE_SETTINGS}
        log(f"durable PostgreSQL on 127.0.0.1:{port} ({', '.join(f'{k}={v}' for k, v in settings.items())})")
        settings["data"] = str(data)  # postmaster.pid names the server process (CPU accounting)
        yield f"postgres://dispatch:dispatch@127.0.0.1:{port}/dispatch_bench", settings
    finally:
        subprocess.run(
            _as_postgres([str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)
