"""Task function signatures and parameter validation at submit (DESIGN §8, "Definitions").

A task function is called ``fn(ctx, **params)``: its first parameter receives the
:class:`~ratchet.worker.context.TaskContext`, the others are filled by keyword from the
task's params, which are plain JSON. :func:`check_task_function` refuses, at
``@app.task``, a function whose shape can never be called that way, and builds a
:class:`ParamsSchema`: a pydantic (v2) ``TypeAdapter`` over a ``TypedDict`` made of the
parameters after ``ctx`` and their annotations (an unannotated parameter accepts any JSON),
or over the pydantic model given as ``@app.task(params=Model)``.

Validation runs in pydantic's *strict JSON* mode on the params' JSON text: the values must
already be of the declared types (``"5"`` is refused for an ``int``, ``1.0`` too). Nothing
is converted: the ledger stores the JSON the submitter gave (so the idempotency digest is
that of the submitted params) and the function receives those JSON values. Annotate with
JSON-native types (``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict[str, ...]``,
``Literal``, ``TypedDict``, ``X | None``); a ``datetime`` annotation accepts an ISO string
and the function receives the string.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pydantic
import typing_extensions

from .errors import ConfigError, InvalidArguments

__all__ = ["MAX_REPORTED_ERRORS", "ParamsSchema", "check_task_function"]

MAX_REPORTED_ERRORS = 5
"""Most field errors one :class:`~ratchet.errors.InvalidArguments` message lists."""

_CONTEXT_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)


class ParamsSchema:
    """The parameter schema of one task definition.

    Attributes:
        json_schema: the JSON Schema of the params object (pydantic's), stored with the
            definition in the ledger.
        source: ``"signature"`` or ``"model:<qualified name>"``.
    """

    __slots__ = ("_adapter", "json_schema", "source")

    def __init__(self, adapter: pydantic.TypeAdapter[Any], source: str) -> None:
        self._adapter = adapter
        self.source = source
        try:
            self.json_schema: dict[str, Any] = adapter.json_schema()
        except pydantic.PydanticUserError:  # a type with no JSON Schema: validation still works
            self.json_schema = {"type": "object"}

    def validate(self, task: str, version: int, params_json: str) -> None:
        """Check the params' JSON text against the schema (strict JSON mode).

        Raises:
            InvalidArguments: names every wrong field (at most :data:`MAX_REPORTED_ERRORS`):
                ``missing required field 'amount_cents'``, ``unknown field 'coupon'``,
                ``field 'amount_cents': Input should be a valid integer (got "5")``.
        """
        try:
            self._adapter.validate_json(params_json, strict=True)
        except pydantic.ValidationError as exc:
            message, fields = _describe(task, version, exc)
            raise InvalidArguments(message, fields) from None


def _describe(task: str, version: int, exc: pydantic.ValidationError
              ) -> tuple[str, list[tuple[str, str]]]:
    """One line per wrong field of a pydantic error, for :class:`InvalidArguments`, and
    the ``(path, message)`` of each (``path`` ``params.<field>``, its
    :attr:`~ratchet.errors.InvalidArguments.fields`)."""
    errors = exc.errors(include_url=False)
    parts: list[str] = []
    fields: list[tuple[str, str]] = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        loc = ".".join(str(p) for p in error["loc"])
        kind = error["type"]
        path = f"params.{loc}" if loc else "params"
        if kind == "missing":
            parts.append(f"missing required field {loc!r}")
            fields.append((path, "missing required field"))
        elif kind == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
            fields.append((path, "unknown field"))
        else:
            got = _short(error.get("input"))
            where = f"field {loc!r}" if loc else "params"
            parts.append(f"{where}: {error['msg']} (got {got})")
            fields.append((path, f"{error['msg']} (got {got})"))
    more = len(errors) - MAX_REPORTED_ERRORS
    if more > 0:
        parts.append(f"and {more} more")
    message = f"params for task {task!r} (version {version}) refused: " + "; ".join(parts)
    return message, fields


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve(fn: Callable[..., Any], parameter: inspect.Parameter, task: str) -> Any:
    """The parameter's annotation as an object (string annotations evaluated in the
    function's module), ``Any`` when there is none.

    Raises:
        ConfigError: a string annotation that does not evaluate (a name imported only under
            ``TYPE_CHECKING``, a typo).
    """
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        namespace = dict(getattr(fn, "__globals__", {}))
        try:
            return eval(annotation, namespace)  # the function's own annotation text
        except Exception as exc:
            raise ConfigError(
                f"task {task!r}: the annotation {annotation!r} of parameter "
                f"{parameter.name!r} of {_qualname(fn)} cannot be evaluated ({exc}); params "
                "are validated against the annotations, so each must name a type importable "
                "at run time"
            ) from None
    return annotation


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def check_task_function(
    task: str, fn: Callable[..., Any], params_model: type[pydantic.BaseModel] | None = None
) -> ParamsSchema | None:
    """Check ``fn`` can be called as ``fn(ctx, **params)``; build its :class:`ParamsSchema`.

    Args:
        task: the task name (for messages).
        fn: the task function.
        params_model: a pydantic model validating the params instead of the signature.

    Returns:
        The schema, or ``None`` for a callable without an introspectable signature (a C
        function: nothing can be checked).

    Raises:
        ConfigError: no first parameter to receive the context (``def f()``, ``def f(*,
            a)``, ``def f(**kw)``); a first parameter annotated with a type that is not a
            ``TaskContext``; a positional-only parameter after it (params are passed by
            keyword); ``params_model`` not a pydantic model, or naming a field the function
            does not accept, or missing one the function requires; an annotation that
            pydantic cannot validate or that does not evaluate.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    where = f"task {task!r} ({_qualname(fn)})"
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind not in _CONTEXT_KINDS:
        raise ConfigError(
            f"{where} has no context parameter: a task function is called as "
            f"fn(ctx, **params), so its first parameter must be positional and receives the "
            f"TaskContext, e.g. def {getattr(fn, '__name__', 'task')}(ctx: TaskContext, ...)"
            f"; its signature is {signature}"
        )
    first = parameters[0]
    if first.kind is not inspect.Parameter.VAR_POSITIONAL:
        _check_context_annotation(fn, first, where, signature)
    rest = parameters[1:]
    for p in rest:
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(
                f"{where}: parameter {p.name!r} is positional-only; params are passed by "
                f"keyword (fn(ctx, **params)), so it could never be given ({signature})"
            )
    keyword = [p for p in rest if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                              inspect.Parameter.KEYWORD_ONLY)]
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest)
    if params_model is not None:
        return _model_schema(where, params_model, keyword, var_keyword)
    fields: dict[str, Any] = {}
    annotations: dict[str, Any] = {}
    for p in keyword:
        annotation = annotations[p.name] = _resolve(fn, p, task)
        marker = typing_extensions.NotRequired if p.default is not inspect.Parameter.empty \
            else typing_extensions.Required
        fields[p.name] = marker[annotation]
    make_typed_dict: Any = typing_extensions.TypedDict  # functional form, names built here
    shape: Any = make_typed_dict(f"{task} params", fields, total=False)
    shape.__pydantic_config__ = pydantic.ConfigDict(
        extra="allow" if var_keyword else "forbid", title=f"{task} params"
    )
    try:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(shape)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
        culprit = next((p for p in keyword if not _validatable(annotations[p.name])), None)
        which = f"the annotation of parameter {culprit.name!r}" if culprit else \
            "its parameter annotations"
        first_line = str(exc).splitlines()[0].split(". Set `arbitrary_types_allowed")[0]
        raise ConfigError(
            f"{where}: {which} cannot be validated by pydantic ({first_line}); params are "
            "JSON, so annotate with JSON types (str, int, float, bool, list[...], "
            "dict[str, ...]), a TypedDict or a pydantic model, or give @app.task(params=...)"
        ) from None
    return ParamsSchema(adapter, "signature")


