"""Dashboard pages: the overview (home), refusals, the job list, the job page on-call reads, and cancel.

The live parts (the list's rows, the job page's status, the overview's cluster box) are partials that htmx
polls; an htmx request gets only the partial. What needs the cluster (Events, log lines) is a partial of its
own loaded after the page, so a slow or unreachable API server never holds the page up.
"""

from __future__ import annotations

import hashlib
import html
import json
from typing import Any
from urllib.parse import urlencode

import yaml
from django import forms
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from cluster import client as cluster_client
from cluster import guard as cluster_guard
from cluster import health as cluster_health
from cluster import logs as cluster_logs
from cluster.errors import ClusterError
from dispatch_site import roles
from dispatch_site.causes import Cause
from dispatch_site.pages import POLL_SECONDS, page_login_required, render_live
from jobs import selectors, versions
from jobs.dashboard import selectors as dashboard
from jobs.dashboard.logs_api import LOG_PAGE_TAIL, LogNotFound, log_read_record, read_rank_log
from jobs.models import ACTIVE_STATES, Execution, Job, JobState
from jobs.naming import runtime_copy_name
from jobs.observability import feed
from jobs.submission import cancel, errors
from runtimes.fixes import FIXES, fix_for
from runtimes.selectors import site_settings

CLUSTER_POLL_SECONDS = 15


# ---------------------------------------------------------------- overview


WINDOW_CHOICES = [("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days")]


@page_login_required
def home_page(request: HttpRequest) -> HttpResponse:
    window = request.GET.get("window", "24h")
    if window not in selectors.WINDOWS:
        window = "24h"
    user = request.user
    refusal_groups = dashboard.refusals(user, window="7d")
    context = {
        "nav": "home",
        "window": window,
        "windows": WINDOW_CHOICES,
        "counts": dashboard.counts(user, window),
        "refusal_groups": refusal_groups[:8],
        "warned": dashboard.identity_warned_jobs(user),
        "kueue_waiting": dashboard.waiting_in_kueue(user),
        "verdict_changes": dashboard.verdict_changes(user),
        "supervisor": dashboard.supervisor_health(user),
        "cluster_poll": CLUSTER_POLL_SECONDS,
    }
    return render(request, "dashboard/home.html", context)


@page_login_required
def home_cluster(request: HttpRequest) -> HttpResponse:
    """The overview's cluster box: the API server answered now or not, the admission guard is complete or
    what is missing, and the supervisor's last cycle."""
    context = {
        "kubernetes": dashboard.kubernetes_health(request.user, cluster_health.check_kubernetes()),
        "guard": dashboard.guard_health(
            request.user, cluster_guard.check_guard(max_age=cluster_guard.CACHE_SECONDS)
        ),
        "supervisor": dashboard.supervisor_health(request.user),
        "workers": dashboard.worker_health(
            request.user, configured=(names := cluster_client.worker_names()), checks=_worker_checks(names)
        ),
        "cluster_poll": CLUSTER_POLL_SECONDS,
    }
    return render(request, "dashboard/_cluster.html", context)


WORKER_CHECK_SECONDS = 15  # a worker's live check is reused this long (the cluster box polls more often)


