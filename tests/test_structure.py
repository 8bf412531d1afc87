"""The structure rules of the code base, enforced by pure file and AST scans (no import of
the scanned modules; well under a second).

* (a) no module in ``src/ratchet`` over 800 lines (one job per module);
* (b) no import cycle among ratchet modules, counting every import — module level,
  ``if TYPE_CHECKING:`` and function-local alike — except those inside a ``try`` whose
  handler catches ``ImportError`` (optional dependencies);
* (c) layers one way: core (pure rules, no I/O) <- ledger <- app and worker <- control <-
  faces (cli, web, demo, and the metrics and tracing exporters in ``observe``);
* (d) the faces take public names only: no face imports a module of ``ratchet.ledger`` or
  ``ratchet.worker``;
* (e) no function-local import of a ratchet module (it hides a cycle or a layer breach);
  only an optional dependency may be imported late, inside ``try/except ImportError``;
* (f) SQL only in the dialect catalogues (``ratchet/ledger/sql/``, the migrations), with the
  exceptions listed in :data:`SQL_ELSEWHERE`, each saying why;
* (g) every wait in the tests goes through ``ratchet.testing.wait_for`` (a deadline, a
  message): no test file defines its own wait/poll loop, and no ``time.sleep`` is directly
  followed by an assertion (a fixed sleep before an assertion is a race), except a sleep
  that *is* the fault under test, marked ``not a wait`` on its line.

Each test prints every offender, so a failure lists all the work left.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PKG = SRC / "ratchet"
TESTS = ROOT / "tests"

MAX_LINES = 800

CORE = (
    "ratchet.states",
    "ratchet.errors",
    "ratchet.errortext",
    "ratchet.retry",
    "ratchet.outcome",
    "ratchet.serde",
    "ratchet.validation",
    "ratchet.storedtext",
    "ratchet.fingerprint",
    "ratchet.shards",
    "ratchet.schedule",
)
"""The pure core: rules without I/O. A core module imports only other core modules."""

FACES = (
    "ratchet.cli",
    "ratchet.web",
    "ratchet.demo",
    "ratchet.contrib",
    "ratchet.observe.metrics",
    "ratchet.observe.ledger_metrics",
    "ratchet.observe.tracing",
)
"""The faces: what users and exporters see. Nothing below imports them."""

LAYER_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ratchet.ledger", ("ratchet.app", "ratchet.worker", "ratchet.control", *FACES)),
    ("ratchet.app", ("ratchet.control", *FACES)),
    ("ratchet.worker", ("ratchet.control", *FACES)),
    ("ratchet.control", FACES),
)
"""(modules under this prefix, may not import modules under these prefixes)."""

FACE_MODULES = ("ratchet.cli", "ratchet.web", "ratchet.demo", "ratchet.contrib")
INTERNALS = ("ratchet.ledger", "ratchet.worker")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# ---------------------------------------------------------------------- the import graph


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


@dataclass(frozen=True)
class Import:
    """One import statement of a ratchet module, resolved to the modules it names."""

    source: str
    targets: frozenset[str]
    line: int
    local: bool  # inside a function
    optional: bool  # inside a try whose handler catches ImportError


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _target(name: str) -> str | None:
    """The module a dotted name lives in (the longest prefix that is a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError")
               for k in kinds):
            return True
    return False


def _imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, local: bool, optional: bool) -> Iterator[Import]:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        if names:
            hits = {t for n in names if _under(n, "ratchet") and (t := _target(n))}
            hits.discard(module)
            # ``from . import x`` names the package and its submodule x: keep x only.
            if len(hits) > 1:
                hits = {h for h in hits if not any(o != h and o.startswith(h + ".") for o in hits)}
            if hits:
                yield Import(module, frozenset(hits), node.lineno, local, optional)
            return
        local = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(node, ast.Try) and _catches_import_error(node):
            for part in node.body:
                yield from visit(part, local, True)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                yield from visit(part, local, optional)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, local, optional)

    yield from visit(tree, False, False)


