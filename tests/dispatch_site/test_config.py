"""Settings come from the environment; a bad value is one clear line, not a stack trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_site.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_sqlite_and_local_redis() -> None:
    config = load_config({"DEBUG": "1"})
    assert config.database["ENGINE"] == "django.db.backends.sqlite3"
    assert config.database["NAME"].endswith("var/dispatch.sqlite3")
    assert config.redis_url == "redis://127.0.0.1:26379/0"
    assert config.debug is True
    assert config.secret_key  # generated for development


def test_postgres_url_is_parsed() -> None:
    config = load_config({"DEBUG": "1", "DATABASE_URL": "postgres://u:p@127.0.0.1:5433/dispatchdb"})
    assert config.database["ENGINE"] == "django.db.backends.postgresql"
    assert (config.database["NAME"], config.database["PORT"], config.database["USER"]) == (
        "dispatchdb",
        5433,
        "u",
    )


@pytest.mark.parametrize(
    ("url", "threshold"),
    [
        ("postgres://u:p@127.0.0.1:5433/d", 5),
        ("postgres://u:p@127.0.0.1:5433/d?prepare_threshold=none", None),
        ("postgres://u:p@127.0.0.1:5433/d?prepare_threshold=None&sslmode=require", None),
        ("postgres://u:p@127.0.0.1:5433/d?prepare_threshold=0", 0),
    ],
)
def test_postgres_prepares_hot_statements_after_five_calls_unless_the_url_says_otherwise(
    url: str, threshold: int | None
) -> None:
    options = load_config({"DEBUG": "1", "DATABASE_URL": url}).database["OPTIONS"]
    assert options["prepare_threshold"] == threshold
    assert options.get("sslmode", "require") == "require"  # the URL's other options are kept


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "0"}, "SECRET_KEY is required when DEBUG is off"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DATABASE_URL": "mysql://x@y/z"}, "DATABASE_URL='mysql://x@y/z' is not supported"),
        ({"DATABASE_URL": "postgres://u@127.0.0.1:5432/"}, "names no database"),
        ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL='http://127.0.0.1:6379' is not a redis:// URL"),
        ({"REDIS_URL": "redis://127.0.0.1:notaport/0"}, "has an invalid port"),
        ({"KUBECONFIG": "/nonexistent/kubeconfig"}, "KUBECONFIG='/nonexistent/kubeconfig': no such file"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='LOUD' is not one of"),
        ({"KUBE_TIMEOUT_SECONDS": "-1"}, "must be positive"),
        (
            {"DATABASE_URL": "postgres://u@127.0.0.1:5432/d?prepare_threshold=often"},
            "prepare_threshold must be a whole number of calls or none, not 'often'",
        ),
        ({"DEBUG": "0", "SECRET_KEY": "x", "ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is empty"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as excinfo:
        load_config({"DEBUG": "1", **env})
    assert message in str(excinfo.value)


def test_debug_is_off_unless_the_environment_turns_it_on() -> None:
    """An installation that forgets DEBUG gets production settings or a clear refusal, never a debug page."""
    with pytest.raises(ConfigError) as refused:
        load_config({})
    assert "SECRET_KEY is required when DEBUG is off" in str(refused.value)
    assert "DEBUG=true" in str(refused.value)  # says how to run locally
    config = load_config({"SECRET_KEY": "s" * 50})
    assert config.debug is False
    assert config.allowed_hosts == ("127.0.0.1", "localhost")
    assert config.secure_ssl_redirect is True


@pytest.mark.parametrize(
    "url",
    [
        "mysql://dispatch:hunter2secret@db.example/dispatch",
        "postgres://dispatch:hunter2secret@db.example:5432/",
        "postgres://dispatch:hunter2secret@db.example:5432/d?prepare_threshold=often",
    ],
)
def test_a_bad_database_url_is_named_without_its_password(url: str) -> None:
    """The error goes to the pod's log (and preflight's one line): it names the URL, never the password."""
    with pytest.raises(ConfigError) as excinfo:
        load_config({"DEBUG": "1", "DATABASE_URL": url})
    assert "hunter2secret" not in str(excinfo.value)
    assert "dispatch:***@db.example" in str(excinfo.value)


def test_production_needs_explicit_hosts_and_key() -> None:
    config = load_config({"DEBUG": "false", "SECRET_KEY": "s3cret", "ALLOWED_HOSTS": "dispatch.example.com"})
    assert config.allowed_hosts == ("dispatch.example.com",)
    assert config.secret_key == "s3cret"


def test_manage_py_reports_a_bad_setting_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "DEBUG": "1", "DATABASE_URL": "mysql://nope"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "dispatch: configuration error: DATABASE_URL='mysql://nope' is not supported: "
        "use postgres://user:pass@host:port/name or sqlite:///path"
    ]
    assert "Traceback" not in result.stderr


def test_preflight_names_an_unreachable_database_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "preflight", "--no-kubernetes"],
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "DEBUG": "1",
            "DATABASE_URL": "postgres://u:p@127.0.0.1:1/nodb",
            "REDIS_URL": "redis://127.0.0.1:1/0",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("CommandError: dependency down: database: OperationalError:")
    assert "redis: ConnectionError:" in line
    assert "Traceback" not in result.stderr
