"""Configuration from the environment: typed, with safe defaults and one clear error per bad value.

Kept free of Django imports so `manage.py` can report a bad setting in one line before Django starts.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from dispatch_site.names import is_dns1123_label, is_dns1123_subdomain

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
LOCAL_CLUSTER_KUBECONFIG = VAR_DIR / "cluster" / "admin.kubeconfig"
LOCAL_WORKER_KUBECONFIGS = VAR_DIR / "cluster" / "workers"  # scripts/cluster up --multikueue

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


class ConfigError(Exception):
    """A setting that cannot be used; the message names the variable and what is wrong."""


# Tasks one Celery worker runs at once, in threads. A start spends most of its time waiting on the API server
# (about 0.3 s each under a burst on 2 cores), so the pool's throughput is its threads over that wait until
# the CPU runs out. Measured side by side (scripts/bench_starts.py, 2 cores, the control plane on the same
# machine): 16 threads gave 35.9-49.2 TrainJobs/s (the client at 16: 44.6-61.2), 32 threads 50.7-58.5 (the
# client at 32: 65.7-78.4), with the worker's CPU per start unchanged (6.7-9.2 ms). Each thread keeps its own
# PostgreSQL session: plan the database's max_connections for it.
DEFAULT_WORKER_CONCURRENCY = 32
# The Trainer controller manager's leader-election Lease (TRAINER_LEADER_LEASE, "<namespace>/<name>"): the
# release runs the manager in kubeflow-system with leaderElection.resourceName trainer.kubeflow.org (v2.3.0
# manifests/base/manager/controller_manager_config.yaml, manifests/overlays/manager/kustomization.yaml). A
# delete reads it to tell whether the Trainer is running (jobs.stopping); deploy/rbac/trainer-lease.yaml
# grants that read on this one Lease.
DEFAULT_TRAINER_LEADER_LEASE: tuple[str, str] = ("kubeflow-system", "trainer.kubeflow.org")


@dataclass(frozen=True)
class Config:
    debug: bool
    secret_key: str
    # Django's key rotation: older keys that still verify (sessions, signatures) and decrypt the secrets
    # stored encrypted (dispatch_site.encrypted); comma-separated in SECRET_KEY_FALLBACKS.
    secret_key_fallbacks: tuple[str, ...]
    allowed_hosts: tuple[str, ...]
    database: dict[str, Any]
    database_url: str
    redis_url: str
    kubeconfig: str  # "" means in-cluster configuration
    # MultiKueue: <dir>/<MultiKueueCluster name>.kubeconfig, dispatch's credentials on each worker cluster.
    worker_kubeconfig_dir: str
    log_level: str
    kube_timeout_seconds: float
    api_token_ttl_days: int = 90
    # Throttle rates "N/period" (period s, m, h or d) or None for no limit.
    login_rate_user: str | None = "10/m"
    login_rate_address: str | None = "30/m"
    api_rate_user: str | None = "3000/m"
    # The reverse proxies in front of dispatch (addresses or CIDRs): only they may say, in X-Forwarded-For,
    # whom a request came from (dispatch_site.client_address).
    trusted_proxies: tuple[str, ...] = ()
    secure_ssl_redirect: bool = False
    secure_proxy_ssl_header: tuple[str, str] | None = None
    hsts_seconds: int = 0
    readyz_detail_addresses: tuple[str, ...] = ()
    # Supervision (jobs.supervision): the sync interval, and how long a waiting cause may last.
    supervisor_interval_seconds: int = 10
    no_capacity_after_seconds: int = 300
    stuck_after_seconds: int = 300
    inadmissible_after_seconds: int = 300  # a Kueue Workload found inadmissible this long fails the job
    # Interactive sessions: the longest a session may live (the sweep closes it then).
    session_max_lifetime_seconds: int = 24 * 3600
    session_failed_grace_seconds: int = 600
    # The web server (dispatch_site/gunicorn.conf.py) and its long requests (dispatch_site.longrequests).
    web_workers: int = 2
    web_threads: int = 16
    long_requests_per_process: int = 8
    long_requests_per_user: int = 4
    # Observability (jobs.observability): who may scrape /metrics, and how webhooks are delivered.
    metrics_token: str = ""
    webhook_retry_schedule: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)
    webhook_timeout_seconds: float = 10.0  # one attempt's whole budget: connect, send, answer
    webhook_allow_http: bool = False
    webhook_allow_private_addresses: bool = False
    webhook_secret_grace_seconds: int = 24 * 3600
    webhook_sweep_seconds: int = 10
    webhook_endpoints_per_user: int = 10
    # Ended attempts' details (evidence, pods, ranks, log tail, timeline) are pruned after this many days; the
    # job, its attempts' states, causes and usage stay (jobs.usage). 0: never.
    history_retention_days: int = 0
    webhook_ca_bundle: str = ""  # PEM roots for receivers' certificates; "" = certifi's
    # The Celery worker runs this many tasks at once, in threads (a start waits on the API server); the
    # Kubernetes client keeps as many connections.
    worker_concurrency: int = DEFAULT_WORKER_CONCURRENCY
    # Celery's remote control (broadcast commands such as shutdown, pool_shrink, revoke, add_consumer over the
    # broker): off, since any writer to the broker could send them; a harness that pings its worker sets it.
    worker_remote_control: bool = False
    # The Trainer controller manager's leader-election Lease (namespace, name): TRAINER_LEADER_LEASE.
    trainer_leader_lease: tuple[str, str] = DEFAULT_TRAINER_LEADER_LEASE


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use one of: 1, 0, true, false, yes, no)")


RATE_PERIODS = ("s", "m", "h", "d")
OFF_WORDS = ("off", "none", "0")


def _parse_rate(name: str, raw: str) -> str | None:
    """A throttle rate: "N/period" with period s, m, h or d (or second, minute, hour, day); "off" for none."""
    value = raw.strip().lower()
    if value in OFF_WORDS:
        return None
    count, _, period = value.partition("/")
    if not count.isdigit() or int(count) < 1 or not period or period[0] not in RATE_PERIODS:
        raise ConfigError(f"{name}={raw!r} is not a rate: use N/s, N/m, N/h or N/d (e.g. 10/m), or off")
    return f"{int(count)}/{period[0]}"


def _parse_int(name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _parse_schedule(name: str, raw: str) -> tuple[float, ...]:
    """Seconds between attempts, comma-separated (e.g. 5,300,1800): each a positive number."""
    try:
        values = tuple(float(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected seconds separated by commas, e.g. 5,300,1800") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"{name}={raw!r}: expected at least one positive number of seconds")
    return values


def _parse_trusted_proxies(env: Mapping[str, str]) -> tuple[str, ...]:
    """TRUSTED_PROXIES: comma-separated addresses or CIDRs of the proxies in front of dispatch. NUM_PROXIES (a
    count of proxies) is refused when above 0: a count cannot tell a proxy from a client that bypasses it."""
    from dispatch_site.client_address import BadProxy, parse_networks

    raw = env.get("TRUSTED_PROXIES", "")
    try:
        networks = parse_networks(raw.split(","))
    except BadProxy as exc:
        raise ConfigError(f"TRUSTED_PROXIES={raw!r}: {exc}") from None
    count = env.get("NUM_PROXIES", "0").strip() or "0"
    if count != "0":
        raise ConfigError(
            f"NUM_PROXIES={count!r} is no longer read: a count of proxies lets a client that bypasses them "
            "choose its own address; list the proxies' addresses or CIDRs in TRUSTED_PROXIES instead (e.g. "
            "TRUSTED_PROXIES=10.0.0.0/8), and unset NUM_PROXIES"
        )
    return tuple(str(n) for n in networks)


def _parse_lease(name: str, raw: str) -> tuple[str, str]:
    namespace, _, lease = raw.strip().partition("/")
    if not is_dns1123_label(namespace) or not is_dns1123_subdomain(lease):
        raise ConfigError(
            f"{name}={raw!r} is not <namespace>/<name> (e.g. {'/'.join(DEFAULT_TRAINER_LEADER_LEASE)})"
        )
    return namespace, lease


def _parse_ca_bundle(raw: str) -> str:
    """WEBHOOK_CA_BUNDLE: a PEM file of the roots webhook receivers' certificates are verified against."""
    path = raw.strip()
    if path and not Path(path).is_file():
        raise ConfigError(f"WEBHOOK_CA_BUNDLE={raw!r} is not a file (a PEM bundle of CA certificates)")
    return path


