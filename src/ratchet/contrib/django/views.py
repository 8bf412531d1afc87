"""The admin page's view: task counts by state and the newest tasks of a state, with
links to the dashboard (``ratchet serve``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ratchet import RatchetError, State

from . import get_control
from .conf import ratchet_settings

__all__ = ["PAGE_SIZE", "TaskRow", "tasks_page"]

PAGE_SIZE = 50
"""Tasks listed per page."""



@dataclass(frozen=True, slots=True)
class TaskRow:
    """One line of the list: the task's fields and its dashboard link (None without
    ``DASHBOARD_URL``)."""

    task_id: str
    name: str
    state: str
    attempt: int
    max_attempts: int
    updated: str
    """The last change, ``YYYY-MM-DD HH:MM:SS UTC``."""
    link: str | None


def _when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def tasks_page(request: HttpRequest, site: AdminSite) -> HttpResponse:
    """``GET <admin>/ratchet/tasks/?state=S&cursor=C``: counts per state (all task types),
    per type and state, and a page of the newest tasks (of state ``S`` when given)."""
    dashboard = ratchet_settings().dashboard_url
    states = [s.value for s in State]
    chosen = request.GET.get("state") or None
    if chosen is not None and chosen.upper() not in states:
        chosen = None
    cursor = request.GET.get("cursor") or None
    context = {**site.each_context(request), "title": "Ratchet tasks", "states": states,
               "chosen": chosen.upper() if chosen else None, "dashboard_url": dashboard}
    try:
        control = get_control()
        counts = control.status().counts
        page = control.list_tasks(state=chosen, limit=PAGE_SIZE, cursor=cursor)
    except RatchetError as exc:
        context["error"] = str(exc)
        return TemplateResponse(request, "ratchet/admin_tasks.html", context, status=503)
    totals = {s: sum(per.get(s, 0) for per in counts.values()) for s in states}
    context.update(
        totals=[(s, totals[s]) for s in states],
        types=[(name, [per.get(s, 0) for s in states]) for name, per in sorted(counts.items())],
        tasks=[TaskRow(t.task_id, t.name, str(getattr(t.state, "value", t.state)), t.attempt,
                       t.max_attempts, _when(t.updated_at),
                       f"{dashboard}/tasks/{quote(t.task_id, safe='')}" if dashboard else None)
               for t in page.tasks],
        next_cursor=page.next_cursor,
    )
    return TemplateResponse(request, "ratchet/admin_tasks.html", context)
