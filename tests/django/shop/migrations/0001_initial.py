"""The Order table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("total_cents", models.IntegerField()),
                ("status", models.CharField(default="new", max_length=20)),
            ],
        ),
    ]
