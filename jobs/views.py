"""Dashboard pages for jobs."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def jobs_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/jobs.html", {"nav": "jobs", "jobs": []})
