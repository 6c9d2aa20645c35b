import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    """OutboxEvent moves from delivery to core: state only, the table `delivery_outboxevent`
    stays as it is (delivery 0005 drops it from delivery's state)."""

    initial = True

    dependencies = [
        ("delivery", "0004_api_key_scopes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OutboxEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("kind", models.CharField(max_length=20)),
                        ("payload", models.JSONField()),
                        (
                            "created_at",
                            models.DateTimeField(
                                db_default=django.db.models.functions.datetime.Now(), editable=False
                            ),
                        ),
                    ],
                    options={
                        "db_table": "delivery_outboxevent",
                        "ordering": ["id"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
