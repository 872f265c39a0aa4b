"""Dashboard pages: the runtimes list, one runtime, and the platform role's forms."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dispatch_site import roles
from runtimes import selectors, services
from runtimes.api import parse_runtime_key
from runtimes.forms import AllowListForm, SiteSettingsForm
from runtimes.models import SiteSettings


def _require_platform(request: HttpRequest) -> None:
    if not roles.is_platform(request.user):
        raise PermissionDenied("Only the platform role may change runtimes and site settings.")


@login_required
def runtimes_page(request: HttpRequest) -> HttpResponse:
    overview = selectors.runtimes_overview(request.user)
    context = {
        "nav": "runtimes",
        "overview": overview,
        "form": AllowListForm(),
        "site": SiteSettings.load(),
    }
    return render(request, "runtimes/list.html", context)


@login_required
def runtime_page(request: HttpRequest, kind: str, namespace: str, name: str) -> HttpResponse:
    kind, namespace, name = parse_runtime_key(kind, namespace, name)
    row, cluster_error = selectors.runtime_detail(request.user, kind, namespace, name)
    if row is None:
        raise Http404("no such runtime in the cluster or on the allow-list")
    context = {
        "nav": "runtimes",
        "row": row,
        "cluster_error": cluster_error,
        "yaml": yaml.safe_dump(row.body, sort_keys=False) if row.body else "",
        "history": selectors.verdict_history(kind, namespace, name),
    }
    return render(request, "runtimes/detail.html", context)


@login_required
@require_POST
def allow_list_add_view(request: HttpRequest) -> HttpResponse:
    _require_platform(request)
    form = AllowListForm(request.POST)
    if not form.is_valid():
        overview = selectors.runtimes_overview(request.user)
        context = {"nav": "runtimes", "overview": overview, "form": form, "site": SiteSettings.load()}
        return render(request, "runtimes/list.html", context, status=400)
    data = form.cleaned_data
    approval = services.allow_list_approve(
        actor=request.user,
        kind=data["kind"],
        namespace=data["namespace"],
        name=data["name"],
        for_jobs=data["for_jobs"],
        for_sessions=data["for_sessions"],
        note=data["note"],
    )
    entry = approval.entry
    what = "is on the allow-list." if approval.created else "was re-approved."
    messages.success(request, f"{entry.ref} {what}")
    if entry.review == "content":
        messages.info(
            request,
            f"The spec, labels and annotations as they are now are recorded as reviewed "
            f"(sha256 {entry.reviewed_hash[:12]}).",
        )
    else:
        messages.warning(
            request,
            f"{entry.ref} could not be read, so its content is not reviewed: it is refused until it is "
            "re-approved once it can be read.",
        )
    return redirect("dashboard:runtimes")


@login_required
@require_POST
def allow_list_remove_view(request: HttpRequest, kind: str, namespace: str, name: str) -> HttpResponse:
    _require_platform(request)
    entry = selectors.allow_list_entry(*parse_runtime_key(kind, namespace, name))
    if entry is None:
        raise Http404("not on the allow-list")
    ref = entry.ref
    services.allow_list_remove(actor=request.user, entry=entry)
    messages.success(request, f"{ref} was removed from the allow-list.")
    return redirect("dashboard:runtimes")


@login_required
def settings_page(request: HttpRequest) -> HttpResponse:
    site = SiteSettings.load()
    if request.method == "POST":
        _require_platform(request)
        form = SiteSettingsForm(request.POST, instance=SiteSettings.load())
        context: dict[str, object] = {"nav": "runtimes", "form": form}
        if not form.is_valid():
            return render(request, "runtimes/settings.html", context, status=400)
        changes = {f: form.cleaned_data[f] for f in form.Meta.fields}
        check = services.site_settings_check(site=site, changes=changes)
        if check.errors:
            form.add_field_errors(check.errors)
            return render(request, "runtimes/settings.html", context, status=400)
        if "preview" in request.POST:  # the change's reach, before it is saved
            context["impact"] = selectors.settings_change_impact(site=site, changes=changes)
            context["warnings"] = check.warnings
            return render(request, "runtimes/settings.html", context)
        services.site_settings_update(actor=request.user, warnings=check.warnings, **changes)
        messages.success(request, "Site settings saved.")
        for warning in check.warnings:
            messages.warning(request, warning)
        return redirect("dashboard:settings")
    form = SiteSettingsForm(instance=selectors.site_settings_seen_by(request.user, site))
    if not roles.is_platform(request.user):
        for field in form.fields.values():
            field.disabled = True
    return render(request, "runtimes/settings.html", {"nav": "runtimes", "form": form, "site": site})
