from __future__ import annotations

from django.urls import path

from jobs.dashboard import logs_api
from jobs.sessions import api as sessions_api
from jobs.submission import api

urlpatterns = [
    path("plan", api.PlanApi.as_view(), name="plan"),
    path("jobs", api.JobListCreateApi.as_view(), name="job-list"),
    path("jobs/<str:job_id>", api.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/cancel", api.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<str:job_id>/logs", logs_api.JobLogsApi.as_view(), name="job-logs"),
    path("sessions", sessions_api.SessionListCreateApi.as_view(), name="session-list"),
    path("sessions/<str:session_id>", sessions_api.SessionDetailApi.as_view(), name="session-detail"),
    path("sessions/<str:session_id>/exec", sessions_api.SessionExecApi.as_view(), name="session-exec"),
]
