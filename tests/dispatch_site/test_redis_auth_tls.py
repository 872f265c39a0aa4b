"""A Redis with AUTH (an ACL user with a password) behind TLS only, as deploy/overlays/example runs it:
dispatch, configured from REDIS_URL alone, reaches it with every Redis user it has (Celery's broker, the
throttles' cache, the long-request slots' client, /readyz's check), and a URL without the password or without
a way to check the server's certificate gets nothing but an error that names Redis.

The redis-server is started here (its pid is the test's), with only a TLS port: a client that spoke plain TCP
to it would get no answer. Each probe runs in a process of its own, whose settings come from the environment
as a pod's do."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.client.conftest import REPO, free_port
from tests.support.redis_server import wait_for

EXAMPLE = REPO / "deploy" / "overlays" / "example"


def _example_secrets() -> tuple[str, str, str]:
    """The example overlay's Redis user and password (secret.yaml's REDIS_URL) and ACL (redis.yaml)."""
    secret = yaml.safe_load((EXAMPLE / "secret.yaml").read_text())
    url = urlparse(secret["stringData"]["REDIS_URL"])
    [acl] = [
        doc["stringData"]["users.acl"]
        for doc in yaml.safe_load_all((EXAMPLE / "redis.yaml").read_text())
        if doc["kind"] == "Secret"
    ]
    assert url.scheme == "rediss" and url.username and url.password
    return url.username, url.password, acl


USER, PASSWORD, ACL = _example_secrets()

# What every Redis user of dispatch does with REDIS_URL, in a process configured as a pod is (settings from
# the environment); prints what each one saw.
PROBE = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
django.setup()
from django.conf import settings
from django.core.cache import caches
from dispatch_site.celery import app
from dispatch_site.health import check_redis, one_line
from dispatch_site.redisclient import client_for

seen = {}
try:
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        app.send_task("netpol.probe", queue="netpol-probe", connection=connection)
    seen["broker"] = "sent"
except Exception as exc:
    seen["broker"] = one_line(exc)
try:
    seen["queued"] = client_for(settings.REDIS_URL).llen("netpol-probe")
except Exception as exc:
    seen["queued"] = one_line(exc)
try:
    caches["throttle"].set("netpol", "counted", 30)
    seen["throttle"] = caches["throttle"].get("netpol")
except Exception as exc:
    seen["throttle"] = one_line(exc)
seen["readiness"] = check_redis()
print(json.dumps(seen))
"""


@dataclass(frozen=True)
class TlsRedis:
    port: int
    ca: Path  # the CA that signed the server's certificate

    def url(self, userinfo: str = f"{USER}:{PASSWORD}@", query: str = "") -> str:
        return f"rediss://{userinfo}127.0.0.1:{self.port}/0{query}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(directory: Path) -> None:
    """A CA and a server certificate it signed, for 127.0.0.1 (what the test connects to)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test redis CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=directory)  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.ext", "-out", "server.crt", cwd=directory)  # fmt: skip


def _answers_tls(server: TlsRedis) -> bool:
    import redis

    client = redis.Redis.from_url(server.url(query=f"?ssl_ca_certs={server.ca}"), socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _pod_command(tmp_path: Path, port: int) -> list[str]:
    """The example overlay's Redis container command as it is (redis.yaml), its mounts and port made this
    test's: /tls's tls.crt, tls.key and ca.crt, /acl/users.acl and /data here, and a free port."""
    [deployment] = [
        d for d in yaml.safe_load_all((EXAMPLE / "redis.yaml").read_text()) if d["kind"] == "Deployment"
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    files = {
        "/tls/tls.crt": tmp_path / "server.crt",
        "/tls/tls.key": tmp_path / "server.key",
        "/tls/ca.crt": tmp_path / "ca.crt",
        "/acl/users.acl": tmp_path / "users.acl",
        "/data": tmp_path / "data",
        "6379": port,
    }
    command = [str(files.get(arg, arg)) for arg in container["command"]]
    assert "--tls-port" in command and command[command.index("--port") + 1] == "0", command
    return command


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    """redis-server as the example overlay's pod runs it (deploy/overlays/example/redis.yaml's command: no
    plain port, TLS, the overlay's ACL with the default user off and dispatch's user with its password),
    on a free port."""
    _certificates(tmp_path)
    (tmp_path / "users.acl").write_text(ACL)
    server = TlsRedis(free_port(), tmp_path / "ca.crt")
    (tmp_path / "data").mkdir()
    with (tmp_path / "redis.log").open("ab") as log:
        process = subprocess.Popen(
            [*_pod_command(tmp_path, server.port), "--bind", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: _answers_tls(server), 20, f"redis-server (TLS) on {server.port}",
                 lambda: (tmp_path / "redis.log").read_text())  # fmt: skip
        yield server
    finally:
        process.kill()  # the redis-server this fixture started, by its pid
        process.wait(timeout=20)


def _env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """A pod's settings: from the environment alone."""
    return {
        "PATH": "/usr/bin:/bin",
        "DEBUG": "false",
        "SECRET_KEY": "x" * 50,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'probe.sqlite3'}",
        "REDIS_URL": redis_url,
    }


