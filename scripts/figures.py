"""The figures the docs quote, kept as files and rendered into the docs' tables (issue 34): a table and its
evidence cannot drift apart.

    python -m scripts.figures keep var/chaos/<run>/report.json   # -> docs/figures/chaos/<run>.json
    python -m scripts.figures keep --note "what else ran" REPORT # a note on the run's conditions
    python -m scripts.figures keep var/bench/report.json         # -> docs/figures/bench/<when>.json
    python -m scripts.figures render                             # rewrite the tables in the docs
    python -m scripts.figures render --check                     # exit 1 if a table differs from its files

`keep` writes the figure file (what the table shows, plus the commit, the shape and the durability each run
measured; a chaos report's per-job detail stays in var/) and renders. The tables live in the docs between
`<!-- figures:<kind> -->` and `<!-- /figures:<kind> -->`; `render --check` runs in the suite
(tests/docs/test_figures.py), so a table edited by hand, or a figure file added without rendering, fails it.
Pure apart from the files it reads and writes: no dispatch import, no server."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
FIGURES: Final = REPO / "docs" / "figures"
# Where each kind's table is rendered (one block per kind).
TABLES: Final = {"chaos": REPO / "docs" / "chaos.md", "bench": REPO / "docs" / "performance.md"}

# What a chaos figure file keeps of report.json (scripts/chaoslib/report.py), besides the figures.
CHAOS_KEYS: Final = (
    "run",
    "seed",
    "jobs_planned",
    "short",
    "kueue_wave",
    "broken_build",
    "commit",
    "shape",
    "durability",
    "ok",
    "figures",
    "faults_planned",
    "states",
    "causes",
    "settle_seconds",
    "jobs_accepted_with_kueue_wave",
)


class FigureError(Exception):
    """A report that is not one `keep` knows, or a doc without its table's markers."""


# ------------------------------------------------------------------------------------------ figure files


def kind_of(report: Mapping[str, Any]) -> str:
    if report.get("kind") == "bench":
        return "bench"
    if "figures" in report and "seed" in report and "commit" in report:
        return "chaos"
    raise FigureError("not a chaos report.json nor a bench report.json")


