# Reserved for this session's work (empty until an operation is needed here).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("campaigns", "0008_engagement_tick")]

    operations: list = []
