"""Loading the application a command names (``myproj.tasks:app``).

The lookup itself is the standard library's :func:`pkgutil.resolve_name`; this module adds
the current directory to ``sys.path`` (as ``python -m`` does), checks that the object is a
:class:`~ratchet.app.App`, and turns every way the lookup can fail into a
:class:`~ratchet.errors.ConfigError` that says what to fix.
"""

from __future__ import annotations

import os
import pkgutil
import sys
import traceback

from .app import App
from .errors import ConfigError
from .worker.hooks import Middleware

__all__ = ["load_app", "load_middleware"]


def _resolve(spec: str, what: str) -> object:
    """:func:`pkgutil.resolve_name` with the current directory importable and every failure
    a :class:`ConfigError` naming ``what`` (``"app"``, ``"middleware"``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{what} spec {spec!r} must look like MODULE:ATTRIBUTE, e.g. myproj.tasks:app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return pkgutil.resolve_name(spec)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"cannot import module {module_name!r}: {exc} (run from the directory that "
            "holds the package, or install it)"
        ) from exc
    except AttributeError as exc:
        message = f"module {module_name!r} has no attribute {attr!r}"
        # Python's own text says the same for a plain name; for a dotted path (or an
        # AttributeError the module raised) it says which part is missing.
        detail = "" if str(exc) == message else f" ({exc})"
        raise ConfigError(message + detail) from exc
    except ValueError as exc:
        raise ConfigError(f"{what} spec {spec!r} is not a valid name: {exc}") from exc
    except Exception as exc:  # the user's module raised while importing
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise ConfigError(
            f"importing module {module_name!r} raised {type(exc).__name__}: {exc}{where}"
        ) from exc


def load_middleware(spec: str) -> Middleware:
    """Import ``MODULE:ATTRIBUTE`` naming a :class:`~ratchet.Middleware` subclass (called
    with no arguments) or instance, and return the instance (``ratchet worker
    --middleware``).

    Raises:
        ConfigError: as :func:`load_app`; also when the attribute is neither a Middleware
            subclass nor an instance, or the class cannot be called without arguments.
    """
    found = _resolve(spec, "middleware")
    if isinstance(found, type) and issubclass(found, Middleware):
        try:
            return found()
        except TypeError as exc:
            raise ConfigError(
                f"middleware class {spec!r} cannot be created without arguments ({exc}); "
                "name an instance instead (e.g. myproj.metrics:middleware)"
            ) from exc
    if isinstance(found, Middleware):
        return found
    raise ConfigError(
        f"{spec!r} is a {type(found).__name__}, not a ratchet.Middleware subclass or instance"
    )


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTRIBUTE`` and return the :class:`~ratchet.app.App` it names.

    Args:
        spec: ``"package.module:attribute"`` (a dotted attribute path is allowed after the
            colon, e.g. ``"myproj.tasks:registry.app"``).

    Raises:
        ConfigError: malformed spec, the module cannot be imported (or raised while
            importing: the message names the exception and the file and line where it was
            raised), no such attribute, or the attribute is not a ``ratchet.App``.
    """
    found = _resolve(spec, "app")
    if not isinstance(found, App):
        raise ConfigError(f"{spec!r} is a {type(found).__name__}, not a ratchet.App")
    return found
