"""Dashboard pages of the webhooks: your endpoints (why one is disabled), a new one (its secret shown once),
and one endpoint's deliveries with every attempt's status code and latency."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dispatch_site import roles
from dispatch_site.pages import page_login_required
from jobs.observability import payloads, webhooks
from jobs.observability.models import WebhookDelivery, WebhookEndpoint

DELIVERIES_SHOWN = 100


class EndpointForm(forms.Form):
    url = forms.URLField(
        max_length=2000, label="URL", widget=forms.URLInput(attrs={"placeholder": "https://"})
    )
    description = forms.CharField(max_length=200, required=False)
    namespace = forms.CharField(
        max_length=63, required=False, help_text="platform only: every job in this namespace ('*': all)"
    )
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in payloads.EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="none ticked: every type",
    )


def _endpoint(request: HttpRequest, endpoint_id: int) -> WebhookEndpoint:
    endpoint = webhooks.endpoints_of(request.user).filter(pk=endpoint_id).first()
    if endpoint is None:
        raise Http404("No such webhook.")
    return endpoint


@page_login_required
def webhooks_page(request: HttpRequest) -> HttpResponse:
    form = EndpointForm(request.POST or None)
    new_secret = ""
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            endpoint, new_secret = webhooks.endpoint_create(
                owner=request.user,
                url=data["url"],
                namespace=data["namespace"],
                description=data["description"],
                event_types=data["event_types"],
            )
        except webhooks.WebhookInputError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        except webhooks.NotAllowed as exc:
            form.add_error("namespace", str(exc))
        except webhooks.TooManyEndpoints as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Webhook {endpoint.pk} created: it receives changes from now on.")
            form = EndpointForm()
    context: dict[str, Any] = {
        "nav": "webhooks",
        "endpoints": list(webhooks.endpoints_of(request.user)[:200]),
        "form": form,
        "new_secret": new_secret,
        "may_namespace": roles.is_platform(request.user),
    }
    return render(request, "webhooks/list.html", context, status=400 if form.errors else 200)


@page_login_required
def webhook_page(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    deliveries = list(
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .prefetch_related("attempt_log")
        .order_by("-seq")[:DELIVERIES_SHOWN]
    )
    context = {
        "nav": "webhooks",
        "endpoint": endpoint,
        "deliveries": deliveries,
        "shown": DELIVERIES_SHOWN,
        "new_secret": request.session.pop("webhook_new_secret", ""),
    }
    return render(request, "webhooks/detail.html", context)


@page_login_required
@require_POST
def webhook_action_view(request: HttpRequest, endpoint_id: int, action: str) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    if action == "enable":
        webhooks.endpoint_update(actor=request.user, endpoint=endpoint, active=True)
        messages.success(request, "Enabled: what waited is sent, in order.")
    elif action == "pause":
        webhooks.endpoint_update(actor=request.user, endpoint=endpoint, active=False)
        messages.success(request, "Paused: deliveries wait until you enable it.")
    elif action in ("rotate", "rotate-revoke"):
        request.session["webhook_new_secret"] = webhooks.endpoint_rotate_secret(
            actor=request.user, endpoint=endpoint, revoke_previous=action == "rotate-revoke"
        )
    elif action == "delete":
        webhooks.endpoint_delete(actor=request.user, endpoint=endpoint)
        messages.success(request, f"Webhook {endpoint_id} deleted.")
        return redirect("dashboard:webhooks")
    else:
        raise Http404("No such action.")
    return redirect("dashboard:webhook", endpoint_id=endpoint_id)
