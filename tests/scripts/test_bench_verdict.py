"""make bench's verdict (issue 34): a missed target makes `make bench` exit non-zero and names it, after the
whole report is written; a section that could not run here is skipped, not a miss; a section that failed is a
miss and does not lose the others' figures; the report names the commit and its durability, as read from the
servers. Pure: the sections are canned results (no cluster, no bench run); scripts/bench.py's own assembly
(run_sections, write_report) judges them exactly as make bench does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scripts import bench
from scripts.bench_common import Target
from scripts.bench_rules import targets as rules_targets
from scripts.bench_verdict import Durability, Outcome, durability_lines, exit_code, misses, verdict_lines

CLEAN = {"sha": "0123abcd" * 5, "dirty": False, "changed": [], "subject": "a commit"}
TEST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def rules_row(ratio: float) -> dict[str, Any]:
    """One rule-checker row as scripts/bench_rules.run returns it, with rounds around `ratio`."""
    return {
        "name": "spec example (dispatch-kind)",
        "loader": "CSafeLoader",
        "parse_seconds": 1e-4,
        "check_seconds": ratio * 1e-4,
        "ratios": [ratio - 0.01, ratio, ratio + 0.01],
        "ratio": ratio,
    }


def rules_section(ratio: float, name: str = "rule checker") -> bench.Section:
    return bench.Section(name, lambda: [rules_row(ratio)], bench.rules_lines, rules_targets)


def skipped_kueue() -> bench.Section:
    from scripts import bench_kueue

    return bench.Section(
        "Kueue",
        lambda: {"skipped": "Kueue is not on this plane", "fault": ""},
        bench_kueue.report_lines,
        bench_kueue.targets,
    )


def run_bench(sections: list[bench.Section], out: Path) -> tuple[int, str]:
    body, outcomes, _ = bench.run_sections(sections)
    measured_on = Durability(
        postgres=TEST_SETTINGS, postgres_where="the test server", etcd_unsafe_no_fsync=True, commit=CLEAN
    )
    code = bench.write_report(body, outcomes, measured_on, out)
    return code, (out / "report.md").read_text()


def test_one_missed_target_exits_non_zero_and_names_it_after_the_whole_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(
        [rules_section(0.9), rules_section(0.1, name="rule checker again"), skipped_kueue()], tmp_path
    )
    assert code == 1
    # The whole report is written, the met section and the skipped one included.
    assert "## Rule checker" in report and "0.100" in report
    assert "Skipped: Kueue is not on this plane." in report
    assert "MISSED: 1 target(s)" in report
    assert (
        "- rule checker: rule check / YAML parse, spec example (dispatch-kind) = 0.900, target <= 0.5"
        in report
    )
    assert "MISSED: rule checker: rule check / YAML parse" in capsys.readouterr().err


def test_all_targets_met_exits_zero(tmp_path: Path) -> None:
    code, report = run_bench([rules_section(0.1), rules_section(0.2, name="rule checker again")], tmp_path)
    assert code == 0
    assert "All 2 targets met; make bench exits 0." in report
    assert "MISSED" not in report


def test_a_section_that_could_not_run_is_skipped_not_a_miss(tmp_path: Path) -> None:
    code, report = run_bench([rules_section(0.1), skipped_kueue()], tmp_path)
    assert code == 0
    assert "| Kueue | (skipped: Kueue is not on this plane) | | | not a miss | |" in report
    assert "(Kueue skipped, not a miss)" in report


def test_a_failed_section_is_a_miss_and_the_others_figures_are_kept(tmp_path: Path) -> None:
    def refused() -> Any:
        raise RuntimeError('admission webhook denied the request: runtime "dispatch-kind" not found')

    broken = bench.Section("starts", refused, bench.rules_lines, rules_targets)
    code, report = run_bench([broken, rules_section(0.1), skipped_kueue()], tmp_path)
    assert code == 1
    assert "## starts" in report and "FAILED: RuntimeError: admission webhook denied" in report
    assert "| spec example (dispatch-kind) | CSafeLoader | 100.0 | 10.0 | 0.100 | yes |" in report
    assert "- starts: the section failed (RuntimeError: admission webhook denied" in report


def test_the_plan_target_is_the_median_of_each_rounds_ratio_never_the_best_round() -> None:
    rows = [
        {"name": bench.TRIVIAL, "round": 1, "rps": 1000.0},
        {"name": bench.PLAN, "round": 1, "rps": 900.0},  # 0.9: the best round
        {"name": bench.TRIVIAL, "round": 2, "rps": 1000.0},
        {"name": bench.PLAN, "round": 2, "rps": 400.0},  # 0.4
        {"name": bench.TRIVIAL, "round": 3, "rps": 800.0},
        {"name": bench.PLAN, "round": 3, "rps": 360.0},  # 0.45
    ]
    target = bench.plan_target(rows)
    assert (target.value, target.met) == ("0.45", False)
    assert target.judged_on.startswith("median of 3 rounds")


def test_verdict_of_outcomes() -> None:
    met = Target("a", "1", "<= 2", True, "median of 3 rounds")
    missed = Target("b", "3", "<= 2", False, "median of 3 rounds")
    assert exit_code([Outcome("s", targets=[met])]) == 0
    assert exit_code([Outcome("s", targets=[met, missed])]) == 1
    assert misses([Outcome("s", targets=[met, missed])]) == ["s: b = 3, target <= 2"]
    assert exit_code([Outcome("k", targets=[missed], skipped="Kueue absent")]) == 0
    assert exit_code([Outcome("k", failed="boom")]) == 1
    assert "| s | b | 3 | <= 2 | NO | median of 3 rounds |" in verdict_lines([Outcome("s", targets=[missed])])


def test_the_durability_lines_are_rendered_from_the_settings_read() -> None:
    lines = durability_lines(
        Durability(
            postgres=TEST_SETTINGS,
            postgres_where="the server sections' (127.0.0.1:25432)",
            etcd_unsafe_no_fsync=True,
            commit={**CLEAN, "dirty": True, "changed": [" M scripts/bench.py"]},
            submissions_postgres=DURABLE,
        )
    )
    assert lines == [
        f"- commit: {CLEAN['sha']} (dirty: the checkout differs from it: M scripts/bench.py), 'a commit'",
        "- PostgreSQL, the server sections' (127.0.0.1:25432): fsync=off, synchronous_commit=off, "
        "full_page_writes=off (NOT durable: a crash may lose commits)",
        "- PostgreSQL, the submissions' own server: fsync=on, synchronous_commit=on, full_page_writes=on "
        "(durable)",
        "- etcd (the control plane's, read from its running command line): --unsafe-no-fsync (fsync off: a "
        "crash of the machine may lose the last writes)",
    ]
    durable = durability_lines(
        Durability(postgres=DURABLE, postgres_where="x", etcd_unsafe_no_fsync=False, commit=CLEAN)
    )
    assert durable[0] == f"- commit: {CLEAN['sha']} (clean), 'a commit'"
    assert durable[1].endswith("(durable)")
    assert durable[-1].endswith("fsync on (no --unsafe-no-fsync)")
    unknown = durability_lines(
        Durability(postgres=DURABLE, postgres_where="x", etcd_unsafe_no_fsync=None, commit={})
    )
    assert unknown[0] == "- commit: unknown (clean)"
    assert "unknown" in unknown[-1]


def test_etcd_durability_is_read_from_the_recorded_process_command_line(tmp_path: Path) -> None:
    """A real process stands in for etcd: a Python that sleeps, its argv[0] named etcd, started with or
    without the flag."""
    import subprocess
    import sys
    import time

    from scripts.bench_common import etcd_unsafe_no_fsync

    (tmp_path / "pids").mkdir()
    kubeconfig = str(tmp_path / "admin.kubeconfig")
    assert etcd_unsafe_no_fsync(kubeconfig) is None  # no pid file: not known
    for flags, expected in (([], False), (["--unsafe-no-fsync"], True)):
        sleeping = ["-c", "import time; time.sleep(30)", *flags]
        process = subprocess.Popen([str(tmp_path / "etcd"), *sleeping], executable=sys.executable)
        try:
            (tmp_path / "pids" / "etcd.pid").write_text(f"{process.pid}\n")
            cmdline = Path(f"/proc/{process.pid}/cmdline")
            deadline = time.monotonic() + 10
            while not cmdline.read_bytes().startswith(str(tmp_path / "etcd").encode()):
                assert time.monotonic() < deadline, "the stand-in never exec'd"
                time.sleep(0.01)  # forked, not yet exec'd: its command line is still the test's
            assert etcd_unsafe_no_fsync(kubeconfig) is expected
        finally:
            process.kill()
            process.wait()
    assert etcd_unsafe_no_fsync(kubeconfig) is None  # the recorded process has ended


def test_the_beats_latency_is_judged_on_the_median_of_its_rounds_never_the_best() -> None:
    from scripts.bench_supervision import targets
    from scripts.bench_supervision_cycles import beat_summary

    def beat_target(latencies: list[float]) -> Target:
        result = {
            "watch": [
                {
                    "jobs": jobs,
                    "quiet": {"lists": 0, "cpu_ms": 2.0},
                    "changed": 40,
                    "failures": 40,
                    "latency_p95": 0.7,
                    "rss_kib": 100_000,
                }
                for jobs in (10, 1000)
            ],
            "derivation": {"large_s": 0.45, "small_s": 0.0045, "ratio": 100.0},
            "beat": beat_summary(latencies, 2.0),
        }
        return targets(result)[-1]

    missed = beat_target([0.4, 3.5, 4.0])  # the best round (0.4 s) would meet <= 3 s
    assert (missed.value, missed.met) == ("3.50 s", False)
    assert missed.judged_on == "median of 3 rounds (0.40, 3.50, 4.00)"
    met = beat_target([0.4, float("nan"), 2.5])  # one round whose job never changed: infinitely late
    assert (met.value, met.met) == ("2.50 s", True)
    assert beat_target([float("nan"), float("nan"), 0.4]).met is False
