"""The faults to dispatch's own services, each verified as it happens: a Celery worker SIGKILLed while it
holds a start, Redis restarted, PostgreSQL crashed on durable settings and restarted, the API server cut off
from dispatch (the proxy refuses), the label domain changed mid-run."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

from scripts.chaoslib.common import log
from scripts.chaoslib.context import Context
from scripts.chaoslib.outcomes import START_RECOVERY_SECONDS
from scripts.chaoslib.plan import FaultPlan


def proxy_answers(ctx: Context) -> tuple[bool, str]:
    """Whether the API server answers /version through the proxy (what dispatch sees)."""
    try:
        return True, str(ctx.through_proxy.get_code(_request_timeout=5).git_version)
    except Exception as exc:
        return False, repr(exc)[:200]


RECEIVED = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]{36})\] received")


def starts_held(ctx: Context, index: int) -> tuple[list[str], list[dict[str, Any]]]:
    """What worker `index` holds, from its own log and the claims: the execution_submit deliveries it logged
    as received since it started (Celery logs every delivery at INFO, the level make up runs), and the
    executions whose claim one of them holds in the database now (a start's claim is its delivery's task id,
    released when the start ends). Workers run as make up runs them: they do not answer remote control
    (WORKER_REMOTE_CONTROL is off), so the harness does not ask them."""
    from django.db import connections
    from django.utils import timezone

    from jobs.enqueue import EXECUTION_SUBMIT
    from jobs.models import Execution

    received = RECEIVED.finditer(ctx.stack.worker_log_since_start(index))
    tasks = sorted({m["id"] for m in received if m["name"] == EXECUTION_SUBMIT})
    if not tasks:
        return [], []
    try:
        claims = list(
            Execution.objects.filter(claim_holder__in=tasks, claim_until__gt=timezone.now()).values(
                "id", "job_id", "attempt", "claim_holder", "claim_until", "state"
            )
        )
    finally:
        connections.close_all()
    return [c["claim_holder"] for c in claims], [{**c, "claim_until": str(c["claim_until"])} for c in claims]


def fault_kill_worker(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    """A worker SIGKILLed while it holds at least one start (the plan submits two jobs as this begins, so
    there are starts to catch). Each round asks every live worker, the seed's first, what it holds (its log
    and the claims: starts_held); one that holds a start is stopped (SIGSTOP: it can neither finish nor give
    up what it holds) and the database read again for the claims its tasks hold; with one held it is
    killed, else let go on (SIGCONT), up to 90 s. After the kill the claims are read again: a dead worker's
    claims, which only the claim's lease running out (and the stale sweep) can free."""
    stack, kill_lock = ctx.stack, ctx.kill_lock
    with kill_lock:  # one kill at a time: each restarted worker is tracked, none leaks
        # A worker that died on its own is not killed again (workers_exited_on_their_own counts it) but is
        # started again, as a supervisor would.
        order = [(f.pick + n) % len(stack.workers) for n in range(len(stack.workers))]
        for dead in [i for i in order if stack.workers[i].poll() is not None]:
            stack.start_worker(dead)
            time.sleep(3)
        alive_before = {i: stack.workers[i].poll() is None for i in order}
        index = order[0]
        tasks: list[str] = []
        claims: list[dict[str, Any]] = []
        asked = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not claims:
            asked += 1
            for candidate in order:
                worker = stack.workers[candidate]
                if worker.poll() is not None:
                    continue
                try:
                    running_tasks, _ = starts_held(ctx, candidate)
                    if running_tasks:
                        worker.send_signal(signal.SIGSTOP)
                        tasks, claims = starts_held_frozen(ctx, running_tasks)
                        if claims:
                            index = candidate
                            break
                        worker.send_signal(signal.SIGCONT)
                except Exception as exc:  # an outage may be on: ask again
                    worker.send_signal(signal.SIGCONT)
                    log(f"kill-worker: asking worker {candidate}: {exc!r}"[:300])
            time.sleep(0.2)
        victim = stack.workers[index]
        stack.killed.add(victim.pid)
        victim.send_signal(signal.SIGKILL)
        code = victim.wait(30)
        killed_at = ctx.run.t()
        for claim in claims:  # dispatch may not know these attempts exist until the claims are taken over
            ctx.run.start_held(
                str(claim["job_id"]), int(claim["attempt"]), killed_at + START_RECOVERY_SECONDS
            )
        after = claims_now(ctx, [c["id"] for c in claims])
        time.sleep(1)
        new = stack.start_worker(index)
        time.sleep(3)
        alive = new.poll() is None
    left = [c for c in after if c["claim_holder"] in tasks]
    verified = (
        alive_before[index] and code == -signal.SIGKILL and alive and new.pid != victim.pid and bool(left)
    )
    return {
        "verified": verified,
        "summary": f"worker {index}: pid {victim.pid} exited {code} holding {len(claims)} start(s) "
        f"({len(left)} claim(s) left by it after the kill), new pid {new.pid} "
        f"{'running' if alive else 'NOT running'}"
        + ("" if claims else f"; no start held by any worker in 90 s ({asked} rounds)"),
        "evidence": {
            "worker": index,
            "node": stack.names[index] if index < len(stack.names) else None,
            "old_pid": victim.pid,
            "exit": code,
            "killed_at": killed_at,
            "tasks_held": tasks,
            "claims_held_when_killed": claims,
            "claims_left_after_kill": left,
            "new_pid": new.pid,
            "new_running": alive,
        },
    }


