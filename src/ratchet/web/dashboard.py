"""The server-rendered dashboard (``/``). Filled in by issue 11."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..control import Control
from .app import WebSettings


def routes(control: Control, settings: WebSettings) -> list[BaseRoute]:
    """The dashboard's routes."""
    return []
