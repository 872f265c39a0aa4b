"""Moves the API tokens of DRF's authtoken app (stored in clear) into ApiToken as SHA-512 digests, then drops
DRF's table. Each old token keeps working, as the same string, until it expires (API_TOKEN_TTL_DAYS from this
migration) or is revoked. A database that never had DRF's table (a new installation) has nothing to move."""

from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone

OLD_TABLE = "authtoken_token"


def hash_old_tokens(apps, schema_editor):
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("dispatch_site", "ApiToken")
    expiry = timezone.now() + timedelta(days=settings.API_TOKEN_TTL_DAYS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id FROM {OLD_TABLE}")
        rows = cursor.fetchall()
    ApiToken.objects.bulk_create(
        ApiToken(
            digest=hash_token(key),
            token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH],
            user_id=user_id,
            expiry=expiry,
            name="migrated",
        )
        for key, user_id in rows
    )
    schema_editor.execute(schema_editor.sql_delete_table % {"table": schema_editor.quote_name(OLD_TABLE)})


class Migration(migrations.Migration):
    dependencies = [("dispatch_site", "0002_api_token")]

    operations = [migrations.RunPython(hash_old_tokens, migrations.RunPython.noop)]
