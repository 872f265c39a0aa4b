"""Job.evidence is a list of rows ({object, field, value, at}); its first default was {}. Rows that still hold
{} (no evidence) become [] so every reader sees one shape."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def empty_evidence_is_a_list(apps: Any, schema_editor: Any) -> None:
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(evidence={}).update(evidence=[])


class Migration(migrations.Migration):
    dependencies = [("jobs", "0005_reliability")]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="evidence",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(empty_evidence_is_a_list, migrations.RunPython.noop),
    ]
