"""The version of this Ratchet (``ratchet.__version__``), in a module of its own so that
internal modules can name it without importing the package (``ratchet/__init__``)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
