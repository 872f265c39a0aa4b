from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from dispatch_site import health, scrape, views

api_v1: list[URLPattern | URLResolver] = [
    path("me", views.MeApi.as_view(), name="me"),
    path("audit", views.AuditListApi.as_view(), name="audit-list"),
    path("tokens", views.TokenListCreateApi.as_view(), name="token-list"),
    path("tokens/<str:token_id>", views.TokenRevokeApi.as_view(), name="token-revoke"),
    path("", include("runtimes.urls_api")),
    path("", include("jobs.urls_api")),
]

dashboard: list[URLPattern | URLResolver] = [
    path("audit/", views.audit_page, name="audit"),
    path("tokens/", views.tokens_page, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke_view, name="token-revoke"),
    path("", include("runtimes.urls")),
    path("", include("jobs.urls")),
]

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", scrape.metrics_view, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("", include((dashboard, "dashboard"), namespace="dashboard")),
]
