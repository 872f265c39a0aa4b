"""Webhook signing secrets at rest (issue 33): the database holds them encrypted, dispatch signs with them in
the clear, a SECRET_KEY rotation done Django's way (the old key in SECRET_KEY_FALLBACKS) keeps them readable
and `manage.py reencrypt_secrets` moves them to the new key; a rotation asked to revoke the previous secret
leaves only the new one signing, at once."""

from __future__ import annotations

import importlib
import io
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.encrypted import UndecryptableSecret
from jobs.observability import signing, webhooks
from jobs.observability.models import WebhookEndpoint

pytestmark = pytest.mark.django_db

OLD_KEY, NEW_KEY = "old-" + "k" * 50, "new-" + "k" * 50


def _stored(endpoint_id: int) -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT secret, previous_secret FROM {WebhookEndpoint._meta.db_table} WHERE id = %s",
            [endpoint_id],
        )
        secret, previous = cursor.fetchone()
    return secret, previous


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[])
def test_the_database_holds_only_ciphertext_and_a_key_rotation_keeps_it_readable(make_user: Any) -> None:
    _, token = make_user("whu", roles.USER, ("team-a",))
    answer = _client(token).post("/api/v1/webhooks", {"url": "https://hooks.example.com/in"}, format="json")
    assert answer.status_code == 201, answer.content
    secret, endpoint_id = answer.json()["secret"], answer.json()["id"]
    raw, _ = _stored(endpoint_id)
    assert raw.startswith("enc1:") and secret not in raw and signing.secret_key(secret).hex() not in raw
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert webhooks.signing_secrets(endpoint, timezone.now()) == [secret]  # dispatch signs in the clear

    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[OLD_KEY]):
        assert WebhookEndpoint.objects.get(pk=endpoint_id).secret == secret  # read with the fallback
        out = io.StringIO()
        call_command("reencrypt_secrets", stdout=out)
        assert "observability.WebhookEndpoint: 1 row(s) re-encrypted" in out.getvalue()
    moved, _ = _stored(endpoint_id)
    assert moved != raw and moved.startswith("enc1:")
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[]):
        assert WebhookEndpoint.objects.get(pk=endpoint_id).secret == secret  # the old key is not needed now
    with (
        override_settings(SECRET_KEY="another-" + "k" * 50, SECRET_KEY_FALLBACKS=[]),
        pytest.raises(UndecryptableSecret, match="SECRET_KEY_FALLBACKS"),
    ):
        WebhookEndpoint.objects.get(pk=endpoint_id)


def test_a_rotation_that_revokes_leaves_only_the_new_secret_signing(make_user: Any) -> None:
    _, token = make_user("whv", roles.USER, ("team-a",))
    api = _client(token)
    created = api.post("/api/v1/webhooks", {"url": "https://hooks.example.com/in"}, format="json").json()
    first = created["secret"]
    graced = api.post(f"/api/v1/webhooks/{created['id']}/rotate-secret", {}, format="json")
    assert graced.status_code == 200 and graced.json()["previous_secret_valid_until"] is not None
    second = graced.json()["secret"]
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    assert webhooks.signing_secrets(endpoint, timezone.now()) == [second, first]  # the grace period
    assert all(s.startswith("enc1:") for s in _stored(endpoint.pk))

    revoked = api.post(
        f"/api/v1/webhooks/{created['id']}/rotate-secret", {"revoke_previous": True}, format="json"
    )
    assert revoked.status_code == 200 and revoked.json()["previous_secret_valid_until"] is None
    third = revoked.json()["secret"]
    endpoint.refresh_from_db()
    assert webhooks.signing_secrets(endpoint, timezone.now()) == [third]  # neither older secret signs
    bad = api.post(
        f"/api/v1/webhooks/{created['id']}/rotate-secret", {"revoke_previous": "soon"}, format="json"
    )
    assert bad.status_code == 400 and "revoke_previous" in bad.json()


def test_the_migration_encrypts_secrets_stored_before_it(make_user: Any) -> None:
    owner, _ = make_user("whw", roles.USER)
    endpoint, secret = webhooks.endpoint_create(owner=owner, url="https://hooks.example.com/in")
    with connection.cursor() as cursor:  # as a row written before encryption
        cursor.execute(
            f"UPDATE {WebhookEndpoint._meta.db_table} SET secret = %s WHERE id = %s", [secret, endpoint.pk]
        )
    assert _stored(endpoint.pk)[0] == secret
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == secret  # read as it is
    migration = importlib.import_module("jobs.observability.migrations.0003_secrets_encrypted")
    migration.encrypt_stored(apps, None)
    raw, _ = _stored(endpoint.pk)
    assert raw.startswith("enc1:") and secret not in raw
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == secret