def _probe(redis_url: str, tmp_path: Path, **env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env={**_env(redis_url, tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return seen


def _preflight(redis_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "preflight", "--no-kubernetes"],
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "DEBUG": "1",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'probe.sqlite3'}",
            "REDIS_URL": redis_url,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_redis_user_of_dispatch_reaches_redis_over_tls_with_the_password(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    url = tls_redis.url(query=f"?ssl_ca_certs={tls_redis.ca}")
    seen = _probe(url, tmp_path)
    assert seen == {"broker": "sent", "queued": 1, "throttle": "counted", "readiness": {"ok": True}}
    assert _preflight(url, tmp_path).returncode == 0
    # A worker, as deploy/ runs it, consumes under the ACL: it takes the message the probe left.
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dispatch_site", "worker", "--pool", "threads",
             "--without-gossip", "--without-mingle", "-Q", "netpol-probe", "--loglevel", "INFO"],
            cwd=REPO, env={**_env(url, tmp_path), "WORKER_CONCURRENCY": "2"},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: "unregistered task of type 'netpol.probe'" in log.read_text(), 60,
                 "the worker took the message", log.read_text)  # fmt: skip
        assert "NOPERM" not in log.read_text()
        assert PASSWORD not in log.read_text()  # its banner shows the broker's URL with the password masked
    finally:
        worker.kill()  # the worker this test started, by its pid
        worker.wait(timeout=20)


def test_a_rediss_url_checks_the_certificate_for_the_broker_too(tls_redis: TlsRedis, tmp_path: Path) -> None:
    # The CA among the system's (OpenSSL's default store, here SSL_CERT_FILE), no ssl_ option in the URL:
    # kombu, under dispatch's broker transport, would have spoken plain TCP to the TLS port.
    seen = _probe(tls_redis.url(), tmp_path, SSL_CERT_FILE=str(tls_redis.ca))
    assert seen == {"broker": "sent", "queued": 1, "throttle": "counted", "readiness": {"ok": True}}
    # A server whose certificate nothing vouches for gets nothing from any of them: kombu would otherwise skip
    # the check (ssl_cert_reqs none, with only a warning in the log).
    seen = _probe(tls_redis.url(), tmp_path)
    for user in ("broker", "queued", "throttle"):
        assert "certificate verify failed" in str(seen[user]), seen
    readiness = seen["readiness"]
    assert isinstance(readiness, dict) and readiness["ok"] is False
    assert "certificate verify failed" in readiness["error"]


def test_without_the_password_redis_refuses_and_the_error_names_redis(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    without = tls_redis.url(userinfo="", query=f"?ssl_ca_certs={tls_redis.ca}")
    seen = _probe(without, tmp_path)
    for user in ("broker", "queued", "throttle"):
        assert "Authentication" in str(seen[user]) or "NOAUTH" in str(seen[user]), seen
    readiness = seen["readiness"]
    assert isinstance(readiness, dict) and readiness["ok"] is False
    assert readiness["error"].startswith("AuthenticationError:"), readiness
    wrong = tls_redis.url(userinfo=f"{USER}:not-the-password@", query=f"?ssl_ca_certs={tls_redis.ca}")
    result = _preflight(wrong, tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("CommandError: dependency down: redis: AuthenticationError:"), line
    assert "not-the-password" not in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("rediss://u:pw@h:6379/0?ssl_cert_reqs=none", "ssl_cert_reqs='none' would not check"),
        ("rediss://u:p,w@h:6379/0", "percent-encode"),
    ],
)
def test_a_redis_url_that_would_not_protect_the_broker_is_refused_without_showing_the_password(
    url: str, message: str
) -> None:
    from dispatch_site.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message) as refused:
        load_config({"DEBUG": "1", "REDIS_URL": url})
    assert ":***@" in str(refused.value) and "pw" not in str(refused.value).replace("***", "")
