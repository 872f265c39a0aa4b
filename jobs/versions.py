"""ETags: a cheap fingerprint of what a job's answer shows, so a client that already has it gets a 304.

A job's answer changes when its row changes (every writer sets updated_at: transitions, supervision's
observations, cancel, start) or its timeline grows (an event can be written without touching the job row).
One aggregate query on the events' job index; the job row is already loaded."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db.models import Count, Max

from jobs.models import Job, JobEvent

# Bump when the shape of an answer changes: every ETag handed out before then stops matching.
FORMAT = "1"


def job_fingerprint(job: Job, *extra: object) -> str:
    timeline = JobEvent.objects.filter(job_id=job.pk).aggregate(n=Count("id"), top=Max("id"))
    raw = "|".join(
        str(part)
        for part in (FORMAT, job.pk, job.updated_at.isoformat(), timeline["n"], timeline["top"], *extra)
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def etag(fingerprint: str) -> str:
    return f'"{fingerprint}"'


def matches(if_none_match: str, current: str) -> bool:
    """Does an If-None-Match header name the current ETag (weak comparison, as RFC 9110 asks for it)?"""
    tags: Iterable[str] = (t.strip() for t in if_none_match.split(","))
    return any(t == "*" or t.removeprefix("W/") == current for t in tags if t)
