"""What every dashboard page shares: the login guard that an htmx poll understands, and rendering a page or
only its live partial."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

PAGE_SIZE = 50  # the sessions list pages with Django's Paginator by this size
POLL_SECONDS = 5

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


def render_live(request: HttpRequest, page: str, partial: str, context: dict[str, Any]) -> HttpResponse:
    """The whole page, or only the partial for an htmx poll of the same URL."""
    response = render(request, partial if getattr(request, "htmx", False) else page, context)
    # The same URL answers with a page or a fragment: caches must keep them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response
