from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleets", "0005_lease_previous_holder"),
    ]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="sightings",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
