"""`slurmgpu check` itself, without click: ``run_check`` gathers the facts, runs the
checks and prints the verdict (a table, or JSON with ``--json``); its exit code is the
verdict's. The click command (``slurmgpu.cli.checks``) and the click-free entry
(``slurmgpu.cli.oneshot``) both run it."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from slurmgpu.cli.loading import load_settings
from slurmgpu.errors import UsageError
from slurmgpu.facts import XidEvent
from slurmgpu.result import Finding, Severity, Verdict
from slurmgpu.sources.kmsg import bounded

JSON_SCHEMA = "slurmgpu.check/1"


def parse_gpu_list(text: str) -> frozenset[int]:
    """"0,2,4-7" -> {0, 2, 4, 5, 6, 7}."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise UsageError(f"--gpus: {part!r} is not a GPU index or range (e.g. 0,2,4-7)") from None
    if not out or min(out) < 0:
        raise UsageError(f"--gpus: {text!r} names no GPU")
    return frozenset(out)


def parse_xid(text: str) -> XidEvent:
    """XID[:GPU[:MESSAGE]]: the message is the driver's text after the code, which picks
    the action for XIDs whose meaning depends on it (e.g. 149:2:"NETIR_LINK_EVT Fatal")."""
    code, _, rest = text.partition(":")
    gpu, _, message = rest.partition(":")
    try:
        return XidEvent(xid=int(code), gpu=int(gpu) if gpu else None, source="command line",
                        message=bounded(message))
    except ValueError:
        raise UsageError(f"--xid: {text!r} is not XID[:GPU[:MESSAGE]] (e.g. 79:3)") from None


def run_check(config_file: str | None, gpus: str | None, node: str | None, xids: Sequence[str], *,
              as_json: bool = False, show_all: bool = False, log_level: str = "error") -> int:
    """Check this node (``gpus``: only these, e.g. "0,2"); print the verdict; its exit
    code. Raises UsageError (a bad --gpus/--xid) and ConfigError."""
    from slurmgpu.cli.loading import versions_cache
    from slurmgpu.engine import evaluate, gather, node_name, second_brake_sample, system_sources
    from slurmgpu.sources.kmsg import xid_window

    started = time.perf_counter()
    scope = parse_gpu_list(gpus) if gpus is not None else None
    events = [parse_xid(x) for x in xids]
    name = node or node_name()
    settings = load_settings(config_file, node=name, known_checks=True).settings
    sources = system_sources(settings, versions_cache=versions_cache(settings))
    facts = gather(sources, node=name, scope=scope, xids=events, kernel_log=settings.paths.kmsg,
                   xids_since=xid_window(settings, gpus=scope))
    facts = second_brake_sample(facts, sources, settings.thermal)
    verdict = evaluate(facts, settings, scope=scope)
    duration_ms = (time.perf_counter() - started) * 1000
    if log_level != "error":
        from slurmgpu import log

        log.configure(log_level, lean=True)
        log.log_verdict(verdict, phase="check")
    if as_json:
        document = verdict_json(verdict, facts.to_json(), scope, duration_ms)
        # Fresh dicts and lists, a tree: no reference cycle for json to look for.
        print(json.dumps(document, indent=2, check_circular=False), flush=True)
    else:
        print(render_table(verdict, show_all=show_all, duration_ms=duration_ms), flush=True)
    from slurmgpu.sources.deadline import leave_if_stuck

    leave_if_stuck(verdict.severity.exit_code)
    return verdict.severity.exit_code




def verdict_json(verdict: Verdict, facts: dict[str, Any], scope: frozenset[int] | None,
                 duration_ms: float) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "node": verdict.node,
        "verdict": verdict.severity.name,
        "exit_code": verdict.severity.exit_code,
        "gpus": sorted(scope) if scope is not None else None,
        "findings": [f.to_json() for f in verdict.findings],
        "facts": facts,
        "duration_ms": round(duration_ms, 2),
    }


def _where(f: Finding) -> str:
    if f.gpu is not None:
        return f"gpu{f.gpu}"
    return f.subject or "-"


def render_table(verdict: Verdict, *, show_all: bool, duration_ms: float) -> str:
    order = sorted(verdict.findings, key=lambda f: (-f.severity.rank, f.check, f.gpu or -1))
    shown = [f for f in order if show_all or f.severity is not Severity.OK]
    checks = {f.check for f in verdict.findings}
    na = sorted({f.check for f in verdict.findings if f.not_applicable})
    lines = []
    if shown:
        width = max(len(f.check) for f in shown)
        lines.append(f"{'SEVERITY':<8}  {'CHECK':<{width}}  {'WHERE':<10}  MESSAGE")
        for f in shown:
            shown_as = "N/A" if f.not_applicable else f.severity.name
            lines.append(f"{shown_as:<8}  {f.check:<{width}}  {_where(f):<10}  {f.message}")
        lines.append("")
    counts = {s: sum(1 for f in verdict.findings if f.severity is s) for s in Severity}
    lines.append(
        f"{verdict.node}: {verdict.severity.name} - {len(checks)} checks, "
        f"{counts[Severity.FAIL]} fail, {counts[Severity.WARN]} warn, {counts[Severity.UNKNOWN]} unknown "
        f"({len(na)} not applicable) in {duration_ms:.0f} ms"
    )
    return "\n".join(lines)
