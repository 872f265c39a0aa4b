"""Submission (issue 18): the claim's fencing token, and every job's own label domain.

Jobs submitted before the label domain was stored with them (label_domain "") get the site's domain of today,
which is the one their objects carry unless the platform changed it since; from now on nothing falls back to
the site's current domain."""

from typing import Any

from django.db import migrations, models

DEFAULT_LABEL_DOMAIN = "dispatch.dev"


def backfill_label_domain(apps: Any, schema_editor: Any) -> None:
    job_model = apps.get_model("jobs", "Job")
    site_model = apps.get_model("runtimes", "SiteSettings")
    site = site_model.objects.filter(pk=1).first()
    domain = (site.label_domain if site else "") or DEFAULT_LABEL_DOMAIN
    job_model.objects.filter(label_domain="").update(label_domain=domain)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0007_session_security"),
        ("runtimes", "0004_allow_list_review"),
    ]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="claim_generation",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.RunPython(backfill_label_domain, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="job",
            name="label_domain",
            field=models.CharField(default="dispatch.dev", max_length=253),
        ),
    ]
