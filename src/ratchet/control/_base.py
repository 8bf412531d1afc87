"""The ledger handles of :class:`ratchet.Control`: the App or URL it was made with, a
read-only handle and a write handle, each opened at first use."""

from __future__ import annotations

import threading
from types import TracebackType

from ..app import App
from ..config import parse_ledger_url, redact_url
from ..errors import ConfigError, LedgerCorrupt
from ..ledger import open_ledger
from ..ledger.base import Ledger

__all__ = ["ControlHandles"]


class ControlHandles:
    """What every :class:`ratchet.Control` call goes through: :meth:`_reader` for reads
    (the ledger must exist; never created or migrated), :meth:`_writer` for operator
    writes (must exist; migrated if older). Made with an App holding an open ledger
    object, both are that object.

    Raises:
        ConfigError: the URL is malformed, ``app`` is not an App, or both were given (at
            construction).
    """

    def __init__(self, ledger_url: str | None = None, *, app: App | None = None) -> None:
        if app is not None and not isinstance(app, App):
            raise ConfigError(f"app must be a ratchet.App, got {type(app).__name__}")
        if app is not None and ledger_url is not None:
            raise ConfigError(
                "give Control a ledger_url or an app, not both (the app's ledger is used)"
            )
        self._app = app
        self._url = app.ledger_url if app is not None else ledger_url
        if app is None or app.ledger_url is not None or not app.holds_ledger_object:
            parse_ledger_url(self._url)  # fail fast on a malformed URL (ConfigError)
        self._read: Ledger | None = None
        self._write: Ledger | None = None
        # One Control may serve many threads (``ratchet serve``'s threadpool): the ledgers
        # are thread-safe, their lazy opening is made so here (never two handles).
        self._open_lock = threading.Lock()

    # ------------------------------------------------------------------ ledgers

    def _reader(self) -> Ledger:
        """The ledger for read-only calls: must exist, never created or migrated."""
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger
        if self._read is None:
            with self._open_lock:
                if self._read is None:
                    self._read = open_ledger(self._url, migrate=False, must_exist=True)
        return self._read

    def _writer(self) -> Ledger:
        """The ledger for operator writes: must exist; migrated if older."""
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger
        if self._write is None:
            with self._open_lock:
                if self._write is None:
                    self._write = open_ledger(self._url, migrate=True, must_exist=True)
        return self._write

    def close(self) -> None:
        """Close the connections this object opened (not the App's)."""
        with self._open_lock:
            for led in (self._read, self._write):
                if led is not None:
                    led.close()
            self._read = self._write = None

    @property
    def can_submit(self) -> bool:
        """True when this Control was made with an App (:meth:`submit` needs its task
        registry)."""
        return self._app is not None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "<ledger object>" if self._app is not None and self._app.holds_ledger_object \
            else redact_url(parse_ledger_url(self._url).url)
        return f"<ratchet.Control ledger={where!r}>"

    def ledger_corruption(self) -> LedgerCorrupt | None:
        """The last :class:`~ratchet.errors.LedgerCorrupt` a call of this Control (or of
        its App's ledger object) raised, or None: no read, what was seen. A damaged page
        fails only the calls that read it; ``ratchet serve``'s health check reports it.
        Kept until :meth:`close` (a restored ledger is a new file or server state, which
        a process opens anew)."""
        ledgers = [self._read, self._write]
        if self._app is not None and self._app.holds_ledger_object:
            ledgers.insert(0, self._app.ledger)
        for led in ledgers:
            if led is not None and led.corruption is not None:
                return led.corruption
        return None

