# Reserved for this session's work: the engagement profile keeps its one-to-one key to the
# contact without a database foreign key (see EngagementProfile.contact).
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("campaigns", "0008_engagement_tick")]

    operations = [
        migrations.AlterField(
            model_name="engagementprofile",
            name="contact",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                serialize=False,
                to="campaigns.contact",
            ),
        ),
    ]
