"""The replay tests import their app module (``replayapp``) from this directory, as
``ratchet replay --app replayapp:app`` does. Ledgers come from tests/conftest.py
(``ledger_url``: a SQLite file or a private PostgreSQL schema)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
