"""A faster ``__init__`` for the ledger's frozen, slotted record dataclasses (the records a
worker builds per task: claims, writes, outcomes)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, TypeVar

__all__ = ["fast_init"]

_R = TypeVar("_R")


class _Factory:
    """Default of a field with a ``default_factory`` in a :func:`fast_init` signature."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def fast_init(cls: type[_R]) -> type[_R]:
    """Give a frozen, slotted dataclass a faster ``__init__`` (records built per task).

    The ``__init__`` dataclasses generates for a frozen class stores every field with
    ``object.__setattr__`` (a global and an attribute lookup, then the generic setter);
    this one calls each slot's own descriptor, about twice as fast. Same signature,
    defaults and default factories; instances stay frozen (assignment still raises
    ``FrozenInstanceError``) and compare and hash as before.

    Raises:
        TypeError: ``cls`` is not a frozen slotted dataclass with plain positional fields
            and no ``__post_init__`` (checked at import).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if (params is None or not params.frozen or "__slots__" not in cls.__dict__
            or hasattr(cls, "__post_init__")):
        raise TypeError(f"fast_init needs a frozen slotted dataclass, got {cls.__name__}")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    args: list[str] = []
    body: list[str] = []
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only:
            raise TypeError(f"fast_init: field {cls.__name__}.{f.name} is not a plain one")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        value = f.name
        if f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_FACTORY")
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            args.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # built from the field names above only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
