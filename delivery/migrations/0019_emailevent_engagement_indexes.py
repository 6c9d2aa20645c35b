# The segments' engagement indexes (issue 23), built CONCURRENTLY: on a year of events the table
# is large, and a plain CREATE INDEX would block event ingestion for the whole build.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("delivery", "0018_attachments"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="emailevent",
            index=models.Index(
                condition=models.Q(("classification", "human"), ("kind__in", ["opened", "clicked"])),
                fields=["recipient", "kind", "occurred_at"],
                name="emailevent_human_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="emailevent",
            index=models.Index(
                condition=models.Q(("kind__in", ["bounced", "complained", "unsubscribed"])),
                fields=["recipient", "kind", "occurred_at"],
                name="emailevent_feedback_idx",
            ),
        ),
    ]
