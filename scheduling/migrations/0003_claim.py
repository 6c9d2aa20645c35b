# Reserved for this session's work (empty until an operation is needed here).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0002_periodic_scheduling_tasks")]

    operations: list = []