def figure_file(report: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(kind, file name, what the figure file holds) for a run's report."""
    kind = kind_of(report)
    if kind == "chaos":
        kept = {key: report.get(key) for key in CHAOS_KEYS}
        kept["faults"] = [
            {"fault": f.get("fault"), "at": f.get("at"), "verified": f.get("verified")}
            for f in report.get("faults") or ()
        ]
        identity = report.get("identity") or {}
        coverage = identity.get("coverage") or {}
        kept["observer"] = {
            "covered": coverage.get("covered"),
            "wanted": coverage.get("wanted"),
            "trainjobs_seen": identity.get("trainjobs_seen"),
            "counts": identity.get("counts"),
        }
        kept["named_503"] = (report.get("requests") or {}).get("named_503")
        return kind, f"{report['run']}.json", {"kind": kind, **kept}
    return kind, f"{str(report['at']).replace(':', '').replace(' ', '-')}.json", dict(report)


def load(kind: str, root: Path = FIGURES) -> list[dict[str, Any]]:
    """A kind's figure files, oldest first (their names begin with when they ran)."""
    return [json.loads(p.read_text()) for p in sorted((root / kind).glob("*.json"))]


# ------------------------------------------------------------------------------------------ tables


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _commit(commit: Mapping[str, Any] | None) -> str:
    commit = commit or {}
    sha = str(commit.get("sha") or "unknown")[:12]
    return f"`{sha}`" + (" (dirty)" if commit.get("dirty") else "")


def chaos_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One column per kept run: its commit, shape and durability, then every figure against its target
    (a figure a run did not have reads as a dash; a miss is bold)."""
    if not runs:
        return ["No run is kept yet (`python -m scripts.figures keep var/chaos/<run>/report.json`)."]
    names: list[str] = []
    targets: dict[str, Any] = {}
    for run in runs:
        for name, fig in (run.get("figures") or {}).items():
            if name not in targets:
                names.append(name)
                targets[name] = fig.get("target")
    header = ["figure", "target"] + [
        f"seed {r.get('seed')}, {r.get('jobs_planned')} jobs{' (short)' if r.get('short') else ''}"
        for r in runs
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]

    def row(label: str, target: Any, cells: Sequence[Any]) -> None:
        lines.append("| " + " | ".join(_cell(c) for c in [label, target, *cells]) + " |")

    row("run (`var/chaos/<run>`)", "", [f"`{r.get('run')}`" for r in runs])
    row("commit", "", [_commit(r.get("commit")) for r in runs])
    row("broken build", "none", [(r.get("broken_build") or {}).get("name") or "none" for r in runs])
    row("Kueue wave", "", ["on" if r.get("kueue_wave") else "off" for r in runs])
    row("shape", "`make up`'s", [_shape(r.get("shape") or {}) for r in runs])
    row("durability", "", [_chaos_durability(r.get("durability") or {}) for r in runs])
    row("note", "", [r.get("note") or "-" for r in runs])
    for name in names:
        cells = []
        for run in runs:
            fig = (run.get("figures") or {}).get(name)
            if fig is None:
                cells.append("-")
            else:
                cells.append(str(fig.get("value")) if fig.get("ok") else f"**{fig.get('value')}**")
        row(name, targets[name], cells)
    row(
        "faults run (verified / planned)",
        "all",
        [
            f"{sum(1 for f in r.get('faults') or () if f.get('verified'))} / "
            f"{sum((r.get('faults_planned') or {}).values())}"
            for r in runs
        ],
    )
    row(
        "observer: final attempts whose every rank was seen running",
        "all",
        [
            f"{(r.get('observer') or {}).get('covered')} / {(r.get('observer') or {}).get('wanted')}"
            for r in runs
        ],
    )
    row("all figures at target", "yes", ["yes" if r.get("ok") else "**NO**" for r in runs])
    return lines


def _shape(shape: Mapping[str, Any]) -> str:
    if not shape:
        return "-"
    overridden = shape.get("overridden") or []
    return (
        f"{shape.get('workers')} {shape.get('worker_pool')} worker(s) x {shape.get('worker_concurrency')}; "
        f"supervisor every {shape.get('supervisor_interval_seconds')} s, Kubernetes timeout "
        f"{shape.get('kube_timeout_seconds')} s"
        + (f"; overridden: {', '.join(overridden)}" if overridden else "")
    )


def _chaos_durability(durability: Mapping[str, Any]) -> str:
    postgres = durability.get("postgres") or {}
    settings = ", ".join(f"{k}={v}" for k, v in sorted(postgres.items()))
    return f"PostgreSQL {settings or 'unknown'}; etcd {durability.get('etcd') or 'unknown'}"


def bench_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The newest kept `make bench`: what it measured on, then every target as its verdict judged it."""
    if not runs:
        return ["No run is kept yet (`python -m scripts.figures keep var/bench/report.json`)."]
    run = runs[-1]
    measured = run.get("measured_on") or {}
    lines = [
        f"`make bench` at {run.get('at')} ({run.get('cores')} cores), "
        f"commit {_commit(measured.get('commit'))}:",
        *(["", f"Note: {run['note']}"] if run.get("note") else []),
        "",
        *[f"- {line}" for line in measured.get("lines") or ()],
        "",
        "| section | measure | value | target | met | judged on |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for outcome in run.get("outcomes") or ():
        section = _cell(outcome.get("section"))
        if outcome.get("failed"):
            lines.append(f"| {section} | (the section failed: {_cell(outcome['failed'])}) | | | **NO** | |")
        elif outcome.get("skipped"):
            lines.append(f"| {section} | (skipped: {_cell(outcome['skipped'])}) | | | not a miss | |")
        else:
            for t in outcome.get("targets") or ():
                met = "yes" if t.get("met") else "**NO**"
                lines.append(
                    f"| {section} | {_cell(t.get('measure'))} | {_cell(t.get('value'))} | "
                    f"{_cell(t.get('target'))} | {met} | {_cell(t.get('judged_on') or '')} |"
                )
    missed = run.get("missed") or []
    lines += ["", f"{len(missed)} target(s) missed" + (": " + "; ".join(missed) if missed else ".")]
    return lines


RENDERERS: Final = {"chaos": chaos_table, "bench": bench_table}


def _markers(kind: str) -> tuple[str, str]:
    return f"<!-- figures:{kind} -->", f"<!-- /figures:{kind} -->"


def rendered(text: str, kind: str, runs: Sequence[Mapping[str, Any]]) -> str:
    """`text` with the block between the kind's markers replaced by its table."""
    start, end = _markers(kind)
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise FigureError(f"no {start} ... {end} block")
    block = "\n".join([start, "", *RENDERERS[kind](runs), "", end])
    return pattern.sub(lambda _: block, text, count=1)


def render(*, check: bool, root: Path = FIGURES, tables: Mapping[str, Path] = TABLES) -> list[Path]:
    """Rewrite each table from its figure files; with `check`, write nothing. The docs that differ(ed)."""
    differing: list[Path] = []
    for kind, doc in tables.items():
        text = doc.read_text()
        try:
            new = rendered(text, kind, load(kind, root))
        except FigureError as exc:
            raise FigureError(f"{doc}: {exc}") from exc
        if new != text:
            differing.append(doc)
            if not check:
                doc.write_text(new)
    return differing


def keep(report_path: Path, *, root: Path = FIGURES, note: str = "") -> Path:
    report = json.loads(report_path.read_text())
    kind, name, kept = figure_file(report)
    if note:
        kept["note"] = note
    out = root / kind / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(kept, indent=2, default=str) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.figures", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keep_cmd = sub.add_parser("keep", help="keep a run's report as a figure file, then render")
    keep_cmd.add_argument("reports", nargs="+", type=Path)
    keep_cmd.add_argument(
        "--note", default="", help="the run's conditions the report cannot know (load, ...)"
    )
    render_cmd = sub.add_parser("render", help="rewrite the docs' tables from the figure files")
    render_cmd.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table differs")
    args = parser.parse_args(argv)
    try:
        if args.command == "keep":
            for path in args.reports:
                print(f"kept {keep(path, note=args.note).relative_to(REPO)}")
        differing = render(check=args.command == "render" and args.check)
    except (FigureError, OSError, ValueError, KeyError) as exc:
        print(f"figures: {exc}", file=sys.stderr)
        return 2
    for doc in differing:
        verb = "differs from its figure files" if args.command == "render" and args.check else "rendered"
        print(f"{doc.relative_to(REPO)}: {verb}")
    return 1 if differing and args.command == "render" and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
