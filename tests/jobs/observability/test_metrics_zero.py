"""A fresh dispatch process's /metrics already shows every known labelled series at 0 (issue 37): a dashboard
and an alert on rate(...) see 0 before the first refusal, retry, identity finding or webhook delivery, not
nothing. The process is a new Python (as a gunicorn worker starts), in multiprocess mode as deployed, and
nothing in it has refused anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch_site.causes import RETRYABLE_CAUSES
from jobs.observability.webhooks import OUTCOMES
from jobs.plan import START_ONLY_CODES
from runtimes.reasons import REASON_CODES
from tests.client.conftest import database_url

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[3]
SCRAPE = """
import django, sys
django.setup()
from django.test import Client
response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_HOST="127.0.0.1")
assert response.status_code == 200, response.status_code
sys.stdout.write(response.content.decode())
"""


def _fresh_scrape(tmp_path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "dispatch_site.settings",
        "DATABASE_URL": database_url(),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
        "METRICS_TOKEN": "",
        "ALLOWED_HOSTS": "127.0.0.1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRAPE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(done.stdout)
        for sample in family.samples
    }


def test_a_fresh_process_shows_every_known_series_at_zero(tmp_path: Path) -> None:
    series = _fresh_scrape(tmp_path)
    assert series[("dispatch_refusals_total", (("code", "runtime-not-allowed"),))] == 0
    for code in (*REASON_CODES, *START_ONLY_CODES):
        assert series[("dispatch_refusals_total", (("code", code),))] == 0, code
    for cause in RETRYABLE_CAUSES:
        assert series[("dispatch_recovery_attempts_total", (("cause", cause),))] == 0, cause
    for expected in ("true", "false"):
        assert series[("dispatch_identity_findings_total", (("expected", expected),))] == 0
    for outcome in OUTCOMES:
        assert series[("dispatch_webhook_deliveries_total", (("outcome", outcome),))] == 0
    for to in ("pending", "refused"):
        key = (("cause", "none"), ("from", "new"), ("to", to))
        assert series[("dispatch_job_transitions_total", key)] == 0
    # What the rules' expressions select (deploy/monitoring/dispatch-rules.yaml) exists from the start.
    assert any(n == "dispatch_job_transitions_total" and ("from", "new") in labels for n, labels in series)