IMPORTS: list[Import] = [i for m, p in MODULES.items() for i in _imports_of(m, p)]


def _rel(module: str) -> str:
    return MODULES[module].relative_to(ROOT).as_posix()


# ---------------------------------------------------------------------- (a) .. (e)


def test_no_module_is_over_800_lines() -> None:
    big = sorted(
        ((n, _rel(m)) for m, p in MODULES.items()
         if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES),
        reverse=True,
    )
    assert not big, "modules over 800 lines:\n" + "\n".join(f"  {p}: {n}" for n, p in big)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if not imp.optional:
            graph[imp.source] |= imp.targets
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles()
    assert not cycles, "import cycles (every import counted):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in cycles
    )


def _breaches() -> list[str]:
    out = []
    for imp in IMPORTS:
        if imp.optional:
            continue
        for target in sorted(imp.targets):
            if any(_under(imp.source, c) for c in CORE) and not any(
                _under(target, c) for c in CORE
            ):
                out.append(f"{_rel(imp.source)}:{imp.line}: core imports {target}")
            for below, above in LAYER_RULES:
                if _under(imp.source, below) and any(_under(target, a) for a in above):
                    out.append(f"{_rel(imp.source)}:{imp.line}: {below} imports {target}")
    return out


def test_layers_go_one_way() -> None:
    breaches = _breaches()
    assert not breaches, "imports against the layers:\n" + "\n".join(f"  {b}" for b in breaches)


def test_faces_take_public_names_only() -> None:
    offenders = [
        f"{_rel(i.source)}:{i.line}: {t}"
        for i in IMPORTS
        if not i.optional and any(_under(i.source, f) for f in FACE_MODULES)
        for t in sorted(i.targets)
        if any(_under(t, internal) for internal in INTERNALS)
    ]
    assert not offenders, "faces importing ledger/worker internals:\n" + "\n".join(
        f"  {o}" for o in offenders
    )


LATE_FACES: dict[str, frozenset[str]] = {
    "ratchet.cli.serve": frozenset({"ratchet.web.serve"}),
    "ratchet.cli.demo": frozenset({"ratchet.demo.runner"}),
    "ratchet.cli.crashmatrix": frozenset({"ratchet.testing.matrix"}),
    "ratchet.web": frozenset({"ratchet.web.app"}),
}
"""The only late imports that are not optional dependencies: a face loading a heavy face
(the HTTP stack, the demo, the crash-point matrix) when its command runs, so that the CLI's
other commands and a worker's start do not pay for them (about half a second together).
None dodges a cycle: the imported module does not import the importer."""


def test_no_function_local_import_of_a_ratchet_module() -> None:
    offenders = [
        f"{_rel(i.source)}:{i.line}: {', '.join(sorted(i.targets))}"
        for i in IMPORTS
        if i.local and not i.optional
        and not i.targets <= LATE_FACES.get(i.source, frozenset())
    ]
    assert not offenders, "function-local ratchet imports:\n" + "\n".join(
        f"  {o}" for o in offenders
    )


# ---------------------------------------------------------------------- (f) SQL


SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b.*\b(FROM|INTO|SET|WHERE)\b", re.S)

SQL_HOMES = ("ledger/sql/", "ledger/migrations/", "ledger/catalogue.py")
"""Where the ledger's SQL lives (paths under ``src/ratchet``): the dialect catalogues, the
migrations, and the module that loads the catalogue."""

