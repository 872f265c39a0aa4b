from __future__ import annotations

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        from jobs.selectors import waiting_jobs_per_namespace
        from runtimes.selectors import register_waiting_jobs_counter

        register_waiting_jobs_counter(waiting_jobs_per_namespace)
