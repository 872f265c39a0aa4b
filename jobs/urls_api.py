from __future__ import annotations

from django.urls import path

from jobs.dashboard import logs_api
from jobs.observability import api as observability_api
from jobs.sessions import api as sessions_api
from jobs.submission import api
from jobs.usage import api as usage_api

urlpatterns = [
    path("plan", api.PlanApi.as_view(), name="plan"),
    path("jobs", api.JobListCreateApi.as_view(), name="job-list"),
    path("jobs/<str:job_id>", api.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/cancel", api.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<str:job_id>/logs", logs_api.JobLogsApi.as_view(), name="job-logs"),
    path("events", observability_api.EventsApi.as_view(), name="events"),
    path("webhooks", observability_api.WebhookListCreateApi.as_view(), name="webhook-list"),
    path("webhooks/<str:endpoint_id>", observability_api.WebhookDetailApi.as_view(), name="webhook-detail"),
    path(
        "webhooks/<str:endpoint_id>/rotate-secret",
        observability_api.WebhookRotateSecretApi.as_view(),
        name="webhook-rotate-secret",
    ),
    path(
        "webhooks/<str:endpoint_id>/deliveries",
        observability_api.WebhookDeliveriesApi.as_view(),
        name="webhook-deliveries",
    ),
    path("usage", usage_api.UsageApi.as_view(), name="usage"),
    path("sessions", sessions_api.SessionListCreateApi.as_view(), name="session-list"),
    path("sessions/<str:session_id>", sessions_api.SessionDetailApi.as_view(), name="session-detail"),
    path("sessions/<str:session_id>/exec", sessions_api.SessionExecApi.as_view(), name="session-exec"),
]
