"""The server-rendered dashboard (``/``): Jinja2 pages over :class:`~ratchet.control.Control`.

Pages (GET; with ``RATCHET_API_TOKEN`` set each needs a logged-in session and redirects
(303) to ``/login?next=<page>`` without one, :func:`ratchet.web.auth.read_ok`; without a
token they are open; ``/login`` and ``/static`` are always open):

* ``/`` overview per task type: counts by state (``WAITING``, parked tasks, apart from the
  backlog and the running), backlog, rates, drain ETA, oldest pending age, unknown and
  quarantined, a chart of arrivals vs completions;
* ``/tasks`` a filtered, paginated task list; ``/tasks/{id}`` one task's timeline, its
  parent, the task it was forked from and its forks, what it waits for, the tree of its
  children with their states, and a progress
  bar per batch run (a sharded job: per shard, :mod:`ratchet.web.batchview`);
* ``/unknown`` the ``UNKNOWN`` queue with resolve forms;
* ``/quarantine`` quarantined tasks by error fingerprint, a dry-run replay, a replay;
* ``/pauses`` the active pauses (who, why, since, what still runs), pause / resume a type;
* ``/limits`` the concurrency limits per type, tenant and total with their live use
  (running, ready, oldest ready; a full one marked), the use per type, the rate limits
  with the tasks they hold back, the latest changes;
* ``/outbox`` the outbox: backlog, oldest unsent age, relays and their partitions, the
  failing messages, the latest messages with their state (``?unsent=1``: the unsent ones
  the relays publish next).

Mutations (POST ``/actions/...``) need a session (``/login``: the operator's name, and the
token when ``RATCHET_API_TOKEN`` is set, checked by :func:`ratchet.web.auth.token_ok`), the
session's CSRF token in the form (:mod:`ratchet.web.sessions`), a same-origin ``Origin``
when the browser sends one, and a reason. Each goes through Control with
``by=<operator>`` and ``reason=`` (audited). Bad input is shown on the page, nothing
changed.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ..control import Control, ControlOutcome, PauseRecord, StatusReport
from ..errors import ErrorSpec, InvalidArguments, RatchetError, TaskNotFound, error_spec
from ..states import TERMINAL as TERMINAL_STATES
from ..states import State
from ..storedtext import stored_note
from ..validation import MAX_KEY_BYTES, check_identifier, parse_duration_s
from . import batchview, charts, present
from .auth import read_ok, token_ok
from .jsonbody import DuplicateKey, unique_keys
from .sessions import FLASH_COOKIE, SESSION_COOKIE, SESSION_TTL_S, Session, SessionKeeper
from .settings import WebSettings

HERE = Path(__file__).parent

UNKNOWN_PAGE = 50
"""``UNKNOWN`` tasks per page of the queue (each is read with its open effects)."""

TASKS_PAGE = 50
"""Tasks per page of the task list."""

MAX_FORM_FIELDS = 50
"""Form fields accepted in one POST (the dashboard's forms have fewer than ten)."""

TERMINAL = frozenset(TERMINAL_STATES)
"""The states whose task never moves again but by an operator's retry or compensate of a
``FAILED`` one (no cancel or pause form on its page)."""

STATE_COLUMNS = [s.value for s in State]
"""The overview's per-state columns, in the state machine's order."""

RARE_COLUMNS = frozenset({State.COMPENSATING.value, State.COMPENSATED.value})
"""State columns the overview shows only while some type has a task in them (the table
fits a 1,400 px window without them)."""


def state_columns(types: Any) -> list[str]:
    """The overview's state columns for ``types`` (rows with ``counts``): every state but
    the rare ones nobody is in."""
    return [s for s in STATE_COLUMNS
            if s not in RARE_COLUMNS or any(t.counts.get(s) for t in types)]

RATE_WINDOW_S = 60.0
"""The overview's rate window (arrivals, completions, net drain), seconds: the same as
``ratchet status``'s default."""

CHART_WINDOW_S = 600.0
"""The span of the overview's arrival vs completion charts, seconds."""

BUCKET_S = 30.0
"""The charts' bucket, seconds."""

MAX_TYPE_CHARTS = 12
"""Task types that get a chart of their own on the overview (one throughput read each)."""


class BadInput(InvalidArguments):
    """A form value the dashboard refuses before calling Control (shown on the page): an
    :class:`~ratchet.errors.InvalidArguments`, so it answers as the API's 422 ``invalid``."""


ERROR_HEADER = "X-Ratchet-Error"
"""The header naming the error code (:data:`ratchet.errors.ERROR_TABLE`) of a page that
answers an error: the code the API's ``ErrorBody.error`` gives for the same error."""

_TITLES = {
    "not_found": "No such task",
    "invalid": "Bad input",
    "wrong_state": "Wrong state",
    "ledger_unavailable": "Ledger unavailable",
    "ledger_corrupt": "Ledger corrupt",
    "schema_too_old": "Ledger schema too old",
    "schema_too_new": "Ledger schema too new",
    "write_rejected": "Write refused",
}
"""The heading of the problem page per error code (else the code, said in words)."""


def _title(spec: ErrorSpec) -> str:
    return _TITLES.get(spec.code, spec.code.replace("_", " ").capitalize())


def _server_side(spec: ErrorSpec) -> bool:
    """The error is the service's or the ledger's (5xx), not the request's: a page shows it
    on its own instead of beside the form that was sent."""
    return spec.http_status >= 500


@dataclass(frozen=True, slots=True)
class PauseView:
    """An active pause with who still has to observe it.

    Attributes:
        record: the pause (who, why, since, version, RUNNING tasks short of a boundary).
        holders: ``{holder: RUNNING tasks of the scope it holds}``: the workers that have
            yet to reach a boundary and stop (claims observe a pause at once).
        paused_tasks: tasks of the scope in ``PAUSED`` now (type scope; None otherwise).
    """

    record: PauseRecord
    holders: dict[str, int] = field(default_factory=dict)
    paused_tasks: int | None = None


def _noted(value: Any) -> Any:
    """Every ``{{ value }}`` of a page: stored text that is not valid UTF-8 (shown with
    ``\\x`` escapes) and a state that is not a known one (a
    :class:`~ratchet.storedtext.StoredState`) get a note saying so."""
    note = stored_note(value)
    return value if note is None else f"{value} ({note})"


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True, finalize=_noted)
    env.filters.update(when=present.when, duration=present.duration, rate=present.rate,
                       value=present.show_value, error_line=present.error_line,
                       q=lambda s: quote(str(s), safe=""))
    env.globals.update(ago=present.ago, drain=present.drain)
    return env


