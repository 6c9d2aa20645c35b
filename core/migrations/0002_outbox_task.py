"""The outbox's rows are tasks (issue 19: "events" are only provider and recipient events):
OutboxEvent becomes OutboxTask, and its table, which kept delivery's name when the model moved
to core, becomes core_outboxtask. A rename in the catalogue: no row is rewritten or lost, and
rows not yet published are published by the relay from the renamed table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial"), ("delivery", "0005_move_outbox_to_core")]

    operations = [
        migrations.RenameModel("OutboxEvent", "OutboxTask"),
        migrations.AlterModelTable("outboxtask", None),
    ]
