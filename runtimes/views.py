"""Dashboard pages for runtimes."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def runtimes_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/runtimes.html", {"nav": "runtimes"})
