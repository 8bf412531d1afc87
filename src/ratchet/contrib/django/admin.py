"""The admin page: ``<admin>/ratchet/tasks/`` on the default admin site, staff only.

Django's admin imports this module when it starts (``admin.autodiscover``); it adds the
page's URL in front of the site's own (:func:`install`). The page has no model behind it:
it reads the ledger through :class:`ratchet.control.Control`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.urls import URLPattern, URLResolver, path

from .views import tasks_page

__all__ = ["install"]


def install(site: AdminSite) -> None:
    """Add the tasks page to ``site`` as ``<site>/ratchet/tasks/`` (URL name
    ``<site name>:ratchet_tasks``), behind ``site.admin_view`` (staff only: others are sent
    to the login page). Idempotent."""
    if getattr(site, "_ratchet_installed", False):
        return
    own: Callable[[], list[URLResolver | URLPattern]] = site.get_urls

    def get_urls() -> list[URLResolver | URLPattern]:
        page: Any = site.admin_view(lambda request: tasks_page(request, site))
        return [path("ratchet/tasks/", page, name="ratchet_tasks"), *own()]

    site.get_urls = get_urls  # type: ignore[method-assign]
    site._ratchet_installed = True  # type: ignore[attr-defined]


install(admin.site)
