"""The planned jobs as the run submits and cancels them through dispatch's API."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from scripts.chaoslib.context import Context
from scripts.chaoslib.plan import POLICIES, JobPlan, expected_policy, job_body, policy_differences


def plan_problems(
    expected: Mapping[str, Any], status: int | None, planned: Mapping[str, Any] | None
) -> list[str]:
    """What is unexpected in dispatch's plan answer for a job of the run: anything but a 200, a recovery
    policy other than the one the harness's tables give, or any identity warning (dispatch-kind runs each
    rank once). Pure."""
    if status != 200 or planned is None:
        return [f"plan answered {status if status is not None else 'nothing'}"]
    problems = [f"recovery policy {d}" for d in policy_differences(expected, planned.get("recovery_policy"))]
    problems += [f"identity warning: {w}" for w in planned.get("identity_warnings") or []]
    return problems


def submit(ctx: Context, item: JobPlan, extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    run, client, token, run_deadline = ctx.run, ctx.client, ctx.token, ctx.run_deadline
    body = job_body(item, ctx.namespace, extra)
    entry: dict[str, Any] = {
        "index": item.index,
        "kind": item.kind,
        "policy_name": item.policy,
        "policy": expected_policy(POLICIES[item.policy]),  # the harness's, never dispatch's answer
        "plan": asdict(item),
    }
    answer = client.call("POST", "/api/v1/plan", token, run_deadline, json=body)
    planned = answer.json() if answer is not None and answer.status_code == 200 else None
    entry["unexpected_plan"] = plan_problems(
        entry["policy"], answer.status_code if answer is not None else None, planned
    )
    if planned is None:
        entry["error"] = (
            f"plan answered {answer.status_code}: {answer.text[:300]}"
            if answer is not None
            else "plan: no answer"
        )
    else:
        entry["identity_warnings"] = planned.get("identity_warnings") or []
        entry["plan_policy"] = planned.get("recovery_policy")
    key = f"chaos-{ctx.run_id}-{item.index}"
    response = client.call(
        "POST", "/api/v1/jobs", token, run_deadline, json=body, headers={"Idempotency-Key": key}
    )
    entry["submit_status"] = response.status_code if response is not None else None
    if response is not None and response.status_code == 202:
        entry["id"] = response.json()["id"]
        entry["accepted_at"] = run.t()
    elif response is not None:
        entry["error"] = f"submit answered {response.status_code}: {response.text[:300]}"
    with run.lock:
        run.jobs[item.index] = entry
    return entry if "id" in entry else None


def cancel(ctx: Context, entry: dict[str, Any]) -> None:
    outcome, unanswered = "unknown", False
    while time.monotonic() < ctx.run_deadline:
        response = ctx.client.once("POST", f"/api/v1/jobs/{entry['id']}/cancel", ctx.token)
        if response is None or response.status_code in (502, 503, 504):
            unanswered = unanswered or response is None
            time.sleep(1)
            continue
        if response.status_code == 202:
            outcome = "accepted"
        elif response.status_code == 409:
            outcome = "unknown" if unanswered else "refused"
        entry["cancel_status"] = response.status_code
        break
    entry["cancel"] = outcome
    entry["cancel_at"] = ctx.run.t()


def run_job(ctx: Context, item: JobPlan) -> None:
    time.sleep(max(0.0, ctx.run.started + item.at - time.monotonic()))
    entry = submit(ctx, item)
    if entry is not None and item.cancel_after is not None:
        time.sleep(item.cancel_after)
        cancel(ctx, entry)
