from __future__ import annotations

from django.urls import path

from jobs.dashboard import views
from jobs.observability import views as observability_views
from jobs.sessions import views as sessions_views
from jobs.usage import views as usage_views

urlpatterns = [
    path("", views.home_page, name="home"),
    path("overview/cluster/", views.home_cluster, name="home-cluster"),
    path("refusals/", views.refusals_page, name="refusals"),
    path("jobs/", views.jobs_page, name="jobs"),
    path("jobs/<str:job_id>/", views.job_page, name="job"),
    path("jobs/<str:job_id>/events/", views.job_events, name="job-events"),
    path("jobs/<str:job_id>/log/", views.job_log_tail, name="job-log"),
    path("jobs/<str:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("usage/", usage_views.usage_page, name="usage"),
    path("webhooks/", observability_views.webhooks_page, name="webhooks"),
    path("webhooks/<int:endpoint_id>/", observability_views.webhook_page, name="webhook"),
    path(
        "webhooks/<int:endpoint_id>/<str:action>/",
        observability_views.webhook_action_view,
        name="webhook-action",
    ),
    path("sessions/", sessions_views.sessions_page, name="sessions"),
    path("sessions/<str:session_id>/", sessions_views.session_page, name="session"),
    path("sessions/<str:session_id>/close/", sessions_views.session_close_view, name="session-close"),
]
