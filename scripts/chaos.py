#!/usr/bin/env python3
"""make chaos: the entry point. The run is in scripts/chaoslib/ (what it does: scripts/chaoslib/cli.py, or
`scripts/chaos.py --help`); the names tests and callers use are here as they always were.

    scripts/chaos.py --jobs 200 --seed 1     # make chaos; var/chaos/<run>/report.json
    scripts/chaos.py --jobs 12 --short       # the short run inside `make test` (tests/scripts/test_chaos.py)
    scripts/chaos.py --jobs 20 --break overlap --faults eviction   # a deliberately broken build: exits 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `scripts` from the repository

from scripts.chaoslib.breaks import BREAKS, Break, apply_edit, broken_copy
from scripts.chaoslib.cli import main
from scripts.chaoslib.jobs import plan_problems
from scripts.chaoslib.outcomes import (
    SEEN_WITHIN,
    START_RECOVERY_SECONDS,
    TERMINAL,
    Hit,
    expected_outcomes,
    judge_job,
    mismatch,
    retried,
)
from scripts.chaoslib.plan import (
    APP_ERROR,
    KUEUE_HIGH,
    KUEUE_LOW,
    LONG,
    POLICIES,
    SITE_DEFAULT_POLICY,
    SUCCEEDS,
    UNTIL_CANCELLED,
    FaultPlan,
    JobPlan,
    RunPlan,
    expected_policy,
    job_body,
    make_plan,
    policy_differences,
)
from scripts.chaoslib.proxy import Proxy
from scripts.chaoslib.report import figure, print_summary
from scripts.provenance import commit_of

__all__ = [
    "APP_ERROR",
    "BREAKS",
    "KUEUE_HIGH",
    "KUEUE_LOW",
    "LONG",
    "POLICIES",
    "SEEN_WITHIN",
    "SITE_DEFAULT_POLICY",
    "START_RECOVERY_SECONDS",
    "SUCCEEDS",
    "TERMINAL",
    "UNTIL_CANCELLED",
    "Break",
    "FaultPlan",
    "Hit",
    "JobPlan",
    "Proxy",
    "RunPlan",
    "apply_edit",
    "broken_copy",
    "commit_of",
    "expected_outcomes",
    "expected_policy",
    "figure",
    "job_body",
    "judge_job",
    "main",
    "make_plan",
    "mismatch",
    "plan_problems",
    "policy_differences",
    "print_summary",
    "retried",
]

if __name__ == "__main__":
    sys.exit(main())
