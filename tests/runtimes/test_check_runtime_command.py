"""`manage.py check_runtime`: what a platform engineer sees when checking runtime manifests offline.

In-process through call_command for the output, and through a real `manage.py` process for exit codes and
stderr. Neither touches the database (pytest-django would fail an unmarked test that did).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

FIXTURES = Path(__file__).parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(FIXTURES / "dispatch-kind.yaml")
MULTI = str(
    FIXTURES / "runtimes-multi.yaml"
)  # refused CTR, ConfigMap, empty doc, TrainingRuntime with Ignore
LIST_JSON = str(
    FIXTURES / "runtimes-list.json"
)  # kubectl-style List: a Deployment and an MPI TrainingRuntime
INVALID = str(FIXTURES / "invalid.yaml")  # unclosed flow mapping on line 6, noticed on line 7
NOT_RUNTIMES = str(FIXTURES / "not-runtimes.yaml")


def run(*args: str) -> str:
    out = StringIO()
    call_command("check_runtime", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def run_json(*args: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = json.loads(run("--json", *args))
    return result


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check_runtime", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


# --- JSON output


def test_json_lists_runtimes_in_file_and_document_order_skipping_other_kinds() -> None:
    results = run_json(MULTI, LIST_JSON, EXAMPLE)
    assert [(r["kind"], r["namespace"], r["name"]) for r in results] == [
        ("ClusterTrainingRuntime", None, "torch-onfailure"),
        ("TrainingRuntime", "team-a", "ignore-disruptions"),
        ("TrainingRuntime", "team-b", "mpi-launcher"),
        ("ClusterTrainingRuntime", None, "dispatch-kind"),
    ]


def test_json_shape() -> None:
    first = run_json(MULTI)[0]
    assert set(first) == {
        "name",
        "kind",
        "namespace",
        "refused",
        "reasons",
        "identity_warning",
        "capabilities",
    }
    assert first["refused"] is True
    assert [r["code"] for r in first["reasons"]] == ["restart-policy", "backoff-limit"]
    assert set(first["reasons"][0]) == {"code", "message", "path", "waived"}
    assert first["reasons"][0]["path"] == (
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec.restartPolicy"
    )
    assert {c["name"]: c["supported"] for c in first["capabilities"]}["ProcsPerNode"] is True


def test_json_reports_every_reason_of_a_json_list_item() -> None:
    (mpi,) = run_json(LIST_JSON)
    assert [r["code"] for r in mpi["reasons"]] == [
        "mlpolicy-unsupported",
        "extra-replicated-job",
        "jobset-max-restarts",
        "jobset-failure-rule-action",
    ]


def test_spec_example_is_accepted_with_no_reasons() -> None:
    (example,) = run_json(EXAMPLE)
    assert (example["refused"], example["reasons"], example["identity_warning"]) == (False, [], None)


def test_allow_rank_restart_waives_the_ignore_rule_with_a_warning() -> None:
    without = run_json(MULTI)[1]
    assert without["refused"] is True
    assert without["identity_warning"] is None

    waived = run_json("--allow-rank-restart", MULTI)[1]
    assert waived["refused"] is False
    assert [(r["code"], r["waived"]) for r in waived["reasons"]] == [("pod-failure-policy-ignore", True)]
    assert waived["identity_warning"] == (
        "allowRankRestart: the runtime's trainer job states a podFailurePolicy Ignore rule, so a failed rank "
        "can rerun under the same DISPATCH_ATTEMPT and one execution can contain a restarted rank"
    )


def test_publish_via_init_container_checks_for_that_init_container() -> None:
    (example,) = run_json(
        "--publish-via", "initContainer", "--publish-container", "publish-identity", EXAMPLE
    )
    assert [r["code"] for r in example["reasons"]] == ["no-publish-init-container"]
    assert '"publish-identity"' in example["reasons"][0]["message"]


def test_file_with_no_runtimes_gives_an_empty_list() -> None:
    assert run_json(NOT_RUNTIMES) == []


# --- the table


def test_table_has_one_row_per_runtime_with_indented_reasons() -> None:
    lines = run(MULTI, EXAMPLE).splitlines()
    rows = [line for line in lines if not line.startswith(" ")]
    assert re.fullmatch(r"ClusterTrainingRuntime/torch-onfailure\s+REFUSED", rows[0])
    assert re.fullmatch(r"TrainingRuntime/team-a/ignore-disruptions\s+REFUSED", rows[1])
    assert re.fullmatch(r"ClusterTrainingRuntime/dispatch-kind\s+ACCEPTED", rows[2])
    assert rows[3] == "3 runtime(s): 1 accepted, 2 refused"
    # The verdicts line up in one column.
    assert len({row.index("REFUSED" if "REFUSED" in row else "ACCEPTED") for row in rows[:3]}) == 1
    # Reasons sit under their runtime, indented, code first.
    assert lines[1].startswith("    restart-policy: spec.template.spec.replicatedJobs[0]")
    assert lines[2].startswith("    backoff-limit: ")
    assert "not-a-runtime" not in "\n".join(lines)


def test_table_marks_waived_reasons_and_prints_the_warning() -> None:
    lines = run("--allow-rank-restart", MULTI).splitlines()
    row = next(
        i for i, line in enumerate(lines) if line.startswith("TrainingRuntime/team-a/ignore-disruptions")
    )
    assert lines[row].endswith("ACCEPTED")
    assert lines[row + 1].startswith("    pod-failure-policy-ignore (waived): ")
    assert lines[row + 2].startswith("    warning: allowRankRestart: the runtime's trainer job states")


def test_table_says_when_there_is_nothing_to_check() -> None:
    assert run(NOT_RUNTIMES).strip() == "no ClusterTrainingRuntime or TrainingRuntime found"


# --- errors: exit 2, one line naming the file


@pytest.mark.parametrize(
    ("args", "text"),
    [
        pytest.param(["does-not-exist.yaml"], "does-not-exist.yaml: no such file", id="missing file"),
        pytest.param([INVALID], "invalid.yaml: invalid YAML at line 7", id="invalid YAML"),
        pytest.param(
            ["--publish-via", "initContainer", EXAMPLE],
            "needs --publish-container",
            id="init container unnamed",
        ),
    ],
)
def test_usage_errors_raise_command_error_with_exit_code_2(args: list[str], text: str) -> None:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 2
    assert text in str(caught.value)


def test_a_bad_file_among_good_ones_prints_nothing_to_stdout() -> None:
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("check_runtime", "--json", EXAMPLE, INVALID, stdout=out)
    assert out.getvalue() == ""


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "runtime.json"
    bad.write_text('{\n  "kind": "ClusterTrainingRuntime",\n  "spec": {\n}\n')
    with pytest.raises(CommandError, match=r"runtime\.json: invalid JSON at line 5"):
        run(str(bad))


def test_manage_py_exits_2_on_a_missing_file_with_one_line() -> None:
    result = manage("does-not-exist.yaml")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == ["CommandError: does-not-exist.yaml: no such file"]


def test_manage_py_exits_2_on_invalid_yaml_naming_file_and_line() -> None:
    result = manage(INVALID)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "invalid.yaml: invalid YAML at line 7, column 11" in line
    assert "started at line 6" in line


def test_manage_py_exits_0_even_when_runtimes_are_refused() -> None:
    result = manage("--json", MULTI, LIST_JSON)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert [r["name"] for r in results] == ["torch-onfailure", "ignore-disruptions", "mpi-launcher"]
    assert all(r["refused"] for r in results)


# --- the four identity holes (DESIGN.md: container-restart-policy, completion-mode,
# fail-index-without-per-index, torch-trainer-job-name), none waived by allowRankRestart

FOUR_HOLES = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: four-holes
spec:
  mlPolicy:
    numNodes: 2
    torch: {}
  template:
    spec:
      replicatedJobs:
        - name: trainer
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              backoffLimit: 0
              completionMode: NonIndexed
              podFailurePolicy:
                rules:
                  - action: FailIndex
                    onExitCodes: {operator: In, values: [3]}
              template:
                spec:
                  restartPolicy: Never
                  initContainers:
                    - name: log-shipper
                      image: busybox
                      restartPolicy: Always
                  containers:
                    - name: node
                      image: busybox
                      restartPolicy: OnFailure
"""
JOB = "spec.template.spec.replicatedJobs[0]"