def _validatable(annotation: Any) -> bool:
    """Whether pydantic can build a validator for ``annotation`` (to name the culprit)."""
    try:
        pydantic.TypeAdapter(annotation)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError):
        return False
    return True


_context_classes: list[type] = []


def register_context_class(cls: type) -> None:
    """Name ``cls`` as the class whose instance a task function's first parameter receives
    (:class:`ratchet.worker.context.TaskContext` registers itself when its module is
    imported). This module sits below the worker and must not import it, so the worker
    hands the class down instead."""
    if cls not in _context_classes:
        _context_classes.append(cls)


def _may_hold_context(candidate: object) -> bool:
    """Whether a parameter annotated ``candidate`` may receive the task context: not a
    class (a type alias, a ``TypeVar``, ...), a base or a subclass of the context class, a
    class whose subclass check cannot answer (a non-runtime ``Protocol``), or any class
    while no context class is registered (nothing to judge by)."""
    if not isinstance(candidate, type) or not _context_classes:
        return True
    try:
        return any(issubclass(context, candidate) or issubclass(candidate, context)
                   for context in _context_classes)
    except TypeError:
        return True


def _check_context_annotation(
    fn: Callable[..., Any], first: inspect.Parameter, where: str, signature: inspect.Signature
) -> None:
    """Refuse a first parameter annotated with a type that cannot hold a TaskContext (the
    usual mistake: ``def charge(order_id: str, ...)`` without ``ctx``). An annotation that
    does not evaluate (imported under ``TYPE_CHECKING``) is left alone."""
    annotation = first.annotation
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(getattr(fn, "__globals__", {})))
        except Exception:
            return
    if annotation is inspect.Parameter.empty or annotation is Any:
        return
    origin = typing.get_origin(annotation)
    candidates = typing.get_args(annotation) if origin is typing.Union or \
        type(annotation).__name__ == "UnionType" else (annotation,)
    if any(_may_hold_context(candidate) for candidate in candidates):
        return
    raise ConfigError(
        f"{where}: its first parameter {first.name!r} is annotated {first.annotation!r}, but "
        f"the first parameter of a task function receives the TaskContext (fn(ctx, "
        f"**params)); add a context parameter first: {signature} -> (ctx: TaskContext, ...)"
    )


def _model_schema(
    where: str, model: Any, keyword: list[inspect.Parameter], var_keyword: bool
) -> ParamsSchema:
    """The schema of ``@app.task(params=Model)``, after checking the model's fields fit
    the function's keyword parameters."""
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise ConfigError(f"{where}: params must be a pydantic BaseModel subclass, got {model!r}")
    names = {f.alias or n for n, f in model.model_fields.items()}
    accepted = {p.name for p in keyword}
    unknown = sorted(names - accepted)
    if unknown and not var_keyword:
        raise ConfigError(
            f"{where}: params model {model.__qualname__} has fields {unknown} the function "
            "does not accept (params are passed as keyword arguments)"
        )
    required = sorted(p.name for p in keyword if p.default is inspect.Parameter.empty
                      and p.name not in names)
    if required:
        raise ConfigError(
            f"{where}: the function requires {required}, which params model "
            f"{model.__qualname__} does not have"
        )
    source = f"model:{model.__module__}.{model.__qualname__}"
    return ParamsSchema(pydantic.TypeAdapter(model), source)
