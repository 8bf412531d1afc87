"""The permission ``ratchet.view_tasks`` of the admin page (an unmanaged model: no table)."""

from collections.abc import Sequence
from typing import ClassVar

from django.db import migrations, models
from django.db.migrations.operations.base import Operation


class Migration(migrations.Migration):
    """Create :class:`ratchet.contrib.django.models.TaskPermissions` (no table)."""

    initial = True

    dependencies: ClassVar[Sequence[tuple[str, str]]] = ()

    operations: ClassVar[Sequence[Operation]] = (
        migrations.CreateModel(
            name="TaskPermissions",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
            ],
            options={
                "verbose_name": "Ratchet task permissions",
                "permissions": (("view_tasks", "Can view Ratchet tasks"),),
                "managed": False,
                "default_permissions": (),
            },
        ),
    )
