"""Dashboard pages for interactive sessions: the list, a session's page (state, trainer pod, the commands
run in it with their return codes) and close. The live parts are partials that htmx polls."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from dispatch_site.pages import PAGE_SIZE, POLL_SECONDS, page_login_required, render_live
from jobs.models import Session, SessionState
from jobs.sessions import selectors, services

SETTLED = frozenset({SessionState.CLOSED})


def _visible(request: HttpRequest, session_id: str) -> Session:
    session = selectors.session_for(request.user, session_id)
    if session is None:
        # Someone else's session answers like one that does not exist.
        raise Http404("No such session.")
    return session


@page_login_required
def sessions_page(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    queryset = selectors.sessions_visible_to(request.user)
    if state in SessionState.values:
        queryset = queryset.filter(state=state)
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "nav": "sessions",
        "page": page,
        "state": state,
        "states": SessionState.values,
        "poll": POLL_SECONDS,
    }
    return render_live(request, "sessions/list.html", "sessions/_rows.html", context)


@page_login_required
def session_page(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _visible(request, session_id)
    context = {
        "nav": "sessions",
        "session": session,
        "execs": selectors.session_history(session)[:200],
        "can_close": session.state not in (SessionState.CLOSING, SessionState.CLOSED)
        and selectors.may_close(request.user, session),
        "poll": None if session.state in SETTLED else POLL_SECONDS,
    }
    return render_live(request, "sessions/detail.html", "sessions/_status.html", context)


@page_login_required
@require_POST
def session_close_view(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _visible(request, session_id)
    if not selectors.may_close(request.user, session):
        raise PermissionDenied("You may not close this session.")
    assert isinstance(request.user, User)
    session = services.session_close(actor=request.user, session=session)
    messages.success(
        request, f"Session {session.id} is {session.state}: its TrainJob {session.name} is deleted."
    )
    return redirect("dashboard:session", session_id=session.id)
