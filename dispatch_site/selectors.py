"""Reads: the API tokens a user may see."""

from __future__ import annotations

from django.db.models import QuerySet

from dispatch_site import roles
from dispatch_site.models import ApiToken
from dispatch_site.roles import AnyUser


def tokens_visible_to(user: AnyUser, *, owner: str = "") -> QuerySet[ApiToken]:
    """A user's own tokens; the platform role may read (and revoke) everybody's, filtered by owner."""
    queryset = ApiToken.objects.select_related("user")
    if roles.is_platform(user):
        return queryset.filter(user__username=owner) if owner else queryset
    return queryset.filter(user_id=user.pk)


def token_for(user: AnyUser, token_id: int) -> ApiToken | None:
    """One token the user may revoke; None for a token of somebody else (answered like a missing one)."""
    return tokens_visible_to(user).filter(pk=token_id).first()
