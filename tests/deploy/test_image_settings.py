"""The image's settings, checked without building the image (deploy/image/build runs the same check inside
it; buildah and mmdebstrap are not on every machine): the environment the Containerfile sets, plus only the
secrets an installation supplies, gives DEBUG=false and a clean `manage.py check --deploy --fail-level
WARNING`, and the web command's config file loads under it."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(Path(sys.executable))


def image_environment() -> dict[str, str]:
    """The ENV lines of the Containerfile's final stage (the image's own settings), PATH aside."""
    text = (REPO / "Containerfile").read_text().replace("\\\n", " ")
    final_stage = re.split(r"^FROM ", text, flags=re.MULTILINE)[-1]
    env: dict[str, str] = {}
    for line in final_stage.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"(\w+)=(\S+)", line[4:]):
                env[key] = value
    env.pop("PATH", None)
    return env


def installation_secrets() -> dict[str, str]:
    return {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "dispatch.example.com",
        "DATABASE_URL": "postgres://dispatch@db.invalid:5432/dispatch",
        "REDIS_URL": "redis://redis.invalid:6379/0",
    }


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    env |= image_environment() | installation_secrets()
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_image_runs_with_debug_off_unless_told_otherwise() -> None:
    assert image_environment()["DEBUG"] == "false"
    result = _run(
        PYTHON,
        "-c",
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
        "'dispatch_site.settings'); django.setup(); from django.conf import settings; print(settings.DEBUG)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_check_deploy_is_clean_with_the_images_settings() -> None:
    result = _run(PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_web_servers_config_loads_with_the_images_settings() -> None:
    result = _run(
        PYTHON,
        "-c",
        "import runpy; c = runpy.run_path('dispatch_site/gunicorn.conf.py'); "
        "print(c['worker_class'], c['workers'], c['threads'])",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gthread", "2", "16"]
