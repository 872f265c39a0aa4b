"""PostgreSQL over TLS as docs/deploy.md tells a platform that brings its own: `DATABASE_URL` with
`?sslmode=verify-full&sslrootcert=<CA file>`. A real PostgreSQL started here (its own data directory, its pid
the test's), with TLS on under a certificate for 127.0.0.1 from a CA of the test's own, and pg_hba refusing
the dispatch role any connection without TLS. Each probe is a process configured from the environment, as a
pod is: dispatch connects only over TLS it has checked, and any other setting gets one line naming the
database, never the password."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from scripts.chaoslib.stack import OwnPostgres, free_port
from tests.jobs.observability.hostile import LocalCA, make_local_ca

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "pg-tls-secret-pw"

SSL_PROBE = """
import os
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    print(*cursor.fetchone())
"""


@dataclass(frozen=True)
class TlsPostgres:
    port: int
    ca: Path

    def url(self, query: str) -> str:
        return f"postgres://dispatch:{PASSWORD}@127.0.0.1:{self.port}/dispatch{query}"


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsPostgres]:
    ca: LocalCA = make_local_ca(tmp_path_factory.mktemp("pg-ca"))
    # The server runs as the postgres user, who cannot enter pytest's private temporary directories.
    home = Path(tempfile.mkdtemp(prefix="dispatch-pg-tls-", dir="/var/tmp"))
    home.chmod(0o755)
    server = OwnPostgres(home / "data", free_port())
    server.init()
    for name, mode in (("server.pem", 0o644), ("server.key", 0o600)):
        target = server.data / name
        shutil.copy(ca.ca.parent / name, target)
        target.chmod(mode)
        if os.geteuid() == 0:
            shutil.chown(target, "postgres", "postgres")
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write("ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n")
    hba = server.data / "pg_hba.conf"
    # dispatch's role: over TLS with its password only; anything else of it is refused.
    hba.write_text(
        "hostnossl all dispatch 127.0.0.1/32 reject\n"
        "hostssl all dispatch 127.0.0.1/32 scram-sha-256\n" + hba.read_text()
    )
    server.start()
    try:
        server.create_database()
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(server.port),
                "-U",
                "postgres",
                "-c",
                f"ALTER ROLE dispatch PASSWORD '{PASSWORD}'",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        yield TlsPostgres(server.port, ca.ca)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def _run(code_or_command: list[str], database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        code_or_command,
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "DEBUG": "1",
            "DATABASE_URL": database_url,
            "REDIS_URL": settings.REDIS_URL,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dispatch_connects_over_tls_it_has_checked(tls_postgres: TlsPostgres) -> None:
    url = tls_postgres.url(f"?sslmode=verify-full&sslrootcert={tls_postgres.ca}")
    preflight = _run([sys.executable, "manage.py", "preflight", "--no-kubernetes"], url)
    assert preflight.returncode == 0, preflight.stderr
    seen = _run([sys.executable, "-c", SSL_PROBE], url)
    assert seen.returncode == 0, seen.stderr
    ssl, version = seen.stdout.split()
    assert ssl == "True" and version.startswith("TLSv1."), seen.stdout


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("?sslmode=disable", "TLS turned off: the server refuses dispatch's role in plain text"),
        ("?sslmode=verify-full", "no CA file to check the server's certificate against"),
        ("?sslmode=verify-full&sslrootcert={other}", "a CA that did not sign the server's certificate"),
    ],
)
def test_anything_but_checked_tls_gets_one_line_naming_the_database(
    tls_postgres: TlsPostgres, query: str, why: str, tmp_path: Path
) -> None:
    other = make_local_ca(tmp_path).ca
    url = tls_postgres.url(query.format(other=other))
    preflight = _run([sys.executable, "manage.py", "preflight", "--no-kubernetes"], url)
    assert preflight.returncode == 2, (why, preflight.stdout, preflight.stderr)
    [line] = preflight.stderr.strip().splitlines()
    assert line.startswith("CommandError: dependency down: database: OperationalError:"), (why, line)
    assert PASSWORD not in preflight.stderr and "Traceback" not in preflight.stderr, why