def _worker_checks(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each configured MultiKueue worker asked now (its answer kept WORKER_CHECK_SECONDS in this process)."""
    checks = {}
    for name in names:
        key = f"dispatch:worker-check:{name}"
        found = cache.get(key)
        if found is None:
            found = cluster_health.check_worker(name)
            cache.set(key, found, WORKER_CHECK_SECONDS)
        checks[name] = found
    return checks


# ---------------------------------------------------------------- refusals


class RefusalFilterForm(forms.Form):
    code = forms.ChoiceField(required=False)
    runtime = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Runtime"}))
    namespace = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Namespace"}))
    owner = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Owner"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        code_field = self.fields["code"]
        assert isinstance(code_field, forms.ChoiceField)
        code_field.choices = [("", "Any code"), *((code, code) for code in FIXES)]


@page_login_required
def refusals_page(request: HttpRequest) -> HttpResponse:
    form = RefusalFilterForm(request.GET)
    form.is_valid()
    filters = {name: value for name, value in form.cleaned_data.items() if value}
    if not roles.can_read_all_jobs(request.user):
        filters.pop("owner", None)
    groups = dashboard.refusals(request.user, **filters)
    context = {"nav": "refusals", "form": form, "filtered": bool(filters), "groups": groups}
    return render(request, "dashboard/refusals.html", context)


# ---------------------------------------------------------------- the job list


class JobFilterForm(forms.Form):
    q = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Id or name"}))
    state = forms.ChoiceField(choices=[("", "Any state"), *JobState.choices], required=False)
    cause = forms.ChoiceField(choices=[("", "Any cause"), *Cause.choices], required=False)
    namespace = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Namespace"}))
    runtime = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Runtime"}))
    owner = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Owner"}))
    identity_warning = forms.BooleanField(required=False, label="Identity warning")
    window = forms.ChoiceField(choices=[("", "Any time"), *WINDOW_CHOICES], required=False)


def list_context(request: HttpRequest) -> dict[str, Any]:
    form = JobFilterForm(request.GET)
    form.is_valid()  # an invalid field (an unknown state) is dropped from cleaned_data: it filters nothing
    filters = {name: value for name, value in form.cleaned_data.items() if value}
    if not roles.can_read_all_jobs(request.user):
        filters.pop("owner", None)
    jobs = selectors.jobs_filtered(request.user, **filters)
    page = selectors.keyset_page(
        jobs, after=request.GET.get("after", ""), before=request.GET.get("before", "")
    )
    base = {k: v for k, v in request.GET.items() if k not in ("after", "before") and v}
    return {
        "nav": "jobs",
        "form": form,
        "filtered": bool(filters),
        "page": page,
        "older_url": "?" + urlencode({**base, "after": page.older}) if page.older else "",
        "newer_url": "?" + urlencode({**base, "before": page.newer}) if page.newer else "",
        "newest_url": "?" + urlencode(base) if not page.first else "",
        "poll": POLL_SECONDS,
    }


@page_login_required
def jobs_page(request: HttpRequest) -> HttpResponse:
    # The rows change when the change feed moves (a submission, a state change: jobs.observability.feed).
    fingerprint = "|".join(str(p) for p in (request.user.pk, request.get_full_path(), *feed.version()))
    tag = versions.etag(hashlib.sha256(fingerprint.encode()).hexdigest()[:32])
    unchanged = _unchanged(request, tag)
    if unchanged is not None:
        return unchanged
    context = list_context(request)
    context["etag"] = tag
    if not getattr(request, "htmx", False):
        jobs = selectors.jobs_filtered(
            request.user,
            **{k: v for k, v in context["form"].cleaned_data.items() if v and k in _COUNTED},
        )
        context["count"], context["more"] = selectors.capped_count(jobs)
    response = render_live(request, "jobs/list.html", "jobs/_rows.html", context)
    return _live_headers(response, tag) if getattr(request, "htmx", False) else response


_COUNTED = {"q", "state", "cause", "namespace", "runtime", "owner", "identity_warning", "window"}


# ---------------------------------------------------------------- the job page


def _visible_job(request: HttpRequest, job_id: str) -> Job:
    job = selectors.job_for(request.user, job_id)
    if job is None:
        # Someone else's job answers exactly like a job that does not exist: ids are not disclosed.
        raise Http404("No such job.")
    return job


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def evidence_rows(evidence: Any) -> list[dict[str, str]]:
    """Evidence as rows of {object, field, value, at}."""
    if not isinstance(evidence, list):
        return []
    return [
        {
            "object": str(item.get("object", "")),
            "field": str(item.get("field", "")),
            "value": _show(item.get("value")),
            "at": str(item.get("at") or ""),
        }
        for item in evidence
        if isinstance(item, dict)
    ]


def _yaml(data: Any) -> str:
    if not data:
        return ""
    if isinstance(data, dict):
        # Read like kubectl prints an object: apiVersion, kind, metadata, spec, then the rest.
        head = [k for k in ("apiVersion", "kind", "metadata", "spec") if k in data]
        data = {k: data[k] for k in [*head, *(k for k in data if k not in head)]}
    return yaml.safe_dump(data, sort_keys=False)


_PHASE_TEXT = {
    "Succeeded": ("ok", "done"),
    "Failed": ("failed", "fail"),
    "Running": ("running", "run"),
    "Pending": ("pending", "wait"),
    "Gone": ("gone", "gone"),
}


def _cell(row: dict[str, Any], job_id: str, attempt: int, count: int) -> dict[str, Any]:
    """One grid cell: short text (never colour alone), a class, the whole story in the title."""
    phase = str(row.get("phase") or "Pending")
    css, text = _PHASE_TEXT.get(phase, ("pending", phase.lower()[:5]))
    exit_code = row.get("exit_code")
    if exit_code is not None and phase != "Succeeded":
        text = f"{text} {exit_code}"
    first = bool(row.get("first_failure"))
    if first:
        text = f"★ {text}"
        css += " first"
    restarts = int(row.get("restarts") or 0)
    if restarts:
        text += f" ↻{restarts}"
    title = (
        f"rank {row.get('rank')} attempt {attempt}: {phase}"
        + (f", exit code {exit_code}" if exit_code is not None else "")
        + (f", {restarts} container restarts" if restarts else "")
        + (f", JobSet restart {row.get('restart_attempt')}" if row.get("restart_attempt") else "")
        + (f", {count} pods" if count > 1 else "")
        + (f", node {row.get('node')}" if row.get("node") else "")
        + (f", {row.get('reason')}" if row.get("reason") else "")
        + (f", pod {row.get('pod')}" if row.get("pod") else "")
        + (" (the first rank to fail)" if first else "")
    )
    return {
        "css": css,
        "text": text,
        "title": title,
        "url": f"/api/v1/jobs/{job_id}/logs?attempt={attempt}&rank={row.get('rank')}",
        "first": first,
    }


def rank_grid(job_id: str, executions: list[Execution]) -> dict[str, Any]:
    """Rank x attempt: per cell the rank's newest pod in that attempt (the JobSet restart with the highest
    number), marked when it is the first rank to fail. Built once per render, in Python."""
    attempts = [e.attempt for e in executions]
    by_cell: dict[tuple[int, int], dict[str, Any]] = {}
    pods: dict[tuple[int, int], int] = {}
    ranks: set[int] = set()
    for execution in executions:
        for row in execution.ranks or []:
            rank = row.get("rank")
            if not isinstance(rank, int):
                continue
            ranks.add(rank)
            key = (rank, execution.attempt)
            pods[key] = pods.get(key, 0) + 1
            held = by_cell.get(key)
            newer = held is None or int(row.get("restart_attempt") or 0) >= int(
                held.get("restart_attempt") or 0
            )
            if newer or row.get("first_failure"):
                by_cell[key] = row
    rows = [
        {
            "rank": rank,
            "cells": _cells_html(
                [
                    _cell(by_cell[(rank, attempt)], job_id, attempt, pods[(rank, attempt)])
                    if (rank, attempt) in by_cell
                    else None
                    for attempt in attempts
                ]
            ),
        }
        for rank in sorted(ranks)
    ]
    return {"attempts": attempts, "rows": rows}


def _cells_html(cells: list[dict[str, Any] | None]) -> SafeString:
    """One grid row's cells as HTML, every value escaped (html.escape): 1,280 cells through the template
    language, or format_html, cost more than the rest of the page (make bench: job page 20 x 64 / 1 x 2)."""
    out = []
    for cell in cells:
        if cell is None:
            out.append('<td class="none">·</td>')
            continue
        first = ' data-first-failure="true"' if cell["first"] else ""
        out.append(
            f'<td class="{_esc(cell["css"])}"{first}><a href="{_esc(cell["url"])}" '
            f'title="{_esc(cell["title"])}">{_esc(cell["text"])}</a></td>'
        )
    return mark_safe("".join(out))  # every interpolated value above is escaped


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def kubectl_commands(job: Job, executions: list[Execution], label_domain: str) -> list[dict[str, Any]]:
    """Per attempt: the objects dispatch created, by name, and the kubectl lines that show them."""
    ns = job.namespace
    out = []
    for execution in executions:
        name = execution.trainjob_name
        selector = f"{label_domain}/job={job.id},{label_domain}/attempt={execution.attempt}"
        out.append(
            {
                "attempt": execution.attempt,
                "objects": [
                    ("TrainJob", name),
                    ("TrainingRuntime", runtime_copy_name(name)),
                    ("JobSet", name),
                ],
                "commands": [
                    f"kubectl -n {ns} get trainjob {name} -o yaml",
                    f"kubectl -n {ns} get trainingruntime {runtime_copy_name(name)} -o yaml",
                    f"kubectl -n {ns} get jobset {name} -o yaml",
                    f"kubectl -n {ns} get jobs,pods -l {selector} -o wide",
                    f"kubectl -n {ns} get events --sort-by=.lastTimestamp | grep {name}",
                    f"kubectl -n {ns} logs -l {selector} -c node --prefix --tail=100",
                ],
            }
        )
    return out


def _status_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """What the live partial needs: also what each poll re-reads."""
    active = job.state in ACTIVE_STATES
    executions = list(job.executions.all())
    current = next((e for e in executions if e.attempt == job.current_attempt), None)
    failing_rank = job.failing_rank if job.failing_rank is not None else (current.rank if current else None)
    return {
        "job": job,
        "evidence": evidence_rows(job.evidence),
        "executions": executions,
        "current": current,
        "ranks": (current.ranks if current else []) or [],
        "grid": rank_grid(job.id, executions),
        "timeline": list(job.events.all()),
        "failing_rank": failing_rank,
        "log_attempt": current.attempt if current else None,
        "can_cancel": active and selectors.may_cancel(request.user, job),
        "poll": POLL_SECONDS if not job.is_terminal else None,
    }


def _unchanged(request: HttpRequest, tag: str) -> HttpResponse | None:
    """A live part's poll that names the ETag it was rendered with gets 304 while nothing changed: no
    rendering, and htmx keeps the part as it is (static/js/dispatch.js, base.html)."""
    if getattr(request, "htmx", False) and versions.matches(request.headers.get("If-None-Match", ""), tag):
        return _live_headers(HttpResponse(status=304), tag)
    return None


def _live_headers(response: HttpResponse, tag: str) -> HttpResponse:
    response["ETag"] = tag
    response["Cache-Control"] = "private, no-cache"
    patch_vary_headers(response, ("HX-Request",))
    return response


@page_login_required
def job_page(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _visible_job(request, job_id)
    # What the live part shows: the job's row and timeline (jobs.versions), and whether this user may cancel.
    tag = versions.etag(versions.job_fingerprint(job, selectors.may_cancel(request.user, job), "status"))
    unchanged = _unchanged(request, tag)
    if unchanged is not None:
        return unchanged
    context = _status_context(request, job)
    context["etag"] = tag
    if not getattr(request, "htmx", False):
        plan = job.plan or {}
        objects = plan.get("objects") or {}
        label_domain = site_settings(max_age=30).label_domain
        context |= {
            "nav": "jobs",
            "plan": plan,
            # The job keeps the reasons that refused it; the plan also holds the waived ones, which explain
            # an identity warning.
            "reasons": [
                {**reason, "fix": fix_for(str(reason.get("code", "")))}
                for reason in [*job.reasons, *(r for r in plan.get("reasons") or [] if r.get("waived"))]
            ],
            "recovery_yaml": _yaml(job.recovery_policy),
            "training_runtime_yaml": _yaml(objects.get("training_runtime")),
            "train_job_yaml": _yaml(objects.get("train_job")),
            "spec_yaml": _yaml(job.spec),
            "kubectl": kubectl_commands(job, context["executions"], label_domain),
        }
    response = render_live(request, "jobs/detail.html", "jobs/_status.html", context)
    return _live_headers(response, tag) if getattr(request, "htmx", False) else response


@page_login_required
def job_events(request: HttpRequest, job_id: str) -> HttpResponse:
    """The cluster's Events about the job's objects (one list call in its namespace)."""
    job = _visible_job(request, job_id)
    context: dict[str, Any] = {"job": job, "events": [], "error": ""}
    if job.current_attempt:
        try:
            context["events"] = cluster_logs.events_for(job.namespace, f"{job.id}-")
        except ClusterError as exc:
            context["error"] = str(exc)
    return render(request, "jobs/_events.html", context)


@page_login_required
def job_log_tail(request: HttpRequest, job_id: str) -> HttpResponse:
    """The failing rank's last log lines on the job page (capped), with the link to the whole log."""
    job = _visible_job(request, job_id)
    try:
        attempt = int(request.GET.get("attempt", job.current_attempt))
        rank = int(request.GET.get("rank", ""))
    except ValueError:
        raise Http404("attempt and rank are numbers") from None
    context: dict[str, Any] = {"job": job, "attempt": attempt, "rank": rank, "tail": LOG_PAGE_TAIL}
    try:
        result = read_rank_log(job, attempt=attempt, rank=rank, container="node", tail=LOG_PAGE_TAIL)
        context |= {
            "log": result.text,
            "truncated": result.truncated,
            "pod": result.pod,
            "kept_at": result.kept_at,
        }
        log_read_record(user=request.user, job=job, attempt=attempt, rank=rank, container="node", via="page")
    except LogNotFound as exc:
        context["error"] = exc.detail
    except ClusterError as exc:
        context["error"] = f"the cluster could not be read: {exc}"
    return render(request, "jobs/_log_tail.html", context)


@page_login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _visible_job(request, job_id)
    if not selectors.may_cancel(request.user, job):
        raise PermissionDenied("You may not cancel this job.")
    try:
        cancel.job_cancel(actor=request.user, job=job)
    except errors.JobNotCancellable as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.id} is cancelled; its TrainJob is being deleted.")
    return redirect("dashboard:job", job_id=job.id)
