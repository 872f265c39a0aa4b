from __future__ import annotations

from django.urls import path

from runtimes import views

urlpatterns = [
    path("runtimes/", views.runtimes_page, name="runtimes"),
]