@pytest.mark.parametrize("args", [[], ["--allow-rank-restart"]], ids=["default", "allow-rank-restart"])
def test_json_reports_the_four_identity_holes_with_their_paths(tmp_path: Path, args: list[str]) -> None:
    manifest = tmp_path / "four-holes.yaml"
    manifest.write_text(FOUR_HOLES)
    (result,) = run_json(*args, str(manifest))
    assert result["refused"] is True
    assert [(r["code"], r["path"], r["waived"]) for r in result["reasons"]] == [
        ("container-restart-policy", f"{JOB}.template.spec.template.spec.containers[0].restartPolicy", False),
        ("completion-mode", f"{JOB}.template.spec.completionMode", False),
        ("fail-index-without-per-index", f"{JOB}.template.spec.podFailurePolicy.rules[0].action", False),
        ("torch-trainer-job-name", f"{JOB}.name", False),
    ]
    assert result["identity_warning"] is None


def test_table_prints_the_four_identity_holes(tmp_path: Path) -> None:
    manifest = tmp_path / "four-holes.yaml"
    manifest.write_text(FOUR_HOLES)
    lines = run(str(manifest)).splitlines()
    assert re.fullmatch(r"ClusterTrainingRuntime/four-holes\s+REFUSED", lines[0])
    assert lines[1].startswith(
        f"    container-restart-policy: {JOB}.template.spec.template.spec.containers[0]"
    )
    assert '"OnFailure" (container "node")' in lines[1]
    assert lines[2].startswith(f'    completion-mode: {JOB}.template.spec.completionMode is "NonIndexed"')
    assert lines[3].startswith("    fail-index-without-per-index: ")
    assert lines[4].startswith(f'    torch-trainer-job-name: {JOB}.name is "trainer"')
