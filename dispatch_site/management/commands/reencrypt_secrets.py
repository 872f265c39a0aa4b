"""python manage.py reencrypt_secrets : rewrite every secret stored encrypted under the current SECRET_KEY.

After rotating SECRET_KEY (the new key in SECRET_KEY, the old one in SECRET_KEY_FALLBACKS), run this once;
then the old key can leave SECRET_KEY_FALLBACKS without any stored secret becoming unreadable."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from dispatch_site.encrypted import EncryptedTextField


class Command(BaseCommand):
    help = "Re-encrypt every encrypted field under the current SECRET_KEY (after a key rotation)."

    def handle(self, *args: Any, **options: Any) -> None:
        for model in apps.get_models():
            names = [f.name for f in model._meta.concrete_fields if isinstance(f, EncryptedTextField)]
            if not names:
                continue
            count = 0
            for pk in model._default_manager.values_list("pk", flat=True).iterator():
                with transaction.atomic():
                    row = model._default_manager.select_for_update().filter(pk=pk).values(*names).first()
                    if row is None:
                        continue  # deleted meanwhile
                    model._default_manager.filter(pk=pk).update(**row)  # read in the clear, written anew
                    count += 1
            self.stdout.write(f"{model._meta.label}: {count} row(s) re-encrypted ({', '.join(names)})")