class Dashboard:
    """The dashboard's request handlers around one Control.

    Args:
        control: the Control every read and mutation goes through.
        settings: the service settings (``api_token`` decides the login rule).
    """

    def __init__(self, control: Control, settings: WebSettings) -> None:
        self.control = control
        self.settings = settings
        self.keeper = SessionKeeper(settings.api_token)
        self.env = _env()

    # ------------------------------------------------------------------ plumbing

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a (blocking) Control call on the thread pool."""
        return await run_in_threadpool(fn, *args, **kwargs)

    def session(self, request: Request) -> Session | None:
        """The request's valid session, if any."""
        return self.keeper.read(request.cookies.get(SESSION_COOKIE))

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        """Render ``template`` with the session, CSRF token and flash message."""
        session = self.session(request)
        flash = self.keeper.read_flash(request.cookies.get(FLASH_COOKIE))
        body = self.env.get_template(template).render(
            request=request, base=request.scope.get("root_path", ""), session=session,
            csrf=self.keeper.csrf_token(session) if session else "",
            flash=flash, token_mode=self.settings.api_token is not None,
            path=request.url.path, **context)
        response = HTMLResponse(body, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; "
            "script-src 'self'; form-action 'self'; frame-ancestors 'none'")
        if request.cookies.get(FLASH_COOKIE) is not None:
            response.delete_cookie(FLASH_COOKIE, path="/")
        return response

    def problem(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        """A page that says what went wrong (and that nothing changed, for a mutation)."""
        return self.render(request, "problem.html", status, title=title, message=message)

    def error_page(self, request: Request, exc: RatchetError, suffix: str = "") -> Response:
        """The problem page of a Ratchet error: the status and code of its row of
        :data:`ratchet.errors.ERROR_TABLE` (code in :data:`ERROR_HEADER`), as the API
        answers the same error."""
        spec = error_spec(exc)
        return _coded(self.problem(request, spec.http_status, _title(spec),
                                   f"{exc}{suffix}"), spec)

    def done(self, request: Request, location: str, message: str,
             outcome: str = "done") -> Response:
        """Redirect (303) to ``location`` with a one-shot message (``outcome``
        ``unchanged``: shown as a warning: nothing needed doing)."""
        response = RedirectResponse(request.scope.get("root_path", "") + location, 303)
        kind = "unchanged" if outcome == "unchanged" else "ok"
        response.set_cookie(FLASH_COOKIE, self.keeper.flash(message, kind), max_age=60,
                            path="/",
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def guarded(self, request: Request,
                      page: Callable[[], Awaitable[Response]]) -> Response:
        """Run a page; a Ratchet error it raises is a problem page (:meth:`error_page`:
        a ledger that cannot be reached or is corrupt is a 503, an unknown task a 404),
        not a traceback."""
        try:
            return await page()
        except RatchetError as exc:
            return self.error_page(request, exc)

    def gated(self, page: Callable[[Request], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """``page`` behind the read rule (:func:`ratchet.web.auth.read_ok`): with a token
        configured, a request without a valid session is redirected (303) to the login,
        which returns to this page (path and query) afterwards."""
        async def endpoint(request: Request) -> Response:
            if read_ok(self.settings, has_session=self.session(request) is not None):
                return await page(request)
            here = quote(request.url.path)
            if request.url.query:
                here += "?" + request.url.query
            response = RedirectResponse(
                request.scope.get("root_path", "") + "/login?" + urlencode(
                    {"next": _safe_next(here)}), 303)
            response.headers["Cache-Control"] = "no-store"
            return response

        endpoint.__name__ = getattr(page, "__name__", "page")
        return endpoint

    # ------------------------------------------------------------------ pages

    async def overview(self, request: Request) -> Response:
        """``GET /``: the capacity view per task type, the charts, the counters."""
        async def page() -> Response:
            within = request.query_params.get("drain_within_s")
            within_s = (None if not within else
                        parse_duration_s(within, "drain_within_s", above_zero=True))
            report: StatusReport = await self.call(self.control.status, RATE_WINDOW_S,
                                                   within_s)
            everything = any(p.scope == "all" for p in report.pauses)
            paused = {t.name for t in report.types
                      if everything or any(p.scope == "type" and p.target == t.name
                                           for p in report.pauses)}
            chart, per_type = await self.call(self._charts, report)
            workers = await self.call(self.control.workers)
            return self.render(request, "overview.html", report=report, types=report.types,
                               workers=[w for w in workers if w.state == "alive"],
                               ended=Counter(w.state for w in workers if w.state != "alive"),
                               totals=report.totals, paused=paused, now=report.ledger_now,
                               states=state_columns(report.types),
                               window_s=report.window_s,
                               chart_window_s=CHART_WINDOW_S, bucket_s=BUCKET_S,
                               chart=chart, type_charts=per_type)
        return await self.guarded(request, page)

    def _charts(self, report: StatusReport) -> tuple[Markup, dict[str, Markup]]:
        """The arrival vs completion chart of every type together, and of each of the
        first :data:`MAX_TYPE_CHARTS` types with tasks (blocking: runs on the thread
        pool). The SVG is built from numbers and escaped labels only."""
        every = self.control.throughput(CHART_WINDOW_S, BUCKET_S)
        chart = Markup(charts.arrival_completion_svg(
            every, BUCKET_S, title="arrivals vs completions, all types"))
        per_type: dict[str, Markup] = {}
        for t in report.types[:MAX_TYPE_CHARTS]:
            buckets = self.control.throughput(CHART_WINDOW_S, BUCKET_S, t.name)
            per_type[t.name] = Markup(charts.arrival_completion_svg(
                buckets, BUCKET_S, title=f"arrivals vs completions, {t.name}",
                width=420, height=140))
        return chart, per_type

    async def task_list(self, request: Request) -> Response:
        """``GET /tasks?state=&name=&key=&cursor=``: tasks, newest first, 50 a page."""
        q = request.query_params
        state, name, key, cursor = (q.get("state") or None, q.get("name") or None,
                                    q.get("key") or None, q.get("cursor") or None)

        async def page() -> Response:
            try:
                found = await self.call(self.control.list_tasks, state=state, name=name,
                                        key=key, limit=TASKS_PAGE, cursor=cursor)
            except RatchetError as exc:
                spec = error_spec(exc)
                if _server_side(spec):
                    raise
                return _coded(self.render(
                    request, "tasks.html", spec.http_status, error=str(exc), tasks=[],
                    next_url=None, filters=q, states=list(State), now=None), spec)
            now = await self.call(self.control.ledger_now)
            next_url = None
            if found.next_cursor:
                args = {k: v for k, v in (("state", state), ("name", name), ("key", key))
                        if v}
                next_url = "/tasks?" + urlencode({**args, "cursor": found.next_cursor})
            return self.render(request, "tasks.html", tasks=found.tasks, next_url=next_url,
                               filters=q, states=list(State), now=now)
        return await self.guarded(request, page)

    async def task_page(self, request: Request, *, task_id: str | None = None,
                        error: str | None = None, form: Mapping[str, str] | None = None,
                        status: int = 200) -> Response:
        """``GET /tasks/{id}``: one task, its timeline, steps, effects and actions
        (re-rendered with ``error`` and the submitted ``form`` when an action is refused)."""
        tid = task_id if task_id is not None else str(request.path_params["task_id"])

        async def page() -> Response:
            tl = await self.call(self.control.inspect, tid)
            now = await self.call(self.control.ledger_now)
            tree, hidden = await self.call(present.child_tree, tl.children,
                                           self.control.children)
            return self.render(request, "task.html", status, tl=tl, t=tl.task,
                               rows=present.timeline_rows(tl), now=now, error=error,
                               form=form or {}, terminal=tl.task.state in TERMINAL,
                               tree=tree, tree_hidden=hidden, bars=batchview.batch_bars(tl))
        return await self.guarded(request, page)

    async def unknown_page(self, request: Request, *, error: str | None = None,
                           form: Mapping[str, str] | None = None,
                           status: int = 200) -> Response:
        """``GET /unknown``: the UNKNOWN queue with each task's open effects and a resolve
        form (re-rendered with ``error`` when a resolution is refused)."""
        cursor = request.query_params.get("cursor") or None

        async def page() -> Response:
            found = await self.call(self.control.list_tasks, state="UNKNOWN",
                                    limit=UNKNOWN_PAGE, cursor=cursor)
            items = []
            for t in found.tasks:
                try:
                    tl = await self.call(self.control.inspect, t.task_id)
                except TaskNotFound:
                    continue  # pruned or resolved meanwhile
                items.append((tl.task, [e for e in tl.effects if e.state == "intent"]))
            now = await self.call(self.control.ledger_now)
            next_url = ("/unknown?" + urlencode({"cursor": found.next_cursor})
                        if found.next_cursor else None)
            return self.render(request, "unknown.html", status, items=items, now=now,
                               next_url=next_url, error=error, form=form or {})
        return await self.guarded(request, page)

    async def quarantine_page(self, request: Request, *, error: str | None = None,
                              form: Mapping[str, str] | None = None,
                              status: int = 200) -> Response:
        """``GET /quarantine[?dry_run=FINGERPRINT&rate=R]``: the groups, and a dry-run
        replay's list (changes nothing) with the form of the real replay."""
        q = request.query_params

        async def page() -> Response:
            groups = await self.call(self.control.quarantine_list)
            now = await self.call(self.control.ledger_now)
            dry = None
            dry_error: tuple[str, ErrorSpec] | None = None
            fingerprint = q.get("dry_run")
            if fingerprint:
                try:
                    rate = _rate(q.get("rate", ""), required=True)
                    session = self.session(request)
                    dry = await self.call(self.control.quarantine_replay, fingerprint,
                                          rate, dry_run=True,
                                          by=session.operator if session else "dashboard")
                except RatchetError as exc:
                    if _server_side(error_spec(exc)):
                        raise
                    dry_error = str(exc), error_spec(exc)
            response = self.render(
                request, "quarantine.html",
                dry_error[1].http_status if dry_error and status == 200 else status,
                groups=groups, now=now, dry=dry,
                error=error or (dry_error[0] if dry_error else None), form=form or dict(q))
            return _coded(response, dry_error[1]) if dry_error else response
        return await self.guarded(request, page)

    async def pauses_page(self, request: Request, *, error: str | None = None,
                          form: Mapping[str, str] | None = None,
                          status: int = 200) -> Response:
        """``GET /pauses[?type=T]``: the active pauses and the pause form."""
        async def page() -> Response:
            report: StatusReport = await self.call(self.control.status)
            views = await self.call(self._pause_views, report)
            return self.render(request, "pauses.html", status, pauses=views,
                               types=sorted(report.counts), now=report.ledger_now,
                               error=error,
                               form=form or {"type": request.query_params.get("type", "")})
        return await self.guarded(request, page)

    def _pause_views(self, report: StatusReport) -> list[PauseView]:
        """Each active pause with the holders of RUNNING tasks in its scope (blocking)."""
        views = []
        for p in report.pauses:
            holders: Counter[str] = Counter()
            if p.running:
                if p.scope == "task":
                    t = self.control.get(p.target)
                    if t.state is State.RUNNING and t.holder:
                        holders[t.holder] += 1
                else:
                    found = self.control.list_tasks(
                        state="RUNNING", name=p.target if p.scope == "type" else None,
                        limit=1000)
                    holders.update(t.holder or "-" for t in found.tasks)
            paused = (report.counts.get(p.target, {}).get("PAUSED", 0)
                      if p.scope == "type" else None)
            views.append(PauseView(p, dict(holders), paused))
        return views

    async def limits_page(self, request: Request) -> Response:
        """``GET /limits``: every concurrency limit with its live use (``Control.limits``)."""
        async def page() -> Response:
            report = await self.call(self.control.limits)
            return self.render(request, "limits.html", report=report)
        return await self.guarded(request, page)

    # ------------------------------------------------------------------ login

    async def outbox_page(self, request: Request) -> Response:
        """``GET /outbox``: the outbox's stats and latest messages (``Control.outbox``)."""
        unsent = request.query_params.get("unsent") == "1"

        async def page() -> Response:
            stats = await self.call(self.control.outbox)
            messages = await self.call(self.control.outbox_messages, 50, unsent_only=unsent)
            return self.render(request, "outbox.html", stats=stats, messages=messages,
                               unsent=unsent)
        return await self.guarded(request, page)

    async def login_form(self, request: Request) -> Response:
        """``GET /login?next=``: the login form (name; the token in token mode)."""
        return self.render(request, "login.html", next=_safe_next(
            request.query_params.get("next")), error=None, form={})

    async def login(self, request: Request) -> Response:
        """``POST /login``: check the token (:func:`token_ok`), set the session cookie."""
        if not _same_origin(request):
            return self.problem(request, 403, "Refused", _ORIGIN_MESSAGE)
        form = await _form(request)
        name = str(form.get("operator", "")).strip()
        token = str(form.get("token", "")) or None
        nxt = _safe_next(str(form.get("next", "")))

        def again(message: str, status: int) -> HTMLResponse:
            return self.render(request, "login.html", status, next=nxt, error=message,
                               form={"operator": name})

        try:
            if not name:
                raise BadInput("Your name is required: it is recorded with every action.")
            check_identifier(name, "operator name", MAX_KEY_BYTES)
        except RatchetError as exc:
            spec = error_spec(exc)
            return _coded(again(str(exc), spec.http_status), spec)
        host = request.client.host if request.client else None
        if not token_ok(self.settings, token, host):
            if self.settings.api_token is None:
                return again("Without RATCHET_API_TOKEN the dashboard accepts actions from "
                             "this machine (loopback) only.", 403)
            return again("Wrong token: give the service's RATCHET_API_TOKEN.", 401)
        _session, cookie = self.keeper.issue(name)
        response = RedirectResponse(request.scope.get("root_path", "") + nxt, 303)
        response.set_cookie(SESSION_COOKIE, cookie, max_age=int(SESSION_TTL_S), path="/",
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        """``POST /logout`` (CSRF-checked): delete the session cookie."""
        form = await _form(request)
        session = self.session(request)
        if not _same_origin(request) or not self.keeper.csrf_ok(
                session, str(form.get("csrf", ""))):
            return self.problem(request, 403, "Refused", _ORIGIN_MESSAGE)
        response = self.done(request, "/", "Logged out.")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # ------------------------------------------------------------------ actions

    async def act(self, request: Request) -> Response:
        """Dispatch ``POST /actions/{action}`` after the session, CSRF and origin checks."""
        action = str(request.path_params["action"])
        handler = self._actions.get(action)
        if handler is None:
            return self.problem(request, 404, "No such action", f"unknown action {action!r}")
        form = await _form(request)
        session = self.session(request)
        if not _same_origin(request):
            return self.problem(request, 403, "Refused", _ORIGIN_MESSAGE)
        if session is None:
            return self.problem(request, 401, "Log in first",
                                "Actions need a session: log in (your name"
                                + (" and the token" if self.settings.api_token else "")
                                + "), then submit the form again. Nothing was changed.")
        if not self.keeper.csrf_ok(session, str(form.get("csrf", ""))):
            return self.problem(request, 403, "Refused",
                                "The form's CSRF token is missing or belongs to another "
                                "session: reload the page and submit again. Nothing was "
                                "changed.")
        host = request.client.host if request.client else None
        if self.settings.api_token is None and not token_ok(self.settings, None, host):
            return self.problem(request, 403, "Refused",
                                "Without RATCHET_API_TOKEN actions are accepted from "
                                "loopback only. Nothing was changed.")
        values = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        return await handler(self, request, session, values)

    async def _task_action(self, request: Request, session: Session, form: dict[str, str],
                           action: Callable[..., ControlOutcome]) -> Response:
        """Cancel, retry or compensate one task (``action``: ``Control.cancel`` /
        ``Control.retry`` / ``Control.compensate``), audited with the session's operator
        and the form's reason; a refusal is shown on the task page, nothing changed."""
        tid = form.get("task_id", "")
        try:
            reason = _reason(form)
            out = await self.call(action, tid, reason=reason, by=session.operator)
        except RatchetError as exc:
            return await self._refused(request, exc, lambda e, status: self.task_page(
                request, task_id=tid, error=e, form=form, status=status))
        return self.done(request, f"/tasks/{quote(tid, safe='')}", out.message, out.outcome)

    async def _cancel(self, request: Request, session: Session,
                      form: dict[str, str]) -> Response:
        return await self._task_action(request, session, form, self.control.cancel)

    async def _retry(self, request: Request, session: Session,
                     form: dict[str, str]) -> Response:
        return await self._task_action(request, session, form, self.control.retry)

    async def _compensate(self, request: Request, session: Session,
                          form: dict[str, str]) -> Response:
        return await self._task_action(request, session, form, self.control.compensate)

    async def _resolve(self, request: Request, session: Session,
                       form: dict[str, str]) -> Response:
        tid = form.get("task_id", "")
        back_to_task = form.get("back") == "task"

        def again(e: str, status: int) -> Awaitable[Response]:
            if back_to_task:
                return self.task_page(request, task_id=tid, error=e, form=form,
                                      status=status)
            return self.unknown_page(request, error=e, form=form, status=status)

        try:
            outcome = form.get("outcome", "")
            if outcome not in ("done", "not-done", "give-up"):
                raise BadInput("Choose an outcome: done, not-done or give-up. Nothing was "
                               "changed.")
            result = _result(form.get("result", ""), outcome)
            reason = _reason(form)
            info = await self.call(self.control.resolve, tid, outcome, result,
                                   reason=reason, by=session.operator)
        except RatchetError as exc:
            return await self._refused(request, exc, again)
        location = f"/tasks/{quote(tid, safe='')}" if back_to_task else "/unknown"
        return self.done(request, location, f"Task {tid} resolved {outcome}: now "
                                             f"{info.state.value}.")

    async def _pause(self, request: Request, session: Session,
                     form: dict[str, str]) -> Response:
        tid = form.get("task_id", "")
        if tid:  # one task, from its page
            try:
                out = await self.call(self.control.pause, "task", tid,
                                      reason=_reason(form), by=session.operator)
            except RatchetError as exc:
                return await self._refused(request, exc, lambda e, status: self.task_page(
                    request, task_id=tid, error=e, form=form, status=status))
            return self.done(request, f"/tasks/{quote(tid, safe='')}", out.message,
                             out.outcome)
        try:
            name = form.get("type", "").strip()
            if not name:
                raise BadInput("Name the task type to pause. Nothing was changed.")
            reason = _reason(form)
            out = await self.call(self.control.pause, "type", name, reason=reason,
                                  by=session.operator)
        except RatchetError as exc:
            return await self._refused(request, exc, lambda e, status: self.pauses_page(
                request, error=e, form=form, status=status))
        return self.done(request, "/pauses", out.message, out.outcome)

    async def _resume(self, request: Request, session: Session,
                      form: dict[str, str]) -> Response:
        scope = form.get("scope", "type")
        target = form.get("target", "").strip() or None
        on_task = form.get("back") == "task" and scope == "task" and target is not None

        def again(e: str, status: int) -> Awaitable[Response]:
            if on_task:
                return self.task_page(request, task_id=target, error=e, form=form,
                                      status=status)
            return self.pauses_page(request, error=e, form=form, status=status)

        try:
            rate = _rate(form.get("rate", ""), required=False)
            reason = _reason(form)
            out = await self.call(self.control.resume, scope, target, reason=reason,
                                  by=session.operator, rate_per_s=rate)
        except RatchetError as exc:
            return await self._refused(request, exc, again)
        location = f"/tasks/{quote(target or '', safe='')}" if on_task else "/pauses"
        return self.done(request, location, out.message, out.outcome)

    async def _replay(self, request: Request, session: Session,
                      form: dict[str, str]) -> Response:
        fingerprint = form.get("fingerprint", "")
        try:
            rate = _rate(form.get("rate", ""), required=True)
            reason = _reason(form)
            report = await self.call(self.control.quarantine_replay, fingerprint, rate,
                                     reason=reason, by=session.operator)
        except RatchetError as exc:
            return await self._refused(request, exc, lambda e, status: self.quarantine_page(
                request, error=e, form=form, status=status))
        return self.done(request, "/quarantine",
                         f"Replayed {len(report.tasks)} task(s) of fingerprint "
                         f"{report.fingerprint} at {report.rate_per_s:g}/s.")

    async def _refused(self, request: Request, exc: RatchetError,
                       again: Callable[[str, int], Awaitable[Response]]) -> Response:
        """Show why an action was refused: on the page it came from (``again(message,
        status)``), with the status and code of the error's row of
        :data:`ratchet.errors.ERROR_TABLE`; a server-side error (the ledger) on a
        problem page of its own."""
        spec = error_spec(exc)
        if _server_side(spec):
            return self.error_page(request, exc, " (nothing was changed)")
        message = str(exc)
        if not isinstance(exc, BadInput) and "nothing" not in message.lower():
            message += " (nothing was changed)"
        return _coded(await again(message, spec.http_status), spec)

    _actions: ClassVar[Mapping[str, Callable[[Dashboard, Request, Session, dict[str, str]],
                                             Awaitable[Response]]]] = {
        "cancel": _cancel, "retry": _retry, "compensate": _compensate,
        "resolve": _resolve, "pause": _pause, "resume": _resume, "replay": _replay,
    }


_ORIGIN_MESSAGE = ("The request did not come from a page of this dashboard (its Origin "
                   "header names another site), or its CSRF token is missing: reload the "
                   "page and try again. Nothing was changed.")


def _coded(response: Response, spec: ErrorSpec) -> Response:
    """``response`` with the error's code in :data:`ERROR_HEADER`."""
    response.headers[ERROR_HEADER] = spec.code
    return response


def _same_origin(request: Request) -> bool:
    """False when the browser sent an ``Origin`` other than this service's own."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin == f"{request.url.scheme}://{request.url.netloc}"


async def _form(request: Request) -> FormData:
    return await request.form(max_files=0, max_fields=MAX_FORM_FIELDS)


def _safe_next(value: str | None) -> str:
    """A local path to return to after the login (never another site)."""
    if (not value or not value.startswith("/") or value.startswith("//")
            or any(not ("!" <= c <= "~") or c == "\\" for c in value)):
        return "/"
    return value


def _reason(form: Mapping[str, str]) -> str:
    reason = form.get("reason", "").strip()
    if not reason:
        raise BadInput("A reason is required: it is kept in the audit log with your name. "
                       "Nothing was changed.")
    return reason


def _result(text: str, outcome: str) -> Any:
    """The JSON result of a ``done`` resolution (None when blank)."""
    if not text.strip():
        return None
    if outcome != "done":
        raise BadInput(f"A result is recorded only with outcome done, not {outcome}: clear "
                       "the result field. Nothing was changed.")
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise BadInput(f"The result is refused: {exc}. Nothing was changed.") from None
    except ValueError as exc:
        raise BadInput(f"The result is not valid JSON ({exc}). Nothing was changed.") \
            from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _rate(text: str, *, required: bool) -> float | None:
    text = text.strip()
    if not text:
        if required:
            raise BadInput("Give a rate in tasks per second (for example 10). Nothing was "
                           "changed.")
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"The rate {text!r} is not a number of tasks per second. Nothing "
                       "was changed.") from None
    if not math.isfinite(value) or value <= 0:
        raise BadInput(f"The rate must be a number of tasks per second above 0, got "
                       f"{text!r}. Nothing was changed.")
    return value


def routes(control: Control, settings: WebSettings) -> list[BaseRoute]:
    """The dashboard's routes (pages at ``/``, actions at ``/actions/...``, assets at
    ``/static``), all around ``control``."""
    d = Dashboard(control, settings)
    return [
        Route("/", d.gated(d.overview), methods=["GET"]),
        Route("/tasks", d.gated(d.task_list), methods=["GET"]),
        Route("/tasks/{task_id:path}", d.gated(d.task_page), methods=["GET"]),
        Route("/unknown", d.gated(d.unknown_page), methods=["GET"]),
        Route("/quarantine", d.gated(d.quarantine_page), methods=["GET"]),
        Route("/pauses", d.gated(d.pauses_page), methods=["GET"]),
        Route("/limits", d.gated(d.limits_page), methods=["GET"]),
        Route("/outbox", d.gated(d.outbox_page), methods=["GET"]),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/actions/{action}", d.act, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]


__all__ = ["Dashboard", "routes"]
