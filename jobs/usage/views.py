"""The usage page: GPU-hours per namespace per day (stacked bars), the share of GPU-hours lost to each cause,
and the queue waits per queue, for the days and namespace chosen; read from the daily rollup, scoped like
every read (jobs.usage.selectors)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dispatch_site.pages import page_login_required
from jobs.usage import charts, selectors

DAYS = 14


class UsageFilterForm(forms.Form):
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    namespace = forms.CharField(
        required=False, max_length=63, widget=forms.TextInput(attrs={"placeholder": "Namespace"})
    )


def _days(since: date, until: date) -> list[date]:
    return [since + timedelta(days=i) for i in range((until - since).days + 1)]


@page_login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    form = UsageFilterForm(request.GET)
    given: dict[str, Any] = form.cleaned_data if form.is_valid() else {}
    until = given.get("until") or datetime.now(UTC).date()
    since = given.get("since") or until - timedelta(days=DAYS - 1)
    if since > until:
        since, until = until, since
    since = max(since, until - timedelta(days=366))  # a year of bars at most
    namespace = given.get("namespace") or ""

    def query(group_by: str, step: str = "") -> list[dict[str, Any]]:
        q = selectors.UsageQuery(group_by=group_by, since=since, until=until, step=step, namespace=namespace)
        return selectors.usage_rows(request.user, q)

    per_day = query("namespace", "day")
    by_namespace = query("namespace")
    by_cause = query("cause")
    by_queue = [r for r in query("queue") if r["queue_wait_p50_seconds"] is not None]
    context = {
        "nav": "usage",
        "form": form,
        "since": since,
        "until": until,
        "bars": charts.stacked_bars(per_day, key="namespace", value="gpu_hours", periods=_days(since, until)),
        "lost": charts.shares({r["cause"]: r["gpu_hours_lost"] for r in by_cause}),
        "rows": by_namespace,
        "queues": by_queue,
        "total_gpu_hours": sum(r["gpu_hours"] for r in by_namespace),
        "total_lost": sum(r["gpu_hours_lost"] for r in by_namespace),
    }
    return render(request, "usage/usage.html", context)
