"""The version of Ratchet (the distribution's, as in ``pyproject.toml``)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
