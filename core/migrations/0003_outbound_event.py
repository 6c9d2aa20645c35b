"""Outbound events (issue 22): the table, and the database function that says which events anyone
wants (core.outbound_events). Here it answers nobody; the outbound app's migration defines it over
its endpoints, so that core's statements name no app's table."""

import django.db.models.functions.datetime
from django.db import migrations, models

INTEREST = """
CREATE OR REPLACE FUNCTION emailhub_event_interest() RETURNS text[] LANGUAGE sql STABLE
AS $$ SELECT '{}'::text[] $$
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0002_outbox_task")]

    operations = [
        migrations.CreateModel(
            name="OutboundEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("type", models.CharField(max_length=40)),
                ("owner_key_id", models.BigIntegerField(blank=True, null=True)),
                ("payload", models.JSONField()),
                ("dispatched", models.BooleanField(db_default=False, default=False)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("dispatched", False)), fields=["id"], name="outbound_event_waiting_idx"
                    )
                ],
            },
        ),
        migrations.RunSQL(INTEREST, "DROP FUNCTION IF EXISTS emailhub_event_interest()"),
    ]
