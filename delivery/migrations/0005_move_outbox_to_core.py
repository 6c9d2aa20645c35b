from django.db import migrations


class Migration(migrations.Migration):
    """OutboxEvent now belongs to core (core 0001): drop it from delivery's state only; the
    table `delivery_outboxevent` and its rows stay."""

    dependencies = [
        ("delivery", "0004_api_key_scopes"),
        ("core", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OutboxEvent")],
            database_operations=[],
        ),
    ]
