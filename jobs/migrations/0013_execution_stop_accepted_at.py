from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0012_execution_trainjob_uid'),
    ]

    operations = [
        migrations.AddField(
            model_name='execution',
            name='stop_accepted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
