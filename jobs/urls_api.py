from __future__ import annotations

from django.urls import path

from jobs import api

urlpatterns = [
    path("plan", api.PlanApi.as_view(), name="plan"),
    path("jobs", api.JobListCreateApi.as_view(), name="job-list"),
    path("jobs/<str:job_id>", api.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/cancel", api.JobCancelApi.as_view(), name="job-cancel"),
]
