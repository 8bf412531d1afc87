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
from django.http import HttpRequest
from django.urls import URLPattern, URLResolver, path, reverse

from .views import tasks_page

__all__ = ["install"]


def install(site: AdminSite) -> None:
    """Add the tasks page to ``site`` as ``<site>/ratchet/tasks/`` (URL name
    ``<site name>:ratchet_tasks``), behind ``site.admin_view`` (staff only: others are sent
    to the login page), and a "Ratchet: Tasks" entry to the site's app list (the admin
    index and its sidebar). Idempotent."""
    if getattr(site, "_ratchet_installed", False):
        return
    own_urls: Callable[[], list[URLResolver | URLPattern]] = site.get_urls
    own_app_list: Callable[..., list[Any]] = site.get_app_list

    def get_urls() -> list[URLResolver | URLPattern]:
        page: Any = site.admin_view(lambda request: tasks_page(request, site))
        return [path("ratchet/tasks/", page, name="ratchet_tasks"), *own_urls()]

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[Any]:
        apps = own_app_list(request, app_label)
        if app_label is not None:
            return apps
        url = reverse(f"{site.name}:ratchet_tasks", current_app=site.name)
        entry = {"name": "Ratchet", "app_label": "ratchet", "app_url": url,
                 "has_module_perms": True,
                 "models": [{"model": None, "name": "Tasks", "object_name": "Task",
                             "perms": {"view": True}, "admin_url": url, "add_url": None,
                             "view_only": True}]}
        return sorted([*apps, entry], key=lambda app: str(app["name"]).lower())

    site.get_urls = get_urls  # type: ignore[method-assign]
    site.get_app_list = get_app_list  # type: ignore[method-assign]
    site._ratchet_installed = True  # type: ignore[attr-defined]


install(admin.site)
