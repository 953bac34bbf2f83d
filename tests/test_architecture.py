"""The layer table of docs/architecture.md, as a test: an ast walk over slurmgpu/ (every
import, lazy ones inside functions too) that fails when the shape is broken."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "slurmgpu"

#: The simulator wing: test and demo machinery a production node never runs.
SIM = ("slurmgpu.sim",)
#: Who may use the simulator wing besides itself.
SIM_USERS = ("slurmgpu.cli.sim", "slurmgpu.cli.demo_cmd", "slurmgpu.testing")
#: Where SQL that reads the collector's database may live: the store package (its named
#: queries), the report's read model, and the agent's own spool (another database).
SQL_HOMES = ("slurmgpu.collector.store", "slurmgpu.report.model", "slurmgpu.agent.spool")
#: The node's modules (the agent, the gate and what the hooks run).
NODE = ("slurmgpu.agent", "slurmgpu.gate", "slurmgpu.quickgate", "slurmgpu.localproto",
        "slurmgpu.taskprolog", "slurmgpu.jobfiles")
#: What a prolog or epilog runs: the warm path's client and the cold path's command.
HOOKS = ("slurmgpu.quickgate", "slurmgpu.localproto", "slurmgpu.gate", "slurmgpu.taskprolog",
         "slurmgpu.cli.slurm_cmds")
#: Modules a bare interpreter (-I -S) runs: the standard library only.
STDLIB_ONLY = ("slurmgpu.quickgate", "slurmgpu.localproto")
#: SQL that reads or writes: none outside SQL_HOMES.
SQL = re.compile(r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b")
MAX_MODULE_LINES = 800
#: A module's docstring says what it is and promises; design stories go to docs/.
MAX_DOCSTRING_WORDS = 200

MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def tree(name: str) -> ast.Module:
    return ast.parse(modules()[name].read_text(encoding="utf-8"))


def imported(name: str) -> set[str]:
    """Every slurmgpu module ``name`` imports, at top level or inside a function."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from slurmgpu.x import y`: y may be a module.
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules())
    return {m for m in found if m == "slurmgpu" or m.startswith("slurmgpu.")}


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {t}" for m in modules() if under(m, sources)
                  for t in imported(m) if under(t, targets))


# ------------------------------------------------------------------------ the layer table

LAYERS = [
    # (who, must not import, why)
    (("slurmgpu.agent",), ("slurmgpu.collector",), "node and head meet only on the wire"),
    (("slurmgpu.collector",), ("slurmgpu.agent",), "node and head meet only on the wire"),
    (("slurmgpu.checks",), ("slurmgpu.actions", "slurmgpu.slurm", "slurmgpu.cli", "slurmgpu.gate",
                            "slurmgpu.agent", "slurmgpu.collector"), "checks are pure"),
    (("slurmgpu.result", "slurmgpu.facts", "slurmgpu.decision", "slurmgpu.xid", "slurmgpu.sxid", "slurmgpu.errors",
      "slurmgpu.config"), ("slurmgpu.sources", "slurmgpu.actions", "slurmgpu.slurm", "slurmgpu.cli",
                           "slurmgpu.agent", "slurmgpu.collector", "slurmgpu.gate"),
     "the vocabulary depends on nothing that does I/O"),
    (("slurmgpu.engine", "slurmgpu.sources", "slurmgpu.wire", "slurmgpu.summary"),
     ("slurmgpu.cli", "slurmgpu.agent", "slurmgpu.collector", "slurmgpu.gate"), "lower layers"),
    (("slurmgpu.slurm",), ("slurmgpu.cli", "slurmgpu.agent", "slurmgpu.collector", "slurmgpu.gate"),
     "the Slurm client knows nothing of who calls it"),
    (NODE, ("slurmgpu.collector",), "node modules never import the collector"),
    (HOOKS, ("slurmgpu.collector",), "the prolog/epilog hooks never import the collector"),
    (("slurmgpu.report",), ("slurmgpu.agent",), "the report reads the database, not the agent"),
    (("slurmgpu.validate",), ("slurmgpu.cli", "slurmgpu.agent", "slurmgpu.collector", "slurmgpu.gate",
                              "slurmgpu.slurm", "slurmgpu.actions"),
     "active tests judge; the CLI runs them, the agent and the collector carry their findings"),
    (("slurmgpu.remediation",), ("slurmgpu.sources", "slurmgpu.cli", "slurmgpu.agent", "slurmgpu.collector",
                                 "slurmgpu.gate", "slurmgpu.slurm", "slurmgpu.actions"),
     "the ladder decides and the ticket is data; the collector carries the steps out"),
]


