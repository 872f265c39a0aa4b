from __future__ import annotations

from django.urls import path

from runtimes import views

urlpatterns = [
    path("runtimes/", views.runtimes_page, name="runtimes"),
    path("runtimes/allow/", views.allow_list_add_view, name="allow-list-add"),
    path("runtimes/<str:kind>/<str:namespace>/<str:name>/", views.runtime_page, name="runtime"),
    path(
        "runtimes/<str:kind>/<str:namespace>/<str:name>/remove/",
        views.allow_list_remove_view,
        name="allow-list-remove",
    ),
    path("settings/", views.settings_page, name="settings"),
]
