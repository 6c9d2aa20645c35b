# Reserved for this session's work (empty until an operation is needed here).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("delivery", "0010_accept_path")]

    operations: list = []
