"""Deliberately broken builds, to show each figure can fail (`scripts/chaos.py --break NAME`).

A break of dispatch is an edit applied to a temporary copy of the checkout (never to the checkout itself,
never behind a switch in dispatch's code): the run copies the files git knows (committed or not) into its own
directory, replaces one exact piece of source text with the broken one (the piece must be there exactly
once, so a break whose code moved fails loudly instead of testing nothing), and runs web, workers, beat and
the pod watch from the copy. The run's own Django (settle, reconcile) stays on the checkout; no break touches
a model. A break of the harness (`observer-blind`) changes what the run does, not dispatch.

Each names the figure it must move off target; tests/scripts/test_chaos.py checks that every break still
applies to the current code.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scripts.chaoslib.common import REPO


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Break:
    name: str
    figure: str  # the figure the break must move off target
    what: str
    edits: tuple[Edit, ...] = ()  # none: a break of the harness itself
    faults: tuple[str, ...] = ()  # the faults that make it show (a shorter run: --faults)


BREAKS: Final[dict[str, Break]] = {
    b.name: b
    for b in (
        Break(
            "overlap",
            "attempt_overlap",
            "A+1 starts without waiting for attempt A's pods to stop (the supervisor's list of A's pods "
            "still running always comes back empty)",
            (
                Edit(
                    "jobs/supervision/retries.py",
                    "    domain = job.label_domain or SiteSettings.load().label_domain\n    attempt = "
                    "job.current_attempt\n",
                    '    return [], ""  # BROKEN (chaos --break overlap)\n'
                    "    domain = job.label_domain or SiteSettings.load().label_domain\n"
                    "    attempt = job.current_attempt\n",
                ),
            ),
            ("eviction",),
        ),
        Break(
            "recreate",
            "trainjob_duplicates",
            "every start deletes the TrainJob it just created and creates it again under its name (a "
            "delivery that replaces what it finds instead of adopting it)",
            (
                Edit(
                    "jobs/submission/start.py",
                    "            trainjob = create_trainjob_on_copy(\n"
                    "                plan.train_job, label_domain, job.id, before_create=fence, made=made\n"
                    "            )\n",
                    "            trainjob = create_trainjob_on_copy(\n"
                    "                plan.train_job, label_domain, job.id, before_create=fence, made=made\n"
                    "            )\n"
                    "            # BROKEN (chaos --break recreate)\n"
                    "            gateway.delete_namespaced(\n"
                    "                'TrainJob', job.namespace, execution.trainjob_name\n"
                    "            )\n"
                    "            import time as _time\n"
                    "            while gateway.get_namespaced('TrainJob', job.namespace, "
                    "execution.trainjob_name):\n"
                    "                _time.sleep(0.2)\n"
                    "            trainjob = create_trainjob_on_copy(\n"
                    "                plan.train_job, label_domain, job.id, before_create=fence, made=made\n"
                    "            )\n",
                ),
            ),
            ("eviction",),
        ),
        Break(
            "drop-claimed",
            "stuck_jobs",
            "a start claimed by a worker that died is never taken over: the stale sweep skips every "
            "execution that carries a claim, live or not (and the killed worker's message was acknowledged "
            "with it)",
            (
                Edit(
                    "jobs/submission/sweeps.py",
                    "    unclaimed = Q(claim_until__isnull=True) | Q(claim_until__lt=now)\n",
                    '    unclaimed = Q(claim_holder="")  # BROKEN (chaos --break drop-claimed)\n',
                ),
                Edit(
                    "dispatch_site/settings.py",
                    "CELERY_TASK_ACKS_LATE = True",
                    "CELERY_TASK_ACKS_LATE = False",
                ),
                Edit(
                    "jobs/submission/tasks.py",
                    "@shared_task(bind=True, name=enqueue.EXECUTION_SUBMIT, acks_late=True, "
                    "max_retries=MAX_SUBMIT_RETRIES)",
                    "@shared_task(bind=True, name=enqueue.EXECUTION_SUBMIT, acks_late=False, "
                    "max_retries=MAX_SUBMIT_RETRIES)  # BROKEN",
                ),
            ),
            ("kill-worker",),
        ),
        Break(
            "hide-identity",
            "observer_coverage_missing",
            "dispatch publishes the execution identity under another name (DISPATCH_JOB_ID): the observer "
            "sees no rank, so it finds nothing to judge, and only its coverage shows that it saw nothing",
            (
                Edit(
                    "jobs/plan.py",
                    'ENV_JOB: Final = "DISPATCH_JOB"\n',
                    'ENV_JOB: Final = "DISPATCH_JOB_ID"  # BROKEN (chaos --break hide-identity)\n',
                ),
            ),
            ("eviction",),
        ),
        Break(
            "plan-policy",
            "unexpected_plan_answers",
            "the site's default recovery policy is left out of every job's policy (plan and submission): "
            "only the built-in default and the job's own apply",
            (
                Edit(
                    "jobs/recovery.py",
                    "    for layer in (site_default or {}, override or {}):\n",
                    "    for layer in (override or {},):  # BROKEN (chaos --break plan-policy)\n",
                ),
            ),
            ("eviction",),
        ),
        Break(
            "observer-blind",
            "observer_errors",
            "the identity observer watches through dispatch's own path to the API server (the proxy the "
            "partition cuts, the API server the kill stops) instead of the witness API server",
            (),
            ("api-partition", "kill-apiserver"),
        ),
    )
}


def apply_edit(text: str, edit: Edit) -> str:
    """The text with the edit made; the piece it replaces must be there exactly once."""
    count = text.count(edit.old)
    if count != 1:
        raise ValueError(
            f"{edit.path}: the text a break replaces is there {count} times, not once (the code moved: "
            "update scripts/chaoslib/breaks.py)"
        )
    return text.replace(edit.old, edit.new)


def broken_copy(name: str, directory: Path, source: Path = REPO) -> Path:
    """A copy of `source` (the files git knows, committed or not, as they are on disk) in `directory`, with
    the break's edits made. Returns the copy's root."""
    chosen = BREAKS[name]
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for entry in filter(None, listed):
        relative = entry.decode()
        origin = source / relative
        if not origin.is_file():  # deleted in the working tree
            continue
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, target)
    for edit in chosen.edits:
        path = directory / edit.path
        path.write_text(apply_edit(path.read_text(), edit))
    (directory / "var").mkdir(exist_ok=True)
    return directory
