"""GET /metrics: the Prometheus exposition (dispatch_site.metrics), for a scraper holding METRICS_TOKEN (as
`Authorization: Bearer <token>`), or for this host alone, directly (not through a proxy), when no token is
configured."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dispatch_site import metrics
from dispatch_site.client_address import proxied


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = str(settings.METRICS_TOKEN)
    allowed = metrics.scrape_allowed(
        token,
        request.headers.get("Authorization", ""),
        str(request.META.get("REMOTE_ADDR", "")),
        via_proxy=proxied(request.META),
    )
    if not allowed:
        if token:
            response = HttpResponse(metrics.REFUSED_WITH_TOKEN, status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return HttpResponse(metrics.REFUSED_WITHOUT_TOKEN, status=403)
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)
