"""GET /metrics: the Prometheus exposition (dispatch_site.metrics), for a scraper holding METRICS_TOKEN (as
`Authorization: Bearer <token>`), or for this host alone when no token is configured."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dispatch_site import metrics


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = str(settings.METRICS_TOKEN)
    allowed = metrics.scrape_allowed(
        token, request.headers.get("Authorization", ""), str(request.META.get("REMOTE_ADDR", ""))
    )
    if not allowed:
        if token:
            response = HttpResponse("a scrape needs Authorization: Bearer <METRICS_TOKEN>\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return HttpResponse(
            "/metrics answers this host only; set METRICS_TOKEN to let a scraper elsewhere in\n", status=403
        )
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)
