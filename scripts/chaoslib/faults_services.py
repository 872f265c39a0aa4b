"""The faults to dispatch's own services, each verified as it happens: a Celery worker SIGKILLed, Redis and
PostgreSQL restarted, the API server unreachable (the proxy refuses), the label domain changed mid-run."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from scripts.chaoslib.context import Context
from scripts.chaoslib.plan import FaultPlan


def proxy_answers(ctx: Context) -> tuple[bool, str]:
    """Whether the API server answers /version through the proxy (what dispatch sees)."""
    try:
        return True, str(ctx.through_proxy.get_code(_request_timeout=5).git_version)
    except Exception as exc:
        return False, repr(exc)[:200]


def fault_kill_worker(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
    stack, kill_lock = ctx.stack, ctx.kill_lock
    with kill_lock:  # one kill at a time: each restarted worker is tracked, none leaks
        # The seed's worker, or the next one alive: a worker that died on its own is not killed again
        # (workers_exited_on_their_own counts it) but is started again, as a supervisor would.
        order = [(f.pick + n) % len(stack.workers) for n in range(len(stack.workers))]
        for dead in [i for i in order if stack.workers[i].poll() is not None]:
            stack.start_worker(dead)
        index = order[0]
        victim = stack.workers[index]
        alive_before = victim.poll() is None
        stack.killed.add(victim.pid)
        victim.send_signal(signal.SIGKILL)
        code = victim.wait(30)
        time.sleep(1)
        new = stack.start_worker(index)
        time.sleep(3)
        alive = new.poll() is None
    verified = alive_before and code == -signal.SIGKILL and alive and new.pid != victim.pid
    return {
        "verified": verified,
        "summary": f"worker {index}: pid {victim.pid} exited {code}, new pid {new.pid} "
        f"{'running' if alive else 'NOT running'}",
        "evidence": {
            "worker": index,
            "old_pid": victim.pid,
            "exit": code,
            "new_pid": new.pid,
            "new_running": alive,
        },
    }


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
    pg, pg_pids = ctx.pg, ctx.pg_pids
    old = pg.pid()
    before, _ = pg.answer()
    pg.stop()
    up, error = pg.answer()
    time.sleep(5)
    new = pg.start()
    pg_pids.append(new)
    after, directory = pg.answer()
    ours = after and Path(directory).resolve() == pg.data.resolve()
    verified = before and not up and ours and new != old
    return {
        "verified": verified,
        "summary": f"postmaster {old} stopped: connections refused ({error[:60]}); "
        f"postmaster {new} accepts ({'our data directory' if ours else directory})",
        "evidence": {
            "postmaster_before": old,
            "down_error": error,
            "postmaster_after": new,
            "data_directory": directory,
        },
    }


def fault_api_server(ctx: Context, f: FaultPlan, at: float) -> dict[str, Any]:
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
