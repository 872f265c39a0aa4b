"""make bench's verdict and what its figures were measured on (issue 34). Pure: scripts/bench.py gathers each
section's targets (scripts.bench_common.Target) and the settings it read from the running servers; this module
judges and renders them.

- A target that is not met is a miss; a section that failed (an error stopped it, so its targets were never
  judged) is a miss too; a section that could not run here (Kueue absent, BENCH_KUEUE=off) is skipped, with
  its reason, and is not a miss. make bench exits 1 on any miss, after the whole report is written.
- The durability lines name, beside the figures, PostgreSQL's fsync / synchronous_commit / full_page_writes as
  the server reports them (SHOW), etcd's --unsafe-no-fsync as its running process was started, and the commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scripts.bench_common import Target


@dataclass(frozen=True)
class Outcome:
    """One section of the report, as judged: its targets, or why it was skipped, or the error that stopped
    it."""

    section: str
    targets: Sequence[Target] = field(default_factory=tuple)
    skipped: str = ""
    failed: str = ""


def misses(outcomes: Sequence[Outcome]) -> list[str]:
    """Each miss, named: a target not met (its measure, value and target), or a section that failed."""
    found: list[str] = []
    for outcome in outcomes:
        if outcome.failed:
            found.append(
                f"{outcome.section}: the section failed ({outcome.failed}); its targets were not judged"
            )
            continue
        if outcome.skipped:
            continue
        found += [
            f"{outcome.section}: {t.measure} = {t.value}, target {t.target}"
            for t in outcome.targets
            if not t.met
        ]
    return found


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """make bench's exit status: 1 on any miss, else 0 (skipped sections are not misses)."""
    return 1 if misses(outcomes) else 0


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verdict_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """The report's last section: every target with how it was judged, the skipped and failed sections, and
    the misses by name."""
    lines = [
        "",
        "## Verdict",
        "",
        "| section | measure | value | target | met | judged on |",
        "|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        if outcome.failed:
            lines.append(f"| {outcome.section} | (the section failed: {_cell(outcome.failed)}) | | | NO | |")
        elif outcome.skipped:
            lines.append(f"| {outcome.section} | (skipped: {_cell(outcome.skipped)}) | | | not a miss | |")
        else:
            lines += [
                f"| {outcome.section} | {_cell(t.measure)} | {t.value} | {t.target} "
                f"| {'yes' if t.met else 'NO'} | {_cell(t.judged_on)} |"
                for t in outcome.targets
            ]
    missed = misses(outcomes)
    lines.append("")
    if missed:
        lines.append(f"MISSED: {len(missed)} target(s); make bench exits 1:")
        lines += [f"- {m}" for m in missed]
    else:
        judged = sum(len(o.targets) for o in outcomes if not o.skipped and not o.failed)
        skipped = [o.section for o in outcomes if o.skipped]
        lines.append(
            f"All {judged} targets met"
            + (f" ({', '.join(skipped)} skipped, not a miss)" if skipped else "")
            + "; make bench exits 0."
        )
    return lines


@dataclass(frozen=True)
class Durability:
    """What the figures were measured on, as read from the running servers and the checkout.

    postgres: fsync, synchronous_commit and full_page_writes as SHOW reports them on the server the sections
    ran on (`postgres_where` says which); submissions_postgres: the same for the submissions' own server (None
    when that section did not report them); etcd_unsafe_no_fsync: whether the plane's running etcd was started
    with --unsafe-no-fsync (None: not known, e.g. a plane whose processes are not recorded here); commit:
    scripts.provenance.commit_of."""

    postgres: Mapping[str, str]
    postgres_where: str
    etcd_unsafe_no_fsync: bool | None
    commit: Mapping[str, Any]
    submissions_postgres: Mapping[str, str] | None = None


def _settings(values: Mapping[str, str]) -> str:
    return ", ".join(f"{name}={values[name]}" for name in ("fsync", "synchronous_commit", "full_page_writes"))


def _durable(values: Mapping[str, str]) -> bool:
    return all(values.get(name) == "on" for name in ("fsync", "synchronous_commit", "full_page_writes"))


def durability_lines(durability: Durability) -> list[str]:
    """The report's durability, one line each: the commit, PostgreSQL (both servers), etcd."""
    commit = durability.commit
    dirty = commit.get("dirty")
    changed = ", ".join(str(c).strip() for c in commit.get("changed") or [])
    lines = [
        f"- commit: {commit.get('sha') or 'unknown'}"
        + (f" (dirty: the checkout differs from it: {changed})" if dirty else " (clean)")
        + (f", {commit['subject']!r}" if commit.get("subject") else ""),
        f"- PostgreSQL, {durability.postgres_where}: {_settings(durability.postgres)} "
        f"({'durable' if _durable(durability.postgres) else 'NOT durable: a crash may lose commits'})",
    ]
    if durability.submissions_postgres is not None:
        lines.append(
            f"- PostgreSQL, the submissions' own server: {_settings(durability.submissions_postgres)} "
            f"({'durable' if _durable(durability.submissions_postgres) else 'NOT durable'})"
        )
    etcd = {
        True: "--unsafe-no-fsync (fsync off: a crash of the machine may lose the last writes)",
        False: "fsync on (no --unsafe-no-fsync)",
        None: "unknown (the plane's etcd process is not recorded here)",
    }[durability.etcd_unsafe_no_fsync]
    lines.append(f"- etcd (the control plane's, read from its running command line): {etcd}")
    return lines
