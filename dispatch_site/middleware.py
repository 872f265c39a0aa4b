"""Request checks shared by every API operation, before any view runs."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"


def single_valued_query(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    """No API operation takes a query parameter more than once (`?limit=5&limit=500`); Django would use the
    last one silently, so the request is a 400 naming each repeated parameter instead (the schema's shape
    for field errors)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            repeated = {
                name: [f"given {len(values)} times; give it once"]
                for name, values in request.GET.lists()
                if len(values) > 1
            }
            if repeated:
                return JsonResponse(repeated, status=400)
        return get_response(request)

    return middleware
