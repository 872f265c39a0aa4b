"""make bench, Kueue part (issue 19): from the moment quota frees to a job running, a dispatch job against a
bare TrainJob that Kueue admits alone (target: dispatch / bare <= 1.2, the median of paired rounds).

Setup, on the local control plane with Kueue (`scripts/cluster up --kueue`): a namespace of the bench's own
with a LocalQueue on a ClusterQueue of its own whose quota fits exactly one job (nvidia.com/gpu 2; every job
here, dispatch's or bare, is dispatch-kind with 2 nodes x 1 GPU, and its pods stay running under KWOK).
A real dispatch runs beside it: a gunicorn server (the REST API), a Celery worker (threads pool; it starts
the job) and `manage.py supervise` (watches; a cycle as soon as something changed).

One round, for one side (rounds interleave: dispatch, bare, dispatch, bare, ... so drift hits both):
1. a "blocker" TrainJob (bare, in the queue) is admitted and its pods run: it holds the whole quota;
2. the subject waits in the queue: dispatch's job is submitted with POST /api/v1/jobs (queue_name) and read
   `queued` through GET /api/v1/jobs/<id>; the bare TrainJob is created straight through the kubernetes
   client. Either way its Workload is pending (QuotaReserved False) before the clock can start;
3. the blocker TrainJob is deleted. The clock starts at t0, the instant quota frees as the cluster shows it:
   the first watch event of the blocker's Workload that carries a deletionTimestamp (or is DELETED); Kueue
   releases a Workload's quota as it sees it being deleted. The same instant, observed the same way, for both
   sides;
4. the clock stops: for dispatch, when GET /api/v1/jobs/<id> first answers state `running` (the path a user
   sees; polled every POLL seconds, the time the answer arrived); for the bare TrainJob, when the bench's own
   pod watch first shows all its 2 pods Running (no deletionTimestamp).
The same watches give the steps between, for both sides: quota freed -> the subject's Workload has
QuotaReserved -> all its pods Running (and, for dispatch, -> dispatch says running).

Run alone: `python scripts/bench_kueue.py` (BENCH_KUEUE_ROUNDS=n pairs, default 7; BENCH_KUEUE_FAULT=slowcycle
makes every supervision cycle start 1 s late, a deliberate fault the figure must show and the target fail on).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import Target  # noqa: E402
from scripts.bench_kueue_cluster import (  # noqa: E402 - needs the repository on sys.path first
    FAULT,
    FAULT_DELAY,
    GPU_PER_NODE,
    IMAGE,
    LOCAL_QUEUE,
    NAMESPACE,
    POLL,
    QUOTA_GPUS,
    RANKS,
    ROUNDS,
    RUNTIME,
    SETTLE,
    TARGET,
    TRAINER,
    USER,
    Skip,
    Watches,
    apis,
    bare_trainjob,
    empty_namespace,
    ensure_queue,
    kueue_down,
    kueue_on_plane,
    kueue_up,
    log,
    pending,
    reserved,
)
from scripts.bench_kueue_dispatch import Api, start_processes, supervisor_main  # noqa: E402

__all__ = ["kueue_down", "kueue_up", "met", "report_lines", "run", "summarize"]


# ---------------------------------------------------------------- one round


def _round(
    side: str, number: int, custom: Any, core: Any, watches: Watches, api: Api | None
) -> dict[str, Any]:
    empty_namespace(custom, core)
    blocker = f"blocker-{side[0]}{number}"
    began = time.monotonic()
    custom.create_namespaced_custom_object(*TRAINER, NAMESPACE, "trainjobs", bare_trainjob(blocker))
    watches.wait(f"{blocker}'s pods running", lambda: watches.pods_running(blocker, began))
    # Its pods running is not enough: right after Kueue is installed its webhook may not yet suspend a new
    # TrainJob, which then runs without holding quota (a round of make bench measured -7.0 s that way).
    watches.wait(
        f"{blocker}'s Workload holding the quota", lambda: watches.workload_state(blocker, began, reserved)
    )
    job_id = ""
    if side == "bare":
        subject = f"bare-{number}"
        custom.create_namespaced_custom_object(*TRAINER, NAMESPACE, "trainjobs", bare_trainjob(subject))
    else:
        assert api is not None
        status, body, _ = api.call(
            "POST",
            "jobs",
            {
                "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
                "namespace": NAMESPACE,
                "image": IMAGE,
                "num_nodes": RANKS,
                "env": {"KWOK_STAY_RUNNING": "1"},
                "resources_per_node": GPU_PER_NODE,
                "queue_name": LOCAL_QUEUE,
            },
        )
        if status != 202:
            raise RuntimeError(f"POST /api/v1/jobs: {status} {body}")
        job_id = str(body["id"])
        subject = f"{job_id}-1"
        observing = time.monotonic()
        api.wait_observed(job_id)
        log(
            f"round {number} dispatch: job {job_id} queued and observed by supervision after "
            f"{time.monotonic() - observing:.2f} s"
        )
    watches.wait(f"{subject}'s Workload pending", lambda: watches.workload_state(subject, began, pending))
    if api is not None and job_id:
        state = api.state(job_id)
        if state != "queued":
            raise RuntimeError(f"job {job_id} reads {state} while its Workload waits for quota")
    time.sleep(SETTLE)
    deleted_at = time.monotonic()
    custom.delete_namespaced_custom_object(
        *TRAINER, NAMESPACE, "trainjobs", blocker, propagation_policy="Background"
    )
    end: float
    if side == "bare":
        end = watches.wait(f"{subject}'s pods running", lambda: watches.pods_running(subject, deleted_at))
    else:
        assert api is not None
        end, _ = api.wait_state(job_id, {"running"})
    freed = watches.wait(
        "the blocker's Workload released", lambda: watches.workload_released(blocker, deleted_at)
    )
    admitted = watches.wait(
        f"{subject} admitted", lambda: watches.workload_state(subject, deleted_at, reserved)
    )
    pods = watches.wait(f"{subject}'s pods running", lambda: watches.pods_running(subject, deleted_at))
    gone = watches.wait("the blocker's Workload gone", lambda: watches.workload_gone(blocker, deleted_at))
    if admitted < freed:
        raise MeasuredNothing(
            f"round {number} {side}: {subject} was admitted {freed - admitted:.3f} s before the blocker's "
            "quota freed: the blocker did not hold the quota, and the round measures nothing"
        )
    row = {
        "side": side,
        "round": number,
        "seconds": end - freed,
        "admit_s": admitted - freed,
        "pods_s": pods - admitted,
        "after_pods_s": end - pods,  # dispatch: pods running -> GET says running; bare: 0
        "delete_to_freed_s": freed - deleted_at,
        "freed_to_gone_s": gone - freed,  # deletionTimestamp seen -> the Workload DELETED
        "after_admit_s": end - admitted,  # admitted -> running: what follows Kueue's admission
    }
    if os.environ.get("BENCH_KUEUE_STATS") == "1":
        log(
            f"monotonic: deleted {deleted_at:.3f} freed {freed:.3f} admitted {admitted:.3f} "
            f"pods {pods:.3f} end {end:.3f}"
        )
    log(
        f"round {number} {side}: {row['seconds']:.3f} s (admitted {row['admit_s']:.3f}, pods running "
        f"+{row['pods_s']:.3f}, then +{row['after_pods_s']:.3f})"
    )
    if job_id and api is not None:
        api.call("POST", f"jobs/{job_id}/cancel", {})
        with contextlib.suppress(RuntimeError):
            api.wait_state(job_id, {"cancelled"}, timeout=30)
    return row


STEPS = ("admit_s", "pods_s", "after_pods_s", "delete_to_freed_s", "freed_to_gone_s", "after_admit_s")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


class MeasuredNothing(RuntimeError):
    """A round whose subject was admitted before the quota freed: its clock measured nothing. The pair is left
    out of the figure and named in the report; it does not end the rest of make bench."""


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per side, and over the rounds' pairs (dispatch's round n against bare's round n)."""
    dispatch = [r for r in rows if r["side"] == "dispatch"]
    bare = [r for r in rows if r["side"] == "bare"]
    ratios = [d["seconds"] / b["seconds"] for d, b in zip(dispatch, bare, strict=False)]
    after_admit = [d["after_admit_s"] / b["after_admit_s"] for d, b in zip(dispatch, bare, strict=False)]

    def med(side: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in side)

    return {
        "pairs": len(ratios),
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "ratio_p95": _p95(ratios),
        "after_admit_ratio": statistics.median(after_admit),
        "dispatch_s": med(dispatch, "seconds"),
        "bare_s": med(bare, "seconds"),
        "dispatch_p95_s": _p95([r["seconds"] for r in dispatch]),
        "bare_p95_s": _p95([r["seconds"] for r in bare]),
        "steps": {
            side: {k: med(group, k) for k in STEPS}
            for side, group in (("dispatch", dispatch), ("bare", bare))
        },
    }


