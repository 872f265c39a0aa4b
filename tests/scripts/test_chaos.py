"""The short chaos run (scripts/chaos.py --short): 20 jobs submitted and cancelled through real processes
(gunicorn, Celery workers and beat) on a throwaway PostgreSQL and Redis of its own, while workers are
SIGKILLed, Redis and PostgreSQL restart and the API server is unreachable for 30 s (a paused TCP proxy in
front of the shared control plane). `make chaos` runs the same script with 200 jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]


def test_a_short_chaos_run_ends_with_every_figure_at_its_target(kubeconfig: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--short",
            "--jobs=20",
            "--seed=7",
            "--settle-seconds=300",
            # Ports of its own, apart from `make chaos` and from the shared services (25432/26379).
            "--pg-port=35442",
            "--redis-port=36389",
            "--web-port=18090",
            f"--kubeconfig={kubeconfig}",
            f"--report={report}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(report.read_text())
    assert figures["jobs_accepted"] == 20, figures
    assert figures["figures"] == {
        "duplicate_trainjobs": 0,
        "orphaned_trainjobs": 0,
        "lost_jobs": 0,
        "stuck_jobs": 0,
        "server_errors_5xx": 0,
        "deadlocks": 0,
    }, figures
    assert len(figures["faults"]) == 5, figures["faults"]  # 2 worker kills, Redis, PostgreSQL, API server
    assert run.returncode == 0, run.stdout[-3000:]
