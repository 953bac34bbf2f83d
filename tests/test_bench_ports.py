"""Benches never bind a fixed host port: every collector a bench starts is given its
events port (a free one, or 0: none), never the default 7151 that a real collector, or
another bench, may hold on the same machine."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def collectors_started(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """Every ``CollectorSettings(...)`` call (but one handed to a ``Fleet`` alone, which
    binds nothing) and every ``slurmgpu collector`` command line, with the source of the
    function it is in."""
    found: list[tuple[ast.AST, str]] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        text = ast.unparse(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Fleet":
                continue
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CollectorSettings" \
                    and "Fleet(CollectorSettings(" not in text:
                found.append((node, text))
            elif isinstance(node, ast.List):
                words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if any(a == "slurmgpu" and b == "collector" for a, b in itertools.pairwise(words)):
                    found.append((node, text))
    return found


def names_an_events_port(node: ast.AST, function: str, source: str) -> bool:
    if isinstance(node, ast.Call):
        return any(k.arg == "events_port" for k in node.keywords)
    # (the command line's other words, or the --config file the bench writes, name it)
    return "--events-port" in function or ("--config" in function and "events_port = " in source)


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_collector_a_bench_starts_names_its_events_port(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    missing = [f"{path.name}:{getattr(n, 'lineno', '?')}" for n, function in collectors_started(ast.parse(source))
               if not names_an_events_port(n, function, source)]
    assert missing == [], "a collector on the default events port (7151)"


def test_the_scan_finds_the_collectors() -> None:
    sources = {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in BENCH.glob("*.py")}
    assert collectors_started(sources["xid_latency.py"]) and collectors_started(sources["automation_rig.py"])
