"""deploy/monitoring: the Prometheus rules pass `promtool check rules` and their unit tests (`promtool test
rules`: each alert fires on the series that should fire it), and every metric the rules and the Grafana
dashboard name is one dispatch exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dispatch_site import metrics

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "dispatch-rules.yaml"
RULE_TESTS = MONITORING / "dispatch-rules.test.yaml"
DASHBOARD = MONITORING / "dispatch-dashboard.json"
# Read at scrape time from the database (jobs.observability.collector) or by the scrape itself.
SCRAPE_TIME = {
    "dispatch_jobs",
    "dispatch_supervisor_lag_seconds",
    "dispatch_webhook_endpoints_disabled",
    "dispatch_delete_oldest_pending_seconds",
    "dispatch_scrape_error",
}
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run scripts/monitoring-deps (Debian's prometheus package)")
    return found


def test_the_rules_pass_promtool_check() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_each_alert_fires_on_the_series_that_should_fire_it() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=MONITORING,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _exported() -> set[str]:
    names = set(SCRAPE_TIME)
    for value in vars(metrics).values():
        describe = getattr(value, "describe", None)
        if callable(describe) and hasattr(value, "_name"):
            names |= {family.name for family in describe()}
    return names


def _named(expr: str) -> set[str]:
    found = set()
    for name in re.findall(r"\bdispatch_[a-z_]+", expr):
        for suffix in SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in _exported():
                name = name.removesuffix(suffix)
        found.add(name)
    return found


def test_the_rules_and_the_dashboard_name_only_metrics_dispatch_exports() -> None:
    exported = _exported()
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "DispatchSupervisorLagging",
        "DispatchJobsUnknown",
        "DispatchIdentityViolation",
        "DispatchStuckStart",
        "DispatchRefusalRateHigh",
    } <= alerts
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    named = set().union(*(_named(e) for e in exprs))
    named -= {n for n in named if n.startswith("dispatch:")}
    assert named and named <= exported, sorted(named - exported)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
