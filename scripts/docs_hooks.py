"""MkDocs hooks: the CLI and HTTP API reference pages are generated from the code at build
time, so they cannot drift from what ``ratchet`` and ``ratchet serve`` accept.

* ``<!-- ratchet:cli -->`` in a page is replaced by every command of the Typer app
  ``ratchet.cli.main.cli`` (the console script's entry point): usage, help text and a table
  of its arguments and options. It walks the Click command tree Typer builds, so it keeps
  working however the commands are spread over modules, as long as they are registered on
  that one app.
* ``<!-- ratchet:openapi -->`` is replaced by the operations of the HTTP API, read from the
  OpenAPI document the service itself serves at ``/api/openapi.json`` (an app built by
  ``ratchet.web.create_app`` with a bearer token configured, asked through Starlette's test
  client; no server is started and no ledger is opened).

Registered in mkdocs.yml (``hooks:``). Anything that fails here fails the build.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

CLI_MARK = "<!-- ratchet:cli -->"
OPENAPI_MARK = "<!-- ratchet:openapi -->"
DOCS_TOKEN = "docs-build-token"


def _cell(text: object) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- the CLI -------------------------------------------------------------------------------


def _metavar(param: Any) -> str:
    if getattr(param, "metavar", None):
        return str(param.metavar)
    name = getattr(param.type, "name", "") or "value"
    return str(name).upper()


def _param_row(param: Any, ctx: Any) -> str | None:
    # Duck-typed: Typer may build its commands on click or on a click it vendors.
    if param.param_type_name == "option":
        if param.hidden or param.name == "help":
            return None
        names = ", ".join(f"`{n}`" for n in (*param.opts, *param.secondary_opts))
        kind = "flag" if param.is_flag else _cell(_metavar(param))
        help_text = param.help or ""
        default = param.default
        if param.show_default is not False and default not in (None, (), [], False) \
                and not callable(default):
            help_text += f" (default: `{default}`)"
        if param.envvar:
            env = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar)
            help_text += f" (env: `{env}`)"
        if param.required:
            help_text += " (required)"
        return f"| {names} | {kind} | {_cell(help_text)} |"
    if param.param_type_name == "argument":
        name = (param.name or "").upper()
        help_text = getattr(param, "help", None) or ""
        req = "required" if param.required else "optional"
        return f"| `{name}` | argument ({req}) | {_cell(help_text)} |"
    return None


def _command_md(cmd: Any, path: list[str], parent: Any, out: list[str]) -> None:
    ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent)
    title = " ".join(path)
    level = "#" * min(2 + max(len(path) - 2, 0), 4)
    if len(path) > 1:
        out.append(f"{level} `{title}`\n")
    help_text = (cmd.help or "").strip()
    if help_text:
        out.append(help_text.replace("\b\n", "") + "\n")
    pieces = ["[OPTIONS]"]
    for param in cmd.get_params(ctx):
        if param.param_type_name == "argument":
            name = (param.name or "").upper()
            pieces.append(name if param.required else f"[{name}]")
    if hasattr(cmd, "list_commands"):
        pieces.append("COMMAND [ARGS]...")
    out.append(f"```text\n{title} {' '.join(pieces)}\n```\n")
    rows = [row for p in cmd.get_params(ctx) if (row := _param_row(p, ctx))]
    if rows:
        out.append("| name | takes | what it does |\n|---|---|---|")
        out.extend(rows)
        out.append("")
    if hasattr(cmd, "list_commands"):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            _command_md(sub, [*path, name], ctx, out)


def cli_markdown() -> str:
    import typer

    from ratchet.cli.main import cli

    command = typer.main.get_command(cli)
    out: list[str] = []
    _command_md(command, ["ratchet"], None, out)
    return "\n".join(out)


# -- the HTTP API --------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    import warnings

    with warnings.catch_warnings():
        # Starlette's test client warns that it is moving off httpx; the request is the same.
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from ratchet.web import WebSettings, create_app

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'docs.db'}"
        app = create_app(WebSettings(ledger_url=url, api_token=DOCS_TOKEN))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.get("/api/openapi.json")
            answer.raise_for_status()
            doc: dict[str, Any] = answer.json()
    return doc


def _ref_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    for combo in ("anyOf", "oneOf", "allOf"):
        if combo in schema:
            return " or ".join(_ref_name(s) for s in schema[combo])
    if schema.get("type") == "array":
        return f"array of {_ref_name(schema.get('items', {}))}"
    if "type" in schema:
        return f"`{schema['type']}`"
    return "any"


def _operation_md(method: str, path: str, op: dict[str, Any], out: list[str]) -> None:
    out.append(f"### `{method.upper()} /api{path}`\n")
    if op.get("summary"):
        out.append(f"**{op['summary']}**\n")
    if op.get("description"):
        out.append(op["description"].strip() + "\n")
    if op.get("security"):
        out.append("Needs `Authorization: Bearer $RATCHET_API_TOKEN` when the service has "
                   "a token.\n")
    params = op.get("parameters", [])
    if params:
        out.append("| parameter | in | type | required | description |\n|---|---|---|---|---|")
        for p in params:
            out.append(f"| `{p['name']}` | {p['in']} | {_cell(_ref_name(p.get('schema', {})))}"
                       f" | {'yes' if p.get('required') else 'no'}"
                       f" | {_cell(p.get('description', ''))} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        for ctype, media in body.get("content", {}).items():
            out.append(f"Request body (`{ctype}`): {_ref_name(media.get('schema', {}))}\n")
    responses = op.get("responses", {})
    if responses:
        out.append("| status | description | body |\n|---|---|---|")
        for code, resp in sorted(responses.items()):
            content = resp.get("content", {})
            shapes = ", ".join(_ref_name(m.get("schema", {})) for m in content.values())
            out.append(f"| {code} | {_cell(resp.get('description', ''))} | {_cell(shapes)} |")
        out.append("")


def _schema_md(name: str, schema: dict[str, Any], out: list[str]) -> None:
    out.append(f"### {name}\n")
    if schema.get("description"):
        out.append(schema["description"].strip() + "\n")
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        out.append("| field | type | required | description |\n|---|---|---|---|")
        for field, spec in props.items():
            out.append(f"| `{field}` | {_cell(_ref_name(spec))} | "
                       f"{'yes' if field in required else 'no'} | "
                       f"{_cell(spec.get('description', ''))} |")
        out.append("")


def openapi_markdown() -> str:
    doc = openapi_document()
    info = doc.get("info", {})
    out = [f"OpenAPI {doc.get('openapi', '')}, *{info.get('title', '')}* "
           f"version {info.get('version', '')}; the document's paths are relative to `/api`, "
           "shown here in full.\n", "## Operations\n"]
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                _operation_md(method, path, op, out)
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out.append("## Schemas\n")
        for name in sorted(schemas):
            _schema_md(name, schemas[name], out)
    return "\n".join(out)


# -- the hook ------------------------------------------------------------------------------


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if OPENAPI_MARK in markdown:
        markdown = markdown.replace(OPENAPI_MARK, openapi_markdown())
    return markdown
