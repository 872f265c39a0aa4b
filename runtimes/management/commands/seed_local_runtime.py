"""Puts the local control plane's example runtime `dispatch-kind` on the allow-list (used by `make up`)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from runtimes import services
from runtimes.models import ReviewState
from runtimes.selectors import allow_list_entry


class Command(BaseCommand):
    help = (
        "Allow-list ClusterTrainingRuntime dispatch-kind for jobs and sessions, unless it is listed already "
        "(an entry whose review predates what reviews cover now is re-approved: it is the local example)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        entry = allow_list_entry("ClusterTrainingRuntime", "", "dispatch-kind")
        if entry is not None and entry.review != ReviewState.STALE:
            return
        services.allow_list_add(
            actor=None,
            kind="ClusterTrainingRuntime",
            namespace="",
            name="dispatch-kind",
            for_jobs=True,
            for_sessions=True,
            note="the local control plane's example runtime (make up)",
        )
        self.stdout.write(
            f"{'allow-listed' if entry is None else 're-approved'} ClusterTrainingRuntime/dispatch-kind"
        )
