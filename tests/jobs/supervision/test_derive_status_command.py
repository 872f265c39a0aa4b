"""`manage.py derive_status FILE... [--json]`: the status derivation on recorded objects, offline.

The --json shape is a contract read by checks outside the test suite, so it is asserted exactly. Exit codes
and stderr go through a real `manage.py` process; neither path touches the database or the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

from django.core.management import call_command

FIXTURES = Path(__file__).parent / "status-fixtures"
REPO = Path(__file__).resolve().parents[3]
TJ = "jq7xk2mf4ab-1"
NOW = "2026-09-01T11:30:00Z"  # after every fixture's story


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def run_json(*args: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("derive_status", "--json", *args, stdout=out, stderr=StringIO())
    result: list[dict[str, Any]] = json.loads(out.getvalue())
    return result


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "derive_status", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_json_is_one_list_in_file_order_with_the_exact_shape() -> None:
    results = run_json(
        "--now",
        NOW,
        fixture("app-error-rank1-exit3.yaml"),
        fixture("kueue-max-execution-time.json"),  # JSON as kubectl get -o json writes it
        fixture("succeeded.yaml"),
        fixture("identity-two-pods.yaml"),
    )
    assert [(r["state"], r["cause"], r["rank"], r["exit_code"]) for r in results] == [
        ("failed", "app-error", 1, 3),
        ("failed", "timeout", None, None),
        ("succeeded", None, None, None),
        ("failed", "identity-violation", 0, None),
    ]
    for result in results:
        assert list(result) == ["state", "cause", "rank", "exit_code", "evidence", "identity_findings"]
        assert isinstance(result["evidence"], list)
        for item in result["evidence"]:
            assert list(item) == ["object", "field", "value"]
        for finding in result["identity_findings"]:
            assert list(finding) == ["rank", "attempt", "restart_attempt", "pods", "why"]

    app_error = results[0]
    # The failing rank's pod, its container's terminated state and the exit code are the evidence.
    assert any(
        e["object"] == f"Pod team-a/{TJ}-node-0-1-p2m7w"
        and "terminated" in e["field"]
        and "3" in str(e["value"])
        for e in app_error["evidence"]
    )
    assert app_error["identity_findings"] == []

    (finding,) = results[3]["identity_findings"]
    assert {k: finding[k] for k in ("rank", "attempt", "restart_attempt", "pods")} == {
        "rank": 0,
        "attempt": 1,
        "restart_attempt": 0,
        "pods": [f"{TJ}-node-0-0-h4q9z", f"{TJ}-node-0-0-w8n5c"],
    }
    assert isinstance(finding["why"], str) and finding["why"]


def test_json_is_valid_for_a_single_file_and_a_waiting_cause_follows_now_and_the_threshold() -> None:
    queued = run_json("--now", "2026-09-01T10:01:10Z", fixture("unschedulable.yaml"))
    assert [(r["state"], r["cause"]) for r in queued] == [("queued", None)]
    failed = run_json(
        "--now", "2026-09-01T10:01:10Z", "--no-capacity-after", "60", fixture("unschedulable.yaml")
    )
    assert [(r["state"], r["cause"], r["rank"]) for r in failed] == [("failed", "no-capacity", 0)]


def test_identity_warned_marks_the_rerun_as_expected() -> None:
    (plain,) = run_json("--now", NOW, fixture("identity-restart-in-place.yaml"))
    (warned,) = run_json("--now", NOW, "--identity-warned", fixture("identity-restart-in-place.yaml"))
    assert (plain["state"], plain["cause"]) == ("failed", "identity-violation")
    assert (warned["state"], warned["cause"]) == ("running", None)
    assert [f["rank"] for f in warned["identity_findings"]] == [1]
    assert "expected" in warned["identity_findings"][0]["why"]


def test_the_json_output_through_a_real_process() -> None:
    result = manage("--json", "--now", NOW, fixture("oom-backofflimit.yaml"), fixture("running.yaml"))
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert [(r["state"], r["cause"], r["rank"], r["exit_code"]) for r in parsed] == [
        ("failed", "oom", 0, 137),
        ("running", None, None, None),
    ]


def test_text_output_names_each_file_with_its_state_and_cause() -> None:
    result = manage("--now", NOW, fixture("preempted-exit143.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(
        f"{fixture('preempted-exit143.yaml')}: failed / preempted"
    )


# --- unreadable files and bad YAML: exit 2, one line naming the file


def test_a_missing_file_exits_2_with_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = manage("--json", fixture("running.yaml"), str(missing))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0]
    assert result.stdout == ""  # no partial JSON for a check to misread


def test_an_unreadable_path_exits_2_with_one_line_naming_it(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory.yaml"
    directory.mkdir()
    result = manage("--json", str(directory))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(directory) in lines[0]


def test_bad_yaml_exits_2_with_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n  metadata: {name: [unclosed\n")
    result = manage("--json", fixture("running.yaml"), str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
    assert result.stdout == ""


def test_bad_json_exits_2_with_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"apiVersion": "v1", "kind": "List", "items": [\n')
    result = manage("--json", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
