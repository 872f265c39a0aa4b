"""Dashboard pages for jobs: the list, the status page on-call reads, and cancel.

The live parts (the list's rows, the status page's state and executions) are partials that htmx polls;
an htmx request gets only the partial.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

import yaml
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from jobs import selectors, services
from jobs.models import ACTIVE_STATES, Job, JobState

PAGE_SIZE = 50
POLL_SECONDS = 5
# Evidence keys in the order that proves a cause (DESIGN.md, Status); any others follow, sorted.
EVIDENCE_FIRST = ("object", "field", "value")

View = Callable[..., HttpResponse]


def page_login_required(view: View) -> View:
    """login_required, except that an htmx poll from a page whose session ended gets 401, not a redirect:
    htmx would follow a redirect and swap the login form into the table. HX-Refresh reloads the whole page,
    which then goes to the login form, so on-call never stares at a page that silently stopped updating."""
    protected = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if getattr(request, "htmx", False) and not request.user.is_authenticated:
            response = HttpResponse("Your session has ended: log in again.", status=401)
            response["HX-Refresh"] = "true"
            return response
        return protected(request, *args, **kwargs)

    return wrapper


def _render_live(request: HttpRequest, page: str, partial: str, context: dict[str, Any]) -> HttpResponse:
    """The whole page, or only the partial for an htmx poll of the same URL."""
    response = render(request, partial if getattr(request, "htmx", False) else page, context)
    # The same URL answers with a page or a fragment: caches must keep them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "Any state"), *JobState.choices], required=False)
    namespace = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Namespace"}))
    runtime = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Runtime"}))
    owner = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "Owner"}))


@page_login_required
def jobs_page(request: HttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET)
    form.is_valid()  # an invalid field (an unknown state) is dropped from cleaned_data: it filters nothing
    filters = {name: value for name, value in form.cleaned_data.items() if value}
    jobs = selectors.jobs_filtered(request.user, **filters)
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"nav": "jobs", "form": form, "filtered": bool(filters), "page": page, "poll": POLL_SECONDS}
    return _render_live(request, "jobs/list.html", "jobs/_rows.html", context)


def _visible_job(request: HttpRequest, job_id: str) -> Job:
    job = selectors.job_for(request.user, job_id)
    if job is None:
        # Someone else's job answers exactly like a job that does not exist: ids are not disclosed.
        raise Http404("No such job.")
    return job


def _evidence_rows(evidence: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, str]]:
    """Evidence as rows of {object, field, value, at} (an older record may hold one flat object)."""
    if isinstance(evidence, dict):
        keys = [k for k in EVIDENCE_FIRST if k in evidence] + sorted(set(evidence) - set(EVIDENCE_FIRST))
        return [{"object": "", "field": k, "value": _show(evidence[k]), "at": ""} for k in keys]
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


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _yaml(data: Any) -> str:
    if not data:
        return ""
    if isinstance(data, dict):
        # Read like kubectl prints an object: apiVersion, kind, metadata, spec, then the rest.
        head = [k for k in ("apiVersion", "kind", "metadata", "spec") if k in data]
        data = {k: data[k] for k in [*head, *(k for k in data if k not in head)]}
    return yaml.safe_dump(data, sort_keys=False)


def _status_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """What the live partial needs: also what each poll re-reads."""
    active = job.state in ACTIVE_STATES
    executions = list(job.executions.all())
    current = next((e for e in executions if e.attempt == job.current_attempt), None)
    return {
        "job": job,
        "evidence": _evidence_rows(job.evidence or []),
        "executions": executions,
        "current": current,
        "ranks": (current.ranks if current else []) or [],
        "can_cancel": active and selectors.may_cancel(request.user, job),
        "poll": POLL_SECONDS if not job.is_terminal else None,
    }


@page_login_required
def job_page(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _visible_job(request, job_id)
    context = _status_context(request, job)
    if not getattr(request, "htmx", False):
        plan = job.plan or {}
        objects = plan.get("objects") or {}
        context |= {
            "nav": "jobs",
            "plan": plan,
            # The job keeps the reasons that refused it; the plan also holds the waived ones, which explain
            # an identity warning.
            "reasons": [*job.reasons, *(r for r in plan.get("reasons") or [] if r.get("waived"))],
            "training_runtime_yaml": _yaml(objects.get("training_runtime")),
            "train_job_yaml": _yaml(objects.get("train_job")),
            "spec_yaml": _yaml(job.spec),
            "events": job.events.all(),
        }
    return _render_live(request, "jobs/detail.html", "jobs/_status.html", context)


@page_login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _visible_job(request, job_id)
    if not selectors.may_cancel(request.user, job):
        raise PermissionDenied("You may not cancel this job.")
    try:
        services.job_cancel(actor=request.user, job=job)
    except services.JobNotCancellable as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.id} is cancelled; its TrainJob is being deleted.")
    return redirect("dashboard:job", job_id=job.id)