SQL_ELSEWHERE: tuple[tuple[str, str, str], ...] = (
    ("testing/counting/", "",
     "the counting service's own SQLite file: an external system of the tests, not the ledger"),
    ("demo/payments.py", "",
     "the demo's payment service is the counting service: its file, not the ledger"),
    ("fencing.py", "",
     "the fencing helper writes to the application's own database (a table it names)"),
    ("testing/checks.py", "SELECT id FROM tasks",
     "list_task_ids reads a SQLite ledger file read-only, even while a frozen process holds "
     "its write lock (opening a Ledger would wait on it); the ledger API has no listing"),
    ("ledger/", "schema_version",
     "the migration bookkeeping of the dialect that applies the catalogue's migrations"),
    ("ledger/", "sqlite_master",
     "the SQLite dialect asks SQLite's system catalogue which tables exist"),
    ("testing/matrix/rows_submit.py", "matrix_orders",
     "the crash matrix's caller writes and counts its own table (in the world's ledger file "
     "or schema) in its own transaction, which submit(connection=) joins: not the ledger's"),
    ("demo/", "pg_namespace",
     "the demo reads the marker comment on its own PostgreSQL schema (a system catalogue) "
     "before it drops that schema"),
)
"""(path prefix under ``src/ratchet``, text the literal contains ("": any), why)."""


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _string_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string literal but docstrings (prose); an f-string with its holes as ``{}``."""
    docs = _docstrings(tree)
    parts_of_fstrings = {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs and id(node) not in parts_of_fstrings:
                yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(
                v.value if isinstance(v, ast.Constant) else "{}" for v in node.values
            )


def test_sql_only_in_the_dialect_catalogues() -> None:
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(SQL_HOMES):
            continue
        for line, text in _string_literals(ast.parse(path.read_text(encoding="utf-8"))):
            if not SQL.search(text):
                continue
            if any(rel.startswith(prefix) and needle in text
                   for prefix, needle, _why in SQL_ELSEWHERE):
                continue
            offenders.append(f"src/ratchet/{rel}:{line}: {text[:80]!r}")
    assert not offenders, "SQL outside the dialect catalogues:\n" + "\n".join(
        f"  {o}" for o in offenders
    )


# ---------------------------------------------------------------------- (g) waits

WAIT_NAME = re.compile(r"^_?(wait|poll)")


def _is_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "sleep"
            and isinstance(f.value, ast.Name) and f.value.id == "time") or (
        isinstance(f, ast.Name) and f.id == "sleep")


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def test_no_test_file_has_its_own_wait_loop() -> None:
    offenders = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not WAIT_NAME.match(node.name):
                continue
            loops = [n for n in ast.walk(node) if isinstance(n, ast.While | ast.For)]
            if any(_is_sleep(c) for loop in loops for c in ast.walk(loop)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not offenders, "wait/poll loops beside ratchet.testing.wait_for:\n" + "\n".join(
        f"  {o}" for o in offenders
    )


def test_no_fixed_sleep_before_an_assertion() -> None:
    offenders = []
    for path in _test_files():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for first, second in itertools.pairwise(block):
                    if (isinstance(first, ast.Expr) and _is_sleep(first.value)
                            and isinstance(second, ast.Assert)
                            and "not a wait" not in lines[first.lineno - 1]):
                        offenders.append(f"{path.relative_to(ROOT)}:{first.lineno}")
    assert not offenders, "time.sleep directly before an assert (use wait_for):\n" + "\n".join(
        f"  {o}" for o in offenders
    )


# Tracker references ("issue" or "stop" and a number) say when, not why; a reader of the
# project cannot follow them. Built from parts so that this file does not match itself.
TRACKER_REFERENCE = re.compile(r"\b(?:" + "is" + r"sue|st" + r"op)\s+#?[0-9]+\b", re.IGNORECASE)


def test_no_tracker_references_in_code_docs_or_tests() -> None:
    offenders = []
    places = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *SRC.rglob("*.py"),
              *SRC.rglob("*.sql"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*"),
              *(ROOT / "scripts").glob("*")]  # bench/ and scripts/: not their venvs
    for path in places:
        if not path.is_file() or path.suffix not in {".py", ".md", ".sql", ""}:
            continue
        for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                      .splitlines(), 1):
            if TRACKER_REFERENCE.search(text):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()[:80]}")
    assert not offenders, "tracker references (say why, not when):\n" + "\n".join(
        f"  {o}" for o in offenders)
