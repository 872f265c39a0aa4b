from __future__ import annotations

from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/", views.jobs_page, name="jobs"),
    path("jobs/<str:job_id>/", views.job_page, name="job"),
    path("jobs/<str:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
]
