"""The user's table that commits (or not) with the task."""

from django.db import models


class Order(models.Model):
    """An order; the ``fulfil`` task sets ``status``."""

    total_cents = models.IntegerField()
    status = models.CharField(max_length=20, default="new")
