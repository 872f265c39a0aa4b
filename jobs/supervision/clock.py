"""The clock observations are ordered by (Execution.observed_at).

Two supervisors on different hosts write the same executions, and a write is refused when its observation
began before the one already written (jobs.supervision.apply). Host clocks disagree (a host a minute ahead
would have every other supervisor's newer observations refused for that minute, and its own older ones
accepted), so observations are timed by the one clock every supervisor shares: the database's. PostgreSQL's
`clock_timestamp()` is the time of the call (`now()` would be the start of an enclosing transaction).
SQLite serves only the single-host `make up`, where there is one host clock anyway."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.utils import timezone


def observation_time() -> datetime:
    """Now, on the database's clock (PostgreSQL), else the host's: call it before the reads begin."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        row = cursor.fetchone()
    value: datetime = row[0]
    return value
