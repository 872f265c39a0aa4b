"""Which function makes which fault, and one fault run at its planned moment (a fault that raises is a fault
not verified)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from scripts.chaoslib.context import Context
from scripts.chaoslib.faults_cluster import fault_eviction, fault_foreign_pods, fault_node_loss
from scripts.chaoslib.faults_kueue import fault_kueue_wave
from scripts.chaoslib.faults_plane import fault_kill_apiserver, fault_kill_controller
from scripts.chaoslib.faults_services import (
    fault_api_partition,
    fault_kill_worker,
    fault_label_domain,
    fault_postgres,
    fault_redis,
)
from scripts.chaoslib.plan import FaultPlan

FAULTS: Final[dict[str, Callable[[Context, FaultPlan, float], dict[str, Any]]]] = {
    "kill-worker": fault_kill_worker,
    "redis": fault_redis,
    "postgres": fault_postgres,
    "api-partition": fault_api_partition,
    "kill-apiserver": fault_kill_apiserver,
    "kill-trainer": fault_kill_controller,
    "kill-jobset": fault_kill_controller,
    "kill-kueue": fault_kill_controller,
    "eviction": fault_eviction,
    "node-loss": fault_node_loss,
    "label-domain": fault_label_domain,
    "foreign-pods": fault_foreign_pods,
    "kueue-wave": fault_kueue_wave,
}


def run_fault(ctx: Context, f: FaultPlan) -> None:
    run = ctx.run
    time.sleep(max(0.0, run.started + f.at - time.monotonic()))
    at = run.t()
    try:
        result = FAULTS[f.fault](ctx, f, at)
    except Exception as exc:
        result = {"verified": False, "summary": f"the fault raised {exc!r}"[:500]}
    run.fault_done({"fault": f.fault, "at": at, "planned_at": f.at, **result, "ended_at": run.t()})