@pytest.mark.parametrize(("sources", "targets", "why"), LAYERS, ids=[layer[0][0] for layer in LAYERS])
def test_layer(sources: tuple[str, ...], targets: tuple[str, ...], why: str) -> None:
    assert violations(sources, targets) == [], why


def test_runtime_never_imports_the_simulator() -> None:
    offenders = sorted(f"{m} imports {t}" for m in modules()
                       if not under(m, SIM) and m not in SIM_USERS
                       for t in imported(m) if under(t, SIM))
    assert offenders == []


@pytest.mark.parametrize("module", STDLIB_ONLY)
def test_the_warm_path_is_standard_library_only(module: str) -> None:
    """The prolog's warm path: a bare interpreter (-I -S) runs it as a file."""
    names = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module} runs as a file: no relative imports"
            names.add((node.module or "").partition(".")[0])
    import sys

    assert sorted(n for n in names if n not in sys.stdlib_module_names and n != "__future__") == []


def test_sql_lives_in_the_store_and_the_read_model() -> None:
    offenders = sorted(m for m, p in modules().items()
                       if SQL.search(p.read_text(encoding="utf-8")) and not under(m, SQL_HOMES))
    assert offenders == []


@pytest.mark.parametrize("sql", ["SELECT 1", "INSERT INTO t (a) VALUES (1)", "UPDATE t SET a = 1",
                                 "DELETE FROM t"])
def test_the_sql_rule_sees_reads_and_writes(sql: str) -> None:
    assert SQL.search(f'db.execute("{sql}")')


def cycles() -> list[list[str]]:
    graph = {m: {t for t in imported(m) if t in modules() and t != m} for m in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_but_the_check_registry() -> None:
    """A package's __init__ importing its own modules (the check registry imports every
    check, each check imports the registry) is the one cycle allowed."""
    bad = [c for c in cycles() if not all(under(m, ("slurmgpu.checks",)) for m in c)]
    assert bad == []


def long_functions() -> Iterator[str]:
    for name, path in modules().items():
        if under(name, SIM):
            continue
        for node in ast.walk(tree(name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES and "migration" not in node.name:
                    yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({length} lines)"


def test_functions_are_short() -> None:
    assert sorted(long_functions()) == []


def test_runtime_modules_are_small() -> None:
    big = sorted(f"{m} ({n} lines)" for m, p in modules().items()
                 if not under(m, SIM) and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES)
    assert big == []


def test_module_docstrings_are_short() -> None:
    long = sorted(f"{m} ({n} words)" for m in modules()
                  if (n := len((ast.get_docstring(tree(m)) or "").split())) > MAX_DOCSTRING_WORDS)
    assert long == [], "design stories and measurements go to docs/ (docs/design-notes.md)"


def test_the_walker_sees_lazy_imports(tmp_path: Path) -> None:
    """The rules above are only as good as ``imported``: it must see an import inside a
    function and resolve relative imports."""
    assert "slurmgpu.sim.build" in imported("slurmgpu.cli.sim") or any(
        t.startswith("slurmgpu.sim") for t in imported("slurmgpu.cli.sim"))


def test_the_walks_in_docs_architecture_name_real_code() -> None:
    """Every `file.py:Name` (or `file.py:Class.method`) hop in docs/architecture.md exists."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    hops = re.findall(r"`([\w/]+\.py):\s*([\w.]+)", doc)
    assert len(hops) > 15
    missing = []
    for file, dotted in hops:
        path = PACKAGE / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
            continue
        defined = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        missing += [f"{file}:{dotted}" for part in dotted.split(".") if part not in defined]
    assert missing == []