def run(kubeconfig: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """The section: Django is set up (DATABASE_URL, the bench's settings); returns the rows and the summary,
    or {"skipped": why} when Kueue is not on the plane."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create
    from runtimes.models import AllowListEntry
    from scripts.bench_common import free_port, server_env, wait_http

    api_client, custom, core = apis(kubeconfig)
    why = kueue_on_plane(api_client)
    if why:
        return {"skipped": why, "fault": FAULT}
    try:
        ensure_queue(api_client, custom, core)
    except Skip as exc:
        return {"skipped": str(exc), "fault": FAULT}
    settings.KUBECONFIG = kubeconfig
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", namespace="", name=RUNTIME)
    User.objects.filter(username=USER).delete()
    owner, token = user_create(username=USER, role=roles.USER, namespaces=[NAMESPACE])
    env = server_env(os.environ["DATABASE_URL"], kubeconfig, allowed_hosts="127.0.0.1,localhost")
    env["METRICS_PORT"] = ""  # none: the supervisor and worker serve no metrics port here
    port = free_port()
    log_file = REPO / "var" / "bench-kueue.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    processes = start_processes(env, log_file, port)
    watches = Watches(api_client, custom, core).start()
    rows: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        api = Api(port, token)
        log(f"{rounds} paired rounds (dispatch, bare, ...); logs in {log_file}")
        for number in range(1, rounds + 1):
            pair = []
            try:
                for side in ("dispatch", "bare"):
                    client = api if side == "dispatch" else None
                    pair.append(_round(side, number, custom, core, watches, client))
            except MeasuredNothing as exc:
                log(f"{exc}; the pair is left out")
                refused.append(str(exc))
                continue
            rows += pair
    finally:
        watches.stop()
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        with contextlib.suppress(Exception):
            empty_namespace(custom, core)
        owner.jobs.all().delete()
        owner.delete()
        api_client.close()
    if not rows:
        return {"fault": FAULT, "rows": rows, "refused": refused, "pairs": 0}
    return {"fault": FAULT, "rows": rows, "refused": refused, **summarize(rows)}


def met(result: dict[str, Any]) -> bool:
    return bool(result.get("pairs")) and result["ratio"] <= TARGET


def targets(result: dict[str, Any]) -> list[Target]:
    if result.get("skipped"):
        return []
    if not result.get("pairs"):
        return [
            Target("Kueue: quota frees -> running, dispatch / bare", "no valid round", f"<= {TARGET}", False)
        ]
    return [
        Target(
            "Kueue: quota frees -> the job running, dispatch / a bare TrainJob Kueue admits alone",
            f"{result['ratio']:.2f}",
            f"<= {TARGET}",
            met(result),
            f"median of {result['pairs']} paired rounds ({', '.join(f'{r:.2f}' for r in result['ratios'])})",
        )
    ]


def report_lines(result: dict[str, Any]) -> list[str]:
    fault = (
        f" (deliberate fault: {result['fault']}, each supervision cycle {FAULT_DELAY:.0f} s late)"
        if result.get("fault")
        else ""
    )
    lines = ["", f"## Kueue: quota frees -> the job runs, dispatch / a bare TrainJob{fault}", ""]
    if result.get("skipped"):
        return [*lines, f"Skipped: {result['skipped']}."]
    lines += [
        f"A ClusterQueue whose quota fits one job (nvidia.com/gpu {QUOTA_GPUS}; each job dispatch-kind, "
        f"{RANKS} nodes x 1 GPU); a blocker TrainJob holds it, the subject waits queued, the blocker is "
        "deleted. The clock starts when the bench's Workload watch sees the blocker's Workload being deleted "
        "(quota frees), and stops when GET /api/v1/jobs/<id> first answers `running` (dispatch: gunicorn, a "
        f"Celery worker, `manage.py supervise`; polled every {POLL * 1000:.0f} ms) or when the bench's pod "
        f"watch sees all {RANKS} pods of the bare TrainJob Running. Rounds interleave dispatch, bare, ...",
        "",
        "| round | dispatch s | bare s | ratio | dispatch: admitted / pods running / GET running (s after "
        "freed) | bare: admitted / pods running |",
        "|---|---|---|---|---|---|",
    ]
    refused = result.get("refused") or []
    if refused:
        lines = [
            *lines[:-3],
            "",
            f"Left out, {len(refused)} round(s) that measured nothing: " + "; ".join(refused) + ".",
            *lines[-3:],
        ]
    if not result.get("pairs"):
        return [
            *lines[:-3],
            "| measure | value | target | met |",
            "|---|---|---|---|",
            f"| quota frees -> running, dispatch / bare TrainJob | no valid round | <= {TARGET} | NO |",
        ]
    dispatch = [r for r in result["rows"] if r["side"] == "dispatch"]
    bare = [r for r in result["rows"] if r["side"] == "bare"]
    for d, b, ratio in zip(dispatch, bare, result["ratios"], strict=False):
        lines.append(
            f"| {d['round']} | {d['seconds']:.3f} | {b['seconds']:.3f} | {ratio:.2f} "
            f"| {d['admit_s']:.3f} / {d['admit_s'] + d['pods_s']:.3f} / {d['seconds']:.3f} "
            f"| {b['admit_s']:.3f} / {b['admit_s'] + b['pods_s']:.3f} |"
        )
    d, b = result["steps"]["dispatch"], result["steps"]["bare"]
    lines += [
        "",
        f"Medians of the steps (s), dispatch / bare: quota freed -> the subject's Workload has "
        f"QuotaReserved {d['admit_s']:.3f} / {b['admit_s']:.3f} (Kueue alone; the blocker's Workload is "
        f"DELETED {d['freed_to_gone_s']:.3f} / {b['freed_to_gone_s']:.3f} after it starts being deleted); "
        f"admitted -> all pods Running {d['pods_s']:.3f} / {b['pods_s']:.3f}; pods Running -> dispatch's GET "
        f"says running {d['after_pods_s']:.3f}. From admission on (admitted -> running) dispatch / bare is "
        f"{result['after_admit_ratio']:.2f} (median of the pairs; no target: the issue's figure starts when "
        "quota frees).",
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| quota frees -> running, dispatch / bare TrainJob, median of {result['pairs']} paired rounds "
        f"(medians {result['dispatch_s']:.3f} / {result['bare_s']:.3f} s; p95 "
        f"{result['dispatch_p95_s']:.3f} / {result['bare_p95_s']:.3f} s; "
        f"ratio p95 {result['ratio_p95']:.2f}) "
        f"| {result['ratio']:.2f} | <= {TARGET} | {'yes' if met(result) else 'NO'} |",
    ]
    return lines


def main() -> None:
    """Alone: Django on DATABASE_URL, the local control plane with Kueue (KUBECONFIG or scripts/cluster up
    --kueue; Kueue started on the local plane if it is not there, and stopped again after). Writes
    var/bench/kueue[-fault].md and .json (or in BENCH_KUEUE_OUT); exits 1 when the target is not met."""
    if not os.environ.get("KUBECONFIG"):
        up = subprocess.run(
            [str(REPO / "scripts" / "cluster"), "up", "--kueue"], capture_output=True, text=True, check=False
        )
        if up.returncode != 0:
            sys.exit(f"scripts/cluster up --kueue failed:\n{up.stderr[-3000:]}")
        os.environ["KUBECONFIG"] = up.stdout.strip().splitlines()[-1]
    kubeconfig = os.environ["KUBECONFIG"]
    started = kueue_up(kubeconfig)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    try:
        result = run(kubeconfig)
    finally:
        if started:
            kueue_down()
    report = "\n".join(report_lines(result)) + "\n"
    out = Path(os.environ.get("BENCH_KUEUE_OUT", str(REPO / "var" / "bench")))
    out.mkdir(parents=True, exist_ok=True)
    name = f"kueue{'-' + FAULT if FAULT else ''}"
    (out / f"{name}.md").write_text(report)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    print(report)
    if not result.get("skipped") and not met(result):
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "supervisor":
        supervisor_main(sys.argv[2] if len(sys.argv) > 2 else "")
    else:
        main()
