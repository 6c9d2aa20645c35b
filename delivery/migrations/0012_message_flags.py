"""Message flags as columns: what rode in `context` under reserved keys (0013 moves them).

0011 landed empty (reserved) and is applied where emailhub runs, so the columns come here."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery", "0011_send_path")]

    # A constant default is catalogue-only in PostgreSQL 11+: no table rewrite.
    operations = [
        *(
            migrations.AddField("message", name, models.BooleanField(db_default=False, default=False))
            for name in ("list_unsubscribe", "track_opens", "track_clicks")
        ),
        migrations.AddField(
            "message", "test_send_by", models.CharField(blank=True, max_length=150, null=True)
        ),
    ]
