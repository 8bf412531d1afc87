"""Validation at the edges (DESIGN, "Versioned definitions"): a task function without a
context first parameter is refused at ``@app.task``; params are validated at submit
against the function's signature (or a pydantic model) in strict JSON mode, refused naming
the field before anything is written, on both ledgers, through ``App.submit``,
``App.submit_many`` and ``ratchet submit``."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest
from typer.testing import CliRunner

from ratchet import App, ConfigError, InvalidArguments, SubmitRequest, TaskContext
from ratchet.cli.main import cli

pytestmark = pytest.mark.timeout(60)


def _count(app: App) -> int:
    app.ledger.schema_version()  # opened (and created) before counting
    return len(app.list_tasks(limit=1000).tasks)


def _register(app: App) -> None:
    @app.task(name="v.charge")
    def charge(ctx: TaskContext, order_id: str, amount_cents: int, note: str | None = None,
               tags: list[str] | None = None, mode: Literal["fast", "slow"] = "fast",
               anything=None) -> None:  # type: ignore[no-untyped-def]
        return None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"order_id": "o-1"}, "missing required field 'amount_cents'"),
        ({}, "missing required field 'order_id'; missing required field 'amount_cents'"),
        ({"order_id": "o-1", "amount_cents": 1, "coupon": "X"}, "unknown field 'coupon'"),
        ({"order_id": "o-1", "amount_cents": 1, "ctx": None}, "unknown field 'ctx'"),
        ({"order_id": "o-1", "amount_cents": "5"},
         "field 'amount_cents': Input should be a valid integer (got '5')"),
        ({"order_id": "o-1", "amount_cents": 1.5},
         "field 'amount_cents': Input should be a valid integer"),
        ({"order_id": "o-1", "amount_cents": True},
         "field 'amount_cents': Input should be a valid integer"),
        ({"order_id": 7, "amount_cents": 1}, "field 'order_id': Input should be a valid string"),
        ({"order_id": "o", "amount_cents": 1, "tags": ["a", 2]},
         "field 'tags.1': Input should be a valid string"),
        ({"order_id": "o", "amount_cents": 1, "mode": "medium"}, "field 'mode': Input should be"),
    ],
)
def test_wrong_params_are_refused_naming_the_field(
    app: App, params: dict[str, Any], message: str
) -> None:
    _register(app)
    before = _count(app)
    with pytest.raises(InvalidArguments) as info:
        app.submit("v.charge", params, idempotency_key="k1")
    assert "params for task 'v.charge' (version 1) refused: " in str(info.value)
    assert message in str(info.value)
    with pytest.raises(InvalidArguments) as many:
        app.submit_many([SubmitRequest("v.charge", {"order_id": "ok", "amount_cents": 1}),
                         SubmitRequest("v.charge", params)])
    assert message in str(many.value)
    assert _count(app) == before  # nothing written, the good request neither


def test_valid_params_are_stored_as_given(app: App) -> None:
    _register(app)
    params = {"order_id": "o-1", "amount_cents": 5, "tags": ["x"], "anything": {"a": [1]}}
    handle = app.submit("v.charge", params, idempotency_key="o-1")
    info = handle.get()
    assert info.params == params
    # The same params again: the same task (the digest is that of the JSON given).
    assert app.submit("v.charge", dict(params), idempotency_key="o-1").task_id == handle.task_id


class ChargeParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    order_id: str = pydantic.Field(min_length=3)
    amount_cents: int = pydantic.Field(gt=0)


def test_params_model(app: App) -> None:
    @app.task(name="v.model", params=ChargeParams)
    def charge(ctx: TaskContext, **params: Any) -> None:
        return None

    before = _count(app)
    with pytest.raises(InvalidArguments, match=r"field 'amount_cents': Input should be greater"):
        app.submit("v.model", {"order_id": "o-1", "amount_cents": 0})
    with pytest.raises(InvalidArguments, match=r"field 'order_id': String should have at least"):
        app.submit("v.model", {"order_id": "o", "amount_cents": 5})
    with pytest.raises(InvalidArguments, match=r"unknown field 'x'"):
        app.submit("v.model", {"order_id": "o-1", "amount_cents": 5, "x": 1})
    assert _count(app) == before
    app.submit("v.model", {"order_id": "o-1", "amount_cents": 5})
    assert app.definition("v.model").params_schema["properties"]["amount_cents"][
        "exclusiveMinimum"] == 0


def test_params_model_must_fit_the_function(app: App) -> None:
    with pytest.raises(ConfigError, match=r"has fields \['amount_cents'\] the function does not"):
        @app.task(name="v.m1", params=ChargeParams)
        def one(ctx: TaskContext, order_id: str) -> None:
            return None
    with pytest.raises(ConfigError, match=r"requires \['currency'\], which params model"):
        @app.task(name="v.m2", params=ChargeParams)
        def two(ctx: TaskContext, order_id: str, amount_cents: int, currency: str) -> None:
            return None
    with pytest.raises(ConfigError, match="params must be a pydantic BaseModel"):
        app.task(name="v.m3", params=dict)(lambda ctx: None)  # type: ignore[arg-type]


def _no_params() -> None:
    return None


def _keyword_only(*, order_id: str) -> None:
    return None


def _kwargs_only(**params: Any) -> None:
    return None


def _typed_first(order_id: str, amount_cents: int) -> None:
    return None


def _positional_only(ctx: TaskContext, order_id: str, /) -> None:
    return None


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_no_params, "has no context parameter"),
        (_keyword_only, "has no context parameter"),
        (_kwargs_only, "has no context parameter"),
        (_typed_first, "its first parameter 'order_id' is annotated"),
        (_positional_only, "parameter 'order_id' is positional-only"),
    ],
    ids=["no-params", "keyword-only", "kwargs-only", "typed-first", "positional-only"],
)
def test_task_functions_that_cannot_take_a_context_are_refused(
    tmp_path: Path, fn: Any, message: str
) -> None:
    app = App(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(ConfigError) as info:
        app.task(name="v.bad")(fn)
    assert message in str(info.value)
    assert fn.__qualname__ in str(info.value) and "'v.bad'" in str(info.value)
    assert "v.bad" not in app.tasks


def test_accepted_shapes(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'l.db'}")
    app.task(name="a")(lambda ctx: None)
    app.task(name="b")(lambda ctx, **kw: None)
    app.task(name="c")(lambda *args, **kw: None)

    def unannotated(context, x):  # type: ignore[no-untyped-def]
        return x

    app.task(name="d")(unannotated)
    app.submit("b", {"anything": [1, {"x": None}]})
    app.submit("d", {"x": {"any": "json"}})
    with pytest.raises(InvalidArguments, match="missing required field 'x'"):
        app.submit("d", {})
    app.close()


def test_unresolvable_annotation_is_a_config_error(tmp_path: Path) -> None:
    source = textwrap.dedent("""
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from ratchet import App
        if TYPE_CHECKING:
            from decimal import Decimal
        app = App()
        def charge(ctx, amount: Decimal) -> None:
            return None
    """)
    namespace: dict[str, Any] = {"__name__": "v_mod"}
    exec(compile(source, "v_mod.py", "exec"), namespace)
    with pytest.raises(ConfigError, match=r"annotation 'Decimal' of parameter 'amount'"):
        namespace["app"].task(name="v.dec")(namespace["charge"])


def test_cli_submit_refuses_wrong_params(
    tmp_path: Path, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vapp.py").write_text(textwrap.dedent("""
        from ratchet import App, TaskContext
        app = App()
        @app.task(name="v.charge")
        def charge(ctx: TaskContext, order_id: str, amount_cents: int) -> None:
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vapp", None)
    runner = CliRunner()
    bad = runner.invoke(cli, ["submit", "vapp:app", "v.charge", "--ledger", ledger_url,
                              "--params", '{"order_id": "o-1", "amount_cents": "12"}'])
    assert bad.exit_code == 2, bad.output
    assert "field 'amount_cents': Input should be a valid integer" in bad.output
    ok = runner.invoke(cli, ["submit", "vapp:app", "v.charge", "--ledger", ledger_url,
                             "--params", '{"order_id": "o-1", "amount_cents": 12}', "--json"])
    assert ok.exit_code == 0, ok.output
    listed = runner.invoke(cli, ["tasks", "--ledger", ledger_url, "--json"])
    assert listed.output.count('"task_id"') == 1, listed.output
    sys.modules.pop("vapp", None)


class _Order:
    """Not JSON: pydantic has no validator for it."""


def _arbitrary_class(ctx: TaskContext, n: int, order: _Order) -> None:
    return None


def test_annotation_pydantic_cannot_validate_is_a_config_error(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(ConfigError) as info:
        app.task(name="v.order")(_arbitrary_class)
    message = str(info.value)
    assert "the annotation of parameter 'order' cannot be validated by pydantic" in message
    assert "arbitrary_types_allowed" not in message and "annotate with JSON types" in message
