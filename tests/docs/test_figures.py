"""The figures the docs quote are generated from the kept figure files (scripts/figures.py, issue 34): a table
and its evidence cannot drift apart, and each kept run names the commit it measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from scripts import figures
from scripts.bench import report_json
from scripts.bench_common import Target
from scripts.bench_verdict import Durability, Outcome

SHA = "0123456789abcdef0123456789abcdef01234567"


def _chaos_report(*, seed: int, run: str, mismatches: int) -> dict[str, Any]:
    """A report.json as scripts/chaoslib/report.py writes it (keys figure files keep, and some they drop)."""
    return {
        "run": run,
        "seed": seed,
        "jobs_planned": 200,
        "short": False,
        "kueue_wave": True,
        "broken_build": None,
        "commit": {"sha": SHA, "dirty": False, "changed": [], "subject": "s", "committed_at": "2026-12-04"},
        "shape": {
            "workers": 2,
            "worker_pool": "threads",
            "worker_concurrency": 32,
            "supervisor_interval_seconds": 10.0,
            "kube_timeout_seconds": 10.0,
            "overridden": [],
        },
        "durability": {
            "postgres": {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
            "etcd": "fsync on",
        },
        "ok": mismatches == 0,
        "figures": {
            "jobs_accepted": {"value": 200, "target": 200, "ok": True},
            "outcome_mismatches": {"value": mismatches, "target": 0, "ok": mismatches == 0},
        },
        "faults": [{"fault": "redis", "at": 12.5, "verified": True, "summary": "kept out"}],
        "faults_planned": {"redis": 1},
        "identity": {"coverage": {"covered": 199, "wanted": 200, "missing": []}, "trainjobs_seen": 230},
        "requests": {"named_503": 4},
        "jobs": {"job-1": {"state": "succeeded"}},  # per-job detail: stays in var/
    }


def _tree(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """A copy of the docs with the figure tables and the kept files, to change without touching the repo."""
    root = tmp_path / "figures"
    if figures.FIGURES.exists():
        shutil.copytree(figures.FIGURES, root)
    tables = {}
    for kind, doc in figures.TABLES.items():
        tables[kind] = tmp_path / doc.name
        shutil.copy(doc, tables[kind])
    return root, tables


def test_the_docs_tables_are_the_ones_their_kept_figure_files_render() -> None:
    assert figures.render(check=True) == [], "run `python -m scripts.figures render` and commit the result"


def test_a_kept_run_without_a_render_or_a_table_edited_by_hand_fails_the_check(tmp_path: Path) -> None:
    root, tables = _tree(tmp_path)
    assert figures.render(check=True, root=root, tables=tables) == []

    # A figure file added (or changed) without rendering: the chaos table no longer shows it.
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_chaos_report(seed=9, run="20261204-120000-seed9-1", mismatches=0)))
    kind, name, kept = figures.figure_file(json.loads(report.read_text()))
    (root / kind).mkdir(parents=True, exist_ok=True)
    (root / kind / name).write_text(json.dumps(kept))
    assert figures.render(check=True, root=root, tables=tables) == [tables["chaos"]]
    assert figures.render(check=False, root=root, tables=tables) == [tables["chaos"]]
    assert figures.render(check=True, root=root, tables=tables) == []

    # A value edited in the doc by hand.
    text = tables["chaos"].read_text()
    tables["chaos"].write_text(text.replace("`20261204-120000-seed9-1`", "`20261204-120000-seed9-2`"))
    assert figures.render(check=True, root=root, tables=tables) == [tables["chaos"]]


def test_a_kept_chaos_run_names_its_commit_shape_and_durability_and_shows_a_miss(tmp_path: Path) -> None:
    root, tables = _tree(tmp_path)
    shutil.rmtree(root / "chaos", ignore_errors=True)
    for seed, mismatches in ((1, 0), (2, 3)):
        report = tmp_path / f"report-{seed}.json"
        report.write_text(
            json.dumps(_chaos_report(seed=seed, run=f"2026120{seed}-1-seed{seed}", mismatches=mismatches))
        )
        kept = figures.keep(report, root=root, note="shared machine" if seed == 1 else "")
        assert kept == root / "chaos" / f"2026120{seed}-1-seed{seed}.json"
        assert "jobs" not in json.loads(kept.read_text())  # the per-job detail is not kept
    figures.render(check=False, root=root, tables=tables)
    text = tables["chaos"].read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["commit"].count(f"`{SHA[:12]}`") == 2
    assert rows["outcome_mismatches"] == "| outcome_mismatches | 0 | 0 | **3** |"
    assert rows["all figures at target"] == "| all figures at target | yes | yes | **NO** |"
    assert "2 threads worker(s) x 32" in rows["shape"]
    assert rows["note"] == "| note |  | shared machine | - |"
    assert "fsync=on" in rows["durability"] and "etcd fsync on" in rows["durability"]
    assert rows["faults run (verified / planned)"].endswith("| 1 / 1 | 1 / 1 |")
    assert rows["observer: final attempts whose every rank was seen running"].endswith(
        "| 199 / 200 | 199 / 200 |"
    )


def test_a_kept_bench_report_renders_every_target_as_its_verdict_judged_it(tmp_path: Path) -> None:
    root, tables = _tree(tmp_path)
    shutil.rmtree(root / "bench", ignore_errors=True)
    outcomes = [
        Outcome("plan", targets=[Target("plan / me", "1.21", ">= 0.5", True, "median of 3 rounds")]),
        Outcome("starts", targets=[Target("TrainJobs/s", "41.0", ">= 50", False, "median of 3 rounds")]),
        Outcome("Kueue", skipped="Kueue is not on the plane"),
        Outcome("dashboard", failed="RuntimeError: boom"),
    ]
    durability = Durability(
        postgres={"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
        postgres_where="the server sections'",
        etcd_unsafe_no_fsync=True,
        commit={"sha": SHA, "dirty": True, "changed": [" M x.py"], "subject": "s"},
    )
    missed = ["starts: TrainJobs/s = 41.0, target >= 50", "dashboard: the section failed"]
    report = tmp_path / "report.json"
    report.write_text(json.dumps(report_json(outcomes, durability, missed)))
    figures.keep(report, root=root)
    figures.render(check=False, root=root, tables=tables)
    text = tables["bench"].read_text()
    assert f"commit `{SHA[:12]}` (dirty)" in text
    assert "fsync=off" in text and "NOT durable" in text and "--unsafe-no-fsync" in text
    assert "| plan | plan / me | 1.21 | >= 0.5 | yes | median of 3 rounds |" in text
    assert "| starts | TrainJobs/s | 41.0 | >= 50 | **NO** | median of 3 rounds |" in text
    assert "| Kueue | (skipped: Kueue is not on the plane) | | | not a miss | |" in text
    assert "| dashboard | (the section failed: RuntimeError: boom) | | | **NO** | |" in text
    assert "2 target(s) missed" in text


def test_a_report_keep_does_not_know_is_refused_with_its_reason(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"something": "else"}))
    assert figures.main(["keep", str(report)]) == 2