def _parse_proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """SECURE_PROXY_SSL_HEADER as "Header-Name=value", e.g. X-Forwarded-Proto=https; empty for none."""
    if not raw.strip():
        return None
    header, sep, value = raw.partition("=")
    header, value = header.strip(), value.strip()
    if not sep or not header or not value:
        raise ConfigError(
            f"SECURE_PROXY_SSL_HEADER={raw!r} must be Header-Name=value, e.g. X-Forwarded-Proto=https"
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


# The embedded default serves the web workers, the Celery worker's threads, beat and the supervisor at once.
# SQLite allows one writer at a time; "database is locked" came from a transaction that began as a reader and
# then had to become the writer while another held the lock (SQLite fails that at once, whatever the busy
# timeout). So: every transaction takes the write lock when it begins (IMMEDIATE, Django 5.1+), and waits
# for it up to the busy timeout; WAL lets readers go on while one writes; synchronous=NORMAL is durable in
# WAL mode except for the last transactions on a power loss (not a process crash): fine for the default.
SQLITE_BUSY_TIMEOUT_SECONDS = 30
SQLITE_OPTIONS: dict[str, Any] = {
    "timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def _parse_database(url: str) -> dict[str, Any]:
    import dj_database_url

    scheme = urlparse(url).scheme
    if scheme not in ("sqlite", "postgres", "postgresql", "pgsql"):
        raise ConfigError(
            f"DATABASE_URL={_redacted(url)!r} is not supported: use postgres://user:pass@host:port/name or sqlite:///path"
        )
    try:
        database: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=60))
    except ValueError as exc:
        raise ConfigError(f"DATABASE_URL={_redacted(url)!r} cannot be parsed: {exc}") from None
    if database["ENGINE"].endswith("sqlite3"):
        database["CONN_MAX_AGE"] = 0
        database["OPTIONS"] = SQLITE_OPTIONS
    elif not database.get("NAME"):
        raise ConfigError(f"DATABASE_URL={_redacted(url)!r} names no database")
    else:
        options = database.get("OPTIONS", {})
        database["OPTIONS"] = {**options, **_prepare_threshold(url, options)}
    return database