def starts_held_frozen(ctx: Context, tasks: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """The claims the (stopped) worker's tasks hold, read again once it is frozen: a claim still live now is
    one it can neither finish nor give up."""
    from django.db import connections
    from django.utils import timezone

    from jobs.models import Execution

    try:
        claims = list(
            Execution.objects.filter(claim_holder__in=tasks, claim_until__gt=timezone.now()).values(
                "id", "job_id", "attempt", "claim_holder", "claim_until", "state"
            )
        )
    finally:
        connections.close_all()
    return tasks, [{**c, "claim_until": str(c["claim_until"])} for c in claims]


def claims_now(ctx: Context, execution_ids: list[int]) -> list[dict[str, Any]]:
    from django.db import connections

    from jobs.models import Execution

    try:
        return [
            {**c, "claim_until": str(c["claim_until"])}
            for c in Execution.objects.filter(pk__in=execution_ids).values(
                "id", "claim_holder", "claim_until", "state"
            )
        ]
    finally:
        connections.close_all()


def fault_redis(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    redis_server, redis_pids = ctx.redis_server, ctx.redis_pids
    before, pid_before = redis_server.ping()
    redis_server.stop()
    refused, error = redis_server.ping()
    time.sleep(5)
    new_pid = redis_server.start()
    redis_pids.append(new_pid)
    after, answered_by = redis_server.ping()
    verified = before and not refused and after and answered_by == str(new_pid) and pid_before != answered_by
    return {
        "verified": verified,
        "summary": f"PING answered by {pid_before}, then refused ({error[:60]}), "
        f"then answered by {answered_by} (started {new_pid})",
        "evidence": {
            "pid_before": pid_before,
            "down_error": error,
            "pid_after": answered_by,
            "started_pid": new_pid,
        },
    }


def fault_postgres(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    """PostgreSQL crashes (every process SIGKILLed at once) on durable settings and starts again: crash
    recovery, a new postmaster, and every job answered 202 before the crash still there."""
    pg, pg_pids = ctx.pg, ctx.pg_pids
    old = pg.pid()
    before, _ = pg.answer()
    settings = pg.durability()
    with ctx.run.lock:
        accepted = [e["id"] for e in ctx.run.jobs.values() if e.get("id")]
    log_offset = pg.log.stat().st_size if pg.log.exists() else 0
    killed = pg.crash()
    up, error = pg.answer()
    time.sleep(3)
    new = pg.start()
    pg_pids.append(new)
    after, directory = pg.answer()
    ours = after and Path(directory).resolve() == pg.data.resolve()
    text = pg.log.read_text(errors="replace")[log_offset:] if pg.log.exists() else ""
    recovered = "automatic recovery in progress" in text or "not properly shut down" in text
    lost = missing_jobs(accepted)
    durable = all(v == "on" for v in settings.values())
    verified = before and not up and ours and new != old and recovered and durable and not lost
    return {
        "verified": verified,
        "summary": f"postmaster {old} and {len(killed) - 1} other processes SIGKILLed ({_on(settings)}): "
        f"connections refused ({error[:50]}); postmaster {new} "
        f"{'ran crash recovery' if recovered else 'did NOT run crash recovery'}; "
        f"{len(accepted) - len(lost)} of {len(accepted)} accepted jobs there",
        "evidence": {
            "postmaster_before": old,
            "killed": killed,
            "durability": settings,
            "down_error": error,
            "postmaster_after": new,
            "data_directory": directory,
            "crash_recovery_logged": recovered,
            "accepted_before": len(accepted),
            "accepted_lost": lost,
        },
    }


def _on(settings: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items())


def missing_jobs(job_ids: list[str]) -> list[str]:
    """The jobs of these ids the database does not have (read afresh, retried while it starts up)."""
    from django.db import connections

    from jobs.models import Job

    deadline = time.monotonic() + 60
    while True:
        try:
            found = set(Job.objects.filter(pk__in=job_ids).values_list("pk", flat=True))
            return sorted(set(job_ids) - found)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
        finally:
            connections.close_all()


def fault_api_partition(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    args, proxy = ctx.args, ctx.proxy
    before, version = proxy_answers(ctx)
    proxy.pause()
    refused, error = proxy.refuses()
    time.sleep(args.outage_seconds / 2)
    refused_later, _ = proxy.refuses()
    time.sleep(args.outage_seconds / 2)
    proxy.resume()
    after, _ = proxy_answers(ctx)
    verified = before and refused and refused_later and after
    return {
        "verified": verified,
        "summary": f"through the proxy: answered {before} ({version}), refused {refused} "
        f"({error[:50]}), answered again {after}; {args.outage_seconds:.0f} s",
        "evidence": {
            "answered_before": before,
            "refused": refused,
            "still_refused_midway": refused_later,
            "answered_after": after,
            "seconds": args.outage_seconds,
        },
    }


def fault_label_domain(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    run, client, hexid = ctx.run, ctx.client, ctx.hexid
    platform_token, run_deadline = ctx.platform_token, ctx.run_deadline
    new = f"chaos-{hexid}.example.com"
    before = client.call("GET", "/api/v1/settings", platform_token, run_deadline)
    old = before.json().get("label_domain") if before is not None and before.status_code == 200 else None
    response = client.call(
        "PATCH", "/api/v1/settings", platform_token, run_deadline, json={"label_domain": new}
    )
    after = client.call("GET", "/api/v1/settings", platform_token, run_deadline)
    now_domain = after.json().get("label_domain") if after is not None and after.status_code == 200 else None
    verified = response is not None and response.status_code == 200 and now_domain == new and old != new
    if verified:
        with run.lock:
            run.domains.append(new)
    return {
        "verified": verified,
        "summary": f"label domain {old} -> {now_domain} "
        f"(PATCH {response.status_code if response is not None else 'no answer'})",
        "evidence": {"old": old, "new": new, "read_back": now_domain},
    }
