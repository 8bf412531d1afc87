"""No tables: Ratchet's tables are the ledger's (made by ``manage.py migrate`` through the
``pre_migrate`` signal, which Django sends only to apps with a models module).

:class:`TaskPermissions` is an unmanaged model without a table, there only so that Django
creates the permission ``ratchet.view_tasks`` (a permission needs a content type, which
needs a model): the admin page asks for it.
"""

from __future__ import annotations

from django.db import models

__all__ = ["TaskPermissions"]


class TaskPermissions(models.Model):
    """The permissions of Ratchet's admin page: ``ratchet.view_tasks`` ("Can view Ratchet
    tasks"). No table (``managed = False``); never query it."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = (("view_tasks", "Can view Ratchet tasks"),)
        verbose_name = "Ratchet task permissions"
