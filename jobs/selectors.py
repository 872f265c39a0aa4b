"""Reads: which jobs a user may see, filtered."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dispatch_site import roles
from jobs.models import Job


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """Platform and on-call read every job; everybody else reads their own."""
    queryset = Job.objects.select_related("owner")
    if roles.can_read_all_jobs(user):
        return queryset
    return queryset.filter(owner_id=user.pk)


def job_for(user: Any, job_id: str) -> Job | None:
    return jobs_visible_to(user).filter(pk=job_id).first()


def may_cancel(user: Any, job: Job) -> bool:
    return bool(job.owner_id == user.pk or roles.is_platform(user) or roles.is_oncall(user))


def jobs_filtered(
    user: Any, *, state: str = "", runtime: str = "", namespace: str = "", owner: str = ""
) -> QuerySet[Job]:
    queryset = jobs_visible_to(user)
    if state:
        queryset = queryset.filter(state=state)
    if runtime:
        queryset = queryset.filter(runtime_name=runtime)
    if namespace:
        queryset = queryset.filter(namespace=namespace)
    if owner:
        queryset = queryset.filter(owner__username=owner)
    return queryset
