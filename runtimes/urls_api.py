from __future__ import annotations

from django.urls import path

from runtimes import api

urlpatterns = [
    path("runtimes", api.RuntimeListApi.as_view(), name="runtime-list"),
    path("runtimes/allow-list", api.AllowListAddApi.as_view(), name="allow-list-add"),
    path(
        "runtimes/allow-list/<str:kind>/<str:namespace>/<str:name>",
        api.AllowListRemoveApi.as_view(),
        name="allow-list-remove",
    ),
    path(
        "runtimes/<str:kind>/<str:namespace>/<str:name>",
        api.RuntimeDetailApi.as_view(),
        name="runtime-detail",
    ),
    path("settings", api.SiteSettingsApi.as_view(), name="site-settings"),
]
