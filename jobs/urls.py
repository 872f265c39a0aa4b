from __future__ import annotations

from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/", views.jobs_page, name="jobs"),
]
