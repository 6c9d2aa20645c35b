# Reserved for this session's work (empty until an operation is needed here).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("delivery", "0009_tracking_tick")]

    operations: list = []
