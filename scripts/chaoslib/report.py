"""The run's figures, each with its target (any miss exits 1), report.json and the summary at the end."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.chaoslib.collect import Findings
from scripts.chaoslib.context import Context
from scripts.chaoslib.plan import KUEUE_HIGH, KUEUE_LOW, FaultPlan


def figure(value: Any, target: Any, ok: bool | None = None) -> dict[str, Any]:
    return {"value": value, "target": target, "ok": (value == target) if ok is None else ok}


def conclude(ctx: Context, chosen_faults: Sequence[FaultPlan], found: Findings) -> dict[str, Any]:
    """The figures and everything report.json adds to what the run stated at its start. Every figure can
    fail: each has been seen off target on a deliberately broken build (scripts/chaoslib/breaks.py)."""
    args, run, client = ctx.args, ctx.run, ctx.client
    accepted, seen, observed = found.accepted, found.seen, found.observed
    mismatches, coverage = found.mismatches, found.coverage
    orphans, lost, stuck = found.orphans, found.lost, found.stuck
    running_after_end, workers_exited = found.running_after_end, found.workers_exited
    results, settled, deadlocks = found.results, found.settled, found.deadlocks
    pg_pids, redis_pids = ctx.pg_pids, ctx.redis_pids
    identity = observed["verdict"]
    watch = observed["watch"]
    normal_accepted = sum(1 for e in accepted.values() if e["kind"] not in (KUEUE_LOW, KUEUE_HIGH))
    not_verified = [f for f in run.faults if not f["verified"]]
    planned_faults = Counter(f.fault for f in chosen_faults)
    done_faults = Counter(f["fault"] for f in run.faults)
    figures = {
        "jobs_accepted": figure(normal_accepted, args.jobs),
        "outcome_mismatches": figure(len(mismatches), 0),
        "unexpected_plan_answers": figure(len(found.unexpected_plans), 0),
        "identity_violations": figure(identity["counts"]["violations"], 0),
        "identity_anomalies": figure(identity["counts"]["anomalies"], 0),
        "attempt_overlap": figure(len(observed["attempt_overlaps"]), 0),
        "trainjob_duplicates": figure(len(observed["trainjob_duplicates"]), 0),
        "observer_coverage_missing": figure(len(coverage["missing"]), 0),
        "observer_errors": figure(len(watch["errors"]), 0),
        "observer_watch_gaps": figure(len(watch["gaps"]), 0),
        "faults_not_verified": figure(len(not_verified) + sum((planned_faults - done_faults).values()), 0),
        "unanswered_requests": figure(len(client.unanswered), 0),
        "server_errors_5xx": figure(len(client.server_errors), 0),
        "orphaned_trainjobs": figure(len(orphans), 0),
        "lost_jobs": figure(len(lost), 0),
        "stuck_jobs": figure(len(stuck), 0),
        "terminal_jobs_with_running_pods": figure(len(running_after_end), 0),
        "workers_exited_on_their_own": figure(len(workers_exited), 0),
        "deadlocks": figure(deadlocks, 0),
    }
    ok = all(f["ok"] for f in figures.values())
    return {
        "ok": ok,
        "figures": figures,
        "jobs_accepted": normal_accepted,
        "jobs_accepted_with_kueue_wave": len(accepted),
        "states": dict(Counter(str(s.get("state")) for s in seen.values())),
        "causes": dict(Counter(str(s.get("cause")) for s in seen.values() if s.get("cause"))),
        "kinds": dict(Counter(e["kind"] for e in accepted.values())),
        "policies": dict(Counter(e["policy_name"] for e in accepted.values())),
        "faults": sorted(run.faults, key=lambda f: f["at"]),
        "faults_planned": dict(planned_faults),
        "mismatches": mismatches,
        "unexpected_plan_answers": found.unexpected_plans[:50],
        "identity": {
            "ok": identity["ok"],
            "counts": identity["counts"],
            "violations": identity["violations"][:50],
            "anomalies": identity["anomalies"][:50],
            "attempt_overlaps": observed["attempt_overlaps"][:50],
            "trainjob_duplicates": observed["trainjob_duplicates"][:50],
            "trainjobs_seen": len(observed["trainjob_records"]),
            "coverage": {**coverage, "missing": coverage["missing"][:50]},
            "watch": watch,
        },
        "requests": {
            "answers": {str(k): v for k, v in sorted(client.answers.items())},
            "named_503": client.named_503,
            "unanswered": client.unanswered,
            "unanswered_by_kind": dict(Counter(u["kind"] for u in client.unanswered)),
            "server_errors": client.server_errors[:50],
        },
        "fence_refusals": found.fence_refusals[:50],
        "settle_seconds": round(settled, 1),
        "domains": run.domains,
        "workers_exited": workers_exited,
        "postgres_pids": pg_pids,
        "redis_pids": redis_pids,
        "examples": {
            "orphans": orphans[:10],
            "lost": lost[:10],
            "stuck": stuck[:10],
            "running_after_end": dict(list(running_after_end.items())[:10]),
        },
        "not_submitted": [e for e in run.jobs.values() if not e.get("id")][:20],
        "jobs": results,
    }


def write(report: Mapping[str, Any], report_path: Path, run_dir: Path) -> None:
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2, default=str))
    if report_path != run_dir / "report.json":
        (run_dir / "report.json").write_text(report_path.read_text())


def print_summary(report: Mapping[str, Any], path: Path) -> None:
    commit = report["commit"]
    shape = report["shape"]
    lines = [
        "",
        f"chaos run {report['run']} (seed {report['seed']}, {report['jobs_planned']} jobs"
        f"{', short' if report['short'] else ''}, Kueue wave {'on' if report['kueue_wave'] else 'off'})",
        f"commit {commit['sha'][:12]}{' (dirty: uncommitted changes)' if commit['dirty'] else ''}"
        + (f"; BROKEN BUILD: {report['broken_build']['name']}" if report.get("broken_build") else ""),
        f"shape: {shape['workers']} {shape['worker_pool']} worker(s) x {shape['worker_concurrency']}, "
        f"{shape['web']}; supervisor every {shape['supervisor_interval_seconds']} s, Kubernetes timeout "
        f"{shape['kube_timeout_seconds']:g} s",
        "durability: " + "; ".join(f"{k}: {v}" for k, v in report["durability"].items()),
        "",
    ]
    lines.append(f"{'figure':36} {'target':>8} {'value':>8}")
    for name, f in report["figures"].items():
        lines.append(f"{name:36} {f['target']!s:>8} {f['value']!s:>8}  {'ok' if f['ok'] else 'MISS'}")
    lines += ["", "faults:"]
    for f in report["faults"]:
        lines.append(
            f"  {f['at']:>6} s {f['fault']:13} {'verified' if f['verified'] else 'NOT VERIFIED'}: "
            f"{f.get('summary', '')}"
        )
    if report["mismatches"]:
        lines += ["", f"outcome mismatches ({len(report['mismatches'])}):"]
        for m in report["mismatches"][:30]:
            lines.append(
                f"  {m['job']} ({m['kind']}): expected {m['expected']['state']}/"
                f"{m['expected'].get('cause') or '-'}; {'; '.join(m['problems'])}"
            )
    if report["identity"]["violations"]:
        lines += ["", "identity violations:"]
        for v in report["identity"]["violations"][:20]:
            lines.append(
                f"  {v['kind']}: job {v['job']} attempt {v['attempt']} rank {v['rank']} "
                f"({len(v['pods'])} pods)"
            )
    identity = report["identity"]
    for o in identity["attempt_overlaps"][:10]:
        lines.append(
            f"  attempt overlap: job {o['job']} attempt {o['later_attempt']} "
            f"pod {o['later_pod_ran']['name']} ran before attempt {o['earlier_attempt']} "
            f"pod {o['earlier_pod_ended']['name']} ended"
        )
    for d in identity["trainjob_duplicates"][:10]:
        lines.append(
            f"  TrainJob duplicate ({d['by']} {d['key']}): "
            + ", ".join(f"{t['name']} {t['uid']}" for t in d["trainjobs"])
        )
    coverage = identity["coverage"]
    lines.append(
        f"observer: saw every rank run of {coverage['covered']} of {coverage['wanted']} final attempts; "
        f"{identity['trainjobs_seen']} TrainJobs; {len(identity['watch']['errors'])} errors, "
        f"{len(identity['watch']['gaps'])} gaps"
    )
    refusals = report.get("fence_refusals") or []
    lines.append(
        f"fence: {len(refusals)} Job(s) of ended attempts refused their pods"
        + "".join(f"\n  {r}" for r in refusals[:10])
    )
    for problem in report["unexpected_plan_answers"][:10]:
        lines.append(f"  unexpected plan answer (job {problem['job']}): {'; '.join(problem['problems'])}")
    lines += [
        "",
        f"requests: {report['requests']['answers']}, named 503s {report['requests']['named_503']}, "
        f"unanswered {report['requests']['unanswered_by_kind']}",
        f"states: {report['states']}  causes: {report['causes']}",
        f"report: {path}",
        "ALL FIGURES AT TARGET" if report["ok"] else "FIGURES OFF TARGET",
        "",
    ]
    print("\n".join(lines), flush=True)
