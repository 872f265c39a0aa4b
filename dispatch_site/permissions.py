"""DRF permission classes for the roles in dispatch_site.roles."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from dispatch_site import roles


class IsPlatform(BasePermission):
    message = "Only the platform role may do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        return roles.is_platform(request.user)


class IsPlatformOrReadOnly(BasePermission):
    message = "Only the platform role may change this."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return bool(request.user and request.user.is_authenticated)
        return roles.is_platform(request.user)
