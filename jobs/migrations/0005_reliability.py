# Issue 10: start's claim (a lease per pending execution), a delete the sweep can finish, and the label
# domain a job's objects carry, stored with the job.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_dashboard_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="label_domain",
            field=models.CharField(blank=True, default="", max_length=253),
        ),
        migrations.AddField(
            model_name="execution",
            name="claim_holder",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AddField(
            model_name="execution",
            name="claim_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="execution",
            name="delete_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
