"""Who may submit where, and what everybody did: namespace grants and the audit log."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q
from knox.models import AbstractAuthToken
from knox.settings import CONSTANTS


class NamespaceGrant(models.Model):
    """Lets a user, or every member of a group, submit jobs into a namespace ("*" grants every namespace)."""

    namespace = models.CharField(max_length=63)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="namespace_grants",
    )
    group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.CASCADE, related_name="namespace_grants"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False)
                ),
                name="namespace_grant_user_xor_group",
            ),
            models.UniqueConstraint(fields=["namespace", "user"], name="namespace_grant_unique_user"),
            models.UniqueConstraint(fields=["namespace", "group"], name="namespace_grant_unique_group"),
        ]

    def __str__(self) -> str:
        who = self.user or self.group
        return f"{who} -> {self.namespace}"


class AuditEvent(models.Model):
    """One action somebody took: append-only, read by the platform role."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)  # kept when the user is deleted
    action = models.CharField(max_length=64)  # indexed in Meta (no varchar_pattern_ops twin: never LIKE)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=400)  # a runtime ref: kind, namespace and a 253-char name
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["object_type", "object_id"]),
            models.Index(fields=["action"], name="audit_action"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.object_type}/{self.object_id}"
        )


class ApiToken(AbstractAuthToken):
    """An API token, stored as its SHA-512 digest (django-rest-knox): the database never holds the token.

    Several per user, each with a name and an expiry; revoking deletes it. `token_key` is the token's first
    15 characters, knox's lookup index (the rest, 196 random bits, is only ever hashed).
    """

    # knox makes the digest the primary key; a plain id keeps it out of URLs and pages.
    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    digest: models.CharField[str, str] = models.CharField(max_length=CONSTANTS.DIGEST_LENGTH, unique=True)
    name: models.CharField[str, str] = models.CharField(max_length=100)
    last_used_at: models.DateTimeField[Any, Any] = models.DateTimeField(null=True, blank=True)
    # The token that created this one (None: created from a password login, or by create_user). Revoking a
    # token revokes what it created (CASCADE, recursively), and a token never expires after its creator.
    created_by: models.ForeignKey[Any, Any] = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="created_tokens"
    )

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.user} / {self.name}"