# How many times a PostgreSQL connection runs one of dispatch's written-out hot statements (dispatch_site.sql:
# a start's claim, fences and record, the grant check) before psycopg prepares it: psycopg's own default.
# Django's ORM queries are never prepared (Django binds their parameters on the client). A pooler that does
# not keep prepared statements per client (PgBouncer before 1.21, or with max_prepared_statements = 0, in
# transaction mode) needs `?prepare_threshold=none` on DATABASE_URL.
PREPARE_THRESHOLD = 5


def _prepare_threshold(url: str, options: dict[str, Any]) -> dict[str, Any]:
    value = options.get("prepare_threshold", PREPARE_THRESHOLD)
    if isinstance(value, str) and value.lower() == "none":
        return {"prepare_threshold": None}
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"DATABASE_URL={_redacted(url)!r}: prepare_threshold must be a whole number of calls or none, "
            f"not {value!r}"
        )
    return {"prepare_threshold": value}


def _redacted(url: str) -> str:
    """The URL with its password replaced, for an error message (DATABASE_URL and REDIS_URL carry one)."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    return parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)).geturl()


# What the URL may say about certificate checks: kombu and redis-py both read these words.
REDIS_CERT_REQS = ("required", "optional")


def _parse_redis_url(url: str) -> str:
    """REDIS_URL as every Redis user of dispatch reads it: Celery's broker (kombu), the throttles' cache
    (Django's RedisCache), the long-request slots and login counters (dispatch_site.redisclient) and /readyz
    (redis-py). ``rediss://user:password@host:port/db?ssl_ca_certs=/path/ca.crt`` speaks TLS and checks the
    server's certificate against that CA (the system's CAs without it). kombu alone would not check it, nor,
    under dispatch's own broker transport, speak TLS at all, unless the URL carries an ssl_ option: so a
    rediss URL that does not say ssl_cert_reqs gets ssl_cert_reqs=required here, and none is refused."""
    shown = _redacted(url)
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"REDIS_URL={shown!r} is not a redis:// URL")
    if parsed.scheme != "unix" and not parsed.hostname:
        raise ConfigError(f"REDIS_URL={shown!r} names no host")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(f"REDIS_URL={shown!r} has an invalid port") from None
    if "," in url or ";" in url:
        # Django's RedisCache splits its LOCATION into several servers at these.
        raise ConfigError(f"REDIS_URL={shown!r}: percent-encode ',' and ';' (%2C, %3B), in the password too")
    if parsed.scheme == "rediss":
        query = parse_qs(parsed.query)
        reqs = query.get("ssl_cert_reqs", ["required"])[-1]
        if reqs not in REDIS_CERT_REQS:
            raise ConfigError(
                f"REDIS_URL={shown!r}: ssl_cert_reqs={reqs!r} would not check the server's certificate: "
                "use required (the default) and name the CA with ssl_ca_certs=<path>"
            )
        if "ssl_cert_reqs" not in query:
            url = parsed._replace(
                query="&".join(q for q in (parsed.query, "ssl_cert_reqs=required") if q)
            ).geturl()
    return url


def _development_secret_key() -> str:
    """A key generated once per checkout, so sessions survive restarts during development."""
    path = VAR_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    debug = _parse_bool("DEBUG", env.get("DEBUG", "false"))

    secret_key = env.get("SECRET_KEY", "")
    if not secret_key:
        if not debug:
            raise ConfigError(
                "SECRET_KEY is required when DEBUG is off (DEBUG defaults to false; for a local run set"
                " DEBUG=true, as `make up` does)"
            )
        secret_key = _development_secret_key()

    hosts_raw = env.get("ALLOWED_HOSTS", "127.0.0.1,localhost" if not debug else "*")
    allowed_hosts = tuple(h.strip() for h in hosts_raw.split(",") if h.strip())
    if not allowed_hosts:
        raise ConfigError("ALLOWED_HOSTS is empty: name at least one host, e.g. dispatch.example.com")

    database_url = env.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'dispatch.sqlite3'}")
    database = _parse_database(database_url)
    redis_url = _parse_redis_url(env.get("REDIS_URL", "redis://127.0.0.1:26379/0"))

    kubeconfig = env.get("KUBECONFIG", "")
    if kubeconfig:
        first = kubeconfig.split(os.pathsep)[0]
        if not Path(first).is_file():
            raise ConfigError(f"KUBECONFIG={kubeconfig!r}: no such file")
    elif LOCAL_CLUSTER_KUBECONFIG.is_file() and "KUBERNETES_SERVICE_HOST" not in env:
        # The local control plane from `scripts/cluster up`, when nothing else is configured.
        kubeconfig = str(LOCAL_CLUSTER_KUBECONFIG)
    worker_kubeconfig_dir = env.get("WORKER_KUBECONFIG_DIR", "")
    if worker_kubeconfig_dir and not Path(worker_kubeconfig_dir).is_dir():
        raise ConfigError(f"WORKER_KUBECONFIG_DIR={worker_kubeconfig_dir!r}: no such directory")
    if not worker_kubeconfig_dir and kubeconfig == str(LOCAL_CLUSTER_KUBECONFIG):
        # The local plane's workers, whenever `up --multikueue` starts them (read at each lookup).
        worker_kubeconfig_dir = str(LOCAL_WORKER_KUBECONFIGS)

    log_level = env.get("LOG_LEVEL", "INFO").upper()
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"LOG_LEVEL={log_level!r} is not one of {', '.join(LOG_LEVELS)}")

    timeout_raw = env.get("KUBE_TIMEOUT_SECONDS", "10")
    try:
        kube_timeout = float(timeout_raw)
    except ValueError:
        raise ConfigError(f"KUBE_TIMEOUT_SECONDS={timeout_raw!r} is not a number") from None
    if kube_timeout <= 0:
        raise ConfigError(f"KUBE_TIMEOUT_SECONDS={timeout_raw!r} must be positive")

    api_token_ttl_days = _parse_int("API_TOKEN_TTL_DAYS", env.get("API_TOKEN_TTL_DAYS", "90"), 1)
    login_rate_user = _parse_rate("THROTTLE_LOGIN_USER", env.get("THROTTLE_LOGIN_USER", "10/m"))
    login_rate_address = _parse_rate("THROTTLE_LOGIN_ADDRESS", env.get("THROTTLE_LOGIN_ADDRESS", "30/m"))
    api_rate_user = _parse_rate("THROTTLE_API_USER", env.get("THROTTLE_API_USER", "3000/m"))
    trusted_proxies = _parse_trusted_proxies(env)
    proxy_ssl_header = _parse_proxy_ssl_header(env.get("SECURE_PROXY_SSL_HEADER", ""))
    ssl_redirect = _parse_bool(
        "SECURE_SSL_REDIRECT", env.get("SECURE_SSL_REDIRECT", "false" if debug else "true")
    )
    hsts_seconds = _parse_int(
        "SECURE_HSTS_SECONDS", env.get("SECURE_HSTS_SECONDS", "0" if debug else "31536000"), 0
    )
    readyz_raw = env.get("READYZ_DETAIL_ADDRESSES", "")
    readyz_detail_addresses = tuple(a.strip() for a in readyz_raw.split(",") if a.strip())

    supervisor_interval = _parse_int(
        "SUPERVISOR_INTERVAL_SECONDS", env.get("SUPERVISOR_INTERVAL_SECONDS", "10"), 1
    )
    no_capacity_after = _parse_int(
        "NO_CAPACITY_AFTER_SECONDS", env.get("NO_CAPACITY_AFTER_SECONDS", "300"), 0
    )
    stuck_after = _parse_int("STUCK_AFTER_SECONDS", env.get("STUCK_AFTER_SECONDS", "300"), 0)
    inadmissible_after = _parse_int(
        "INADMISSIBLE_AFTER_SECONDS", env.get("INADMISSIBLE_AFTER_SECONDS", "300"), 0
    )
    web_workers = _parse_int("WEB_WORKERS", env.get("WEB_WORKERS", "2"), 1)
    web_threads = _parse_int("WEB_THREADS", env.get("WEB_THREADS", "16"), 2)
    long_per_process = _parse_int(
        "LONG_REQUESTS_PER_PROCESS", env.get("LONG_REQUESTS_PER_PROCESS", str(web_threads // 2)), 1
    )
    if long_per_process >= web_threads:
        raise ConfigError(
            f"LONG_REQUESTS_PER_PROCESS={long_per_process} must be below WEB_THREADS={web_threads}: the "
            "threads left over serve everything else, the probes included"
        )
    long_per_user = _parse_int("LONG_REQUESTS_PER_USER", env.get("LONG_REQUESTS_PER_USER", "4"), 1)
    session_max_lifetime = _parse_int(
        "SESSION_MAX_LIFETIME_SECONDS", env.get("SESSION_MAX_LIFETIME_SECONDS", str(24 * 3600)), 60
    )
    session_failed_grace = _parse_int(
        "SESSION_FAILED_GRACE_SECONDS", env.get("SESSION_FAILED_GRACE_SECONDS", "600"), 0
    )

    webhook_timeout_raw = env.get("WEBHOOK_TIMEOUT_SECONDS", "10")
    try:
        webhook_timeout = float(webhook_timeout_raw)
    except ValueError:
        raise ConfigError(f"WEBHOOK_TIMEOUT_SECONDS={webhook_timeout_raw!r} is not a number") from None
    if webhook_timeout <= 0:
        raise ConfigError(f"WEBHOOK_TIMEOUT_SECONDS={webhook_timeout_raw!r} must be positive")
    worker_concurrency = _parse_int(
        "WORKER_CONCURRENCY", env.get("WORKER_CONCURRENCY", str(DEFAULT_WORKER_CONCURRENCY)), 1
    )

    return Config(
        trainer_leader_lease=_parse_lease(
            "TRAINER_LEADER_LEASE", env.get("TRAINER_LEADER_LEASE", "/".join(DEFAULT_TRAINER_LEADER_LEASE))
        ),
        metrics_token=env.get("METRICS_TOKEN", "").strip(),
        webhook_retry_schedule=_parse_schedule(
            "WEBHOOK_RETRY_SCHEDULE", env.get("WEBHOOK_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000,36000")
        ),
        webhook_timeout_seconds=webhook_timeout,
        webhook_allow_http=_parse_bool("WEBHOOK_ALLOW_HTTP", env.get("WEBHOOK_ALLOW_HTTP", "false")),
        webhook_allow_private_addresses=_parse_bool(
            "WEBHOOK_ALLOW_PRIVATE_ADDRESSES", env.get("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "false")
        ),
        webhook_secret_grace_seconds=_parse_int(
            "WEBHOOK_SECRET_GRACE_SECONDS", env.get("WEBHOOK_SECRET_GRACE_SECONDS", "86400"), 0
        ),
        webhook_sweep_seconds=_parse_int("WEBHOOK_SWEEP_SECONDS", env.get("WEBHOOK_SWEEP_SECONDS", "10"), 1),
        webhook_ca_bundle=_parse_ca_bundle(env.get("WEBHOOK_CA_BUNDLE", "")),
        webhook_endpoints_per_user=_parse_int(
            "WEBHOOK_ENDPOINTS_PER_USER", env.get("WEBHOOK_ENDPOINTS_PER_USER", "10"), 1
        ),
        history_retention_days=_parse_int(
            "HISTORY_RETENTION_DAYS", env.get("HISTORY_RETENTION_DAYS", "0"), 0
        ),
        supervisor_interval_seconds=supervisor_interval,
        no_capacity_after_seconds=no_capacity_after,
        stuck_after_seconds=stuck_after,
        inadmissible_after_seconds=inadmissible_after,
        session_max_lifetime_seconds=session_max_lifetime,
        session_failed_grace_seconds=session_failed_grace,
        web_workers=web_workers,
        web_threads=web_threads,
        long_requests_per_process=long_per_process,
        long_requests_per_user=long_per_user,
        worker_concurrency=worker_concurrency,
        worker_remote_control=_parse_bool("WORKER_REMOTE_CONTROL", env.get("WORKER_REMOTE_CONTROL", "false")),
        debug=debug,
        secret_key=secret_key,
        secret_key_fallbacks=tuple(
            k.strip() for k in env.get("SECRET_KEY_FALLBACKS", "").split(",") if k.strip()
        ),
        allowed_hosts=allowed_hosts,
        database=database,
        database_url=database_url,
        redis_url=redis_url,
        kubeconfig=kubeconfig,
        worker_kubeconfig_dir=worker_kubeconfig_dir,
        log_level=log_level,
        kube_timeout_seconds=kube_timeout,
        api_token_ttl_days=api_token_ttl_days,
        login_rate_user=login_rate_user,
        login_rate_address=login_rate_address,
        api_rate_user=api_rate_user,
        trusted_proxies=trusted_proxies,
        secure_ssl_redirect=ssl_redirect,
        secure_proxy_ssl_header=proxy_ssl_header,
        hsts_seconds=hsts_seconds,
        readyz_detail_addresses=readyz_detail_addresses,
    )
