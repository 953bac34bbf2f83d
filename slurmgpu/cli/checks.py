"""`slurmgpu check` and `slurmgpu checks list`."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from slurmgpu.cli.common import config_option, json_option, load_settings
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


@click.command()
@config_option
@click.option("--gpus", metavar="LIST", help="Check only these GPU indices, e.g. 0,2 or 0-3 (a job's GPUs).")
@click.option("--node", metavar="NAME", help="Node name for host-targeted config (default: this host).")
@click.option("--xid", "xids", multiple=True, metavar="XID[:GPU[:MESSAGE]]",
              help="Treat this XID as recently seen (repeatable); judged by the XID policy table. "
                   "MESSAGE: the driver's text after the code (some XIDs' action depends on it).")
@json_option("Print the verdict, findings and facts as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also list OK and not-applicable findings.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="error",
              show_default=True,
              help="Log one canonical line per check result to stderr at this level (info: every result).")
def check(config_file: str | None, gpus: str | None, node: str | None, xids: tuple[str, ...],
          as_json: bool, show_all: bool, log_level: str) -> int:
    """Check this node's GPUs, InfiniBand and software versions.

    XIDs: those given with --xid and those the kernel log holds since the last job on
    these GPUs ended (at most [xid] kernel_log_lookback_s back).

    Exit code: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN (a check could not run, or bad
    arguments/config).
    """
    from slurmgpu.cli import versions_cache
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
    if log_level != "error":  # structlog is only imported when someone wants the lines
        from slurmgpu import log

        log.configure(log_level)
        log.log_verdict(verdict, phase="check")
    if as_json:
        click.echo(json.dumps(verdict_json(verdict, facts.to_json(), scope, duration_ms), indent=2))
    else:
        click.echo(render_table(verdict, show_all=show_all, duration_ms=duration_ms))
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


@click.group()
def checks() -> None:
    """Inspect the registered checks."""


@checks.command("list")
@json_option("Print as JSON.")
@click.option("--no-plugins", "no_plugins", is_flag=True,
              help="Built-in checks only: load no site plugin (as [checks] plugins = false).")
def checks_list(as_json: bool, no_plugins: bool) -> None:
    """List every check: id, worst default severity, source (built-in, or the site
    plugin's entry point and distribution), the facts it reads."""
    from slurmgpu.checks.registry import all_checks

    specs = all_checks(plugins=not no_plugins)
    if as_json:
        click.echo(json.dumps([{"id": s.id, "severity": s.severity.name, "reads": list(s.reads),
                                "summary": s.summary, "source": "built-in" if s.origin is None else "plugin",
                                "entry_point": s.origin.to_json() if s.origin else None}
                               for s in specs], indent=2))
        return
    width = max(len(s.id) for s in specs)
    source_width = max(len(s.source) for s in specs)
    click.echo(f"{'CHECK':<{width}}  {'SEVERITY':<8}  {'SOURCE':<{source_width}}  WHAT IT CHECKS (READS)")
    for s in specs:
        click.echo(f"{s.id:<{width}}  {s.severity.name:<8}  {s.source:<{source_width}}  "
                   f"{s.summary} ({', '.join(s.reads)})")


@checks.command("xids")
@config_option
@click.option("--node", metavar="NAME", help="Node name for host-targeted config (default: this host).")
@json_option("Print as JSON.")
def checks_xids(config_file: str | None, node: str | None, as_json: bool) -> None:
    """The XID policy table in effect: each code's action, NVIDIA's immediate action, and
    where slurmgpu deviates (and why); message variants per code."""
    from slurmgpu.engine import node_name
    from slurmgpu.xid import XidPolicy

    settings = load_settings(config_file, node=node or node_name()).settings
    rules = XidPolicy(settings.xid.overrides, settings.xid.unknown_action).rows()
    if as_json:
        click.echo(json.dumps([{
            "xid": r.code, "name": r.name, "category": r.category, "action": r.action, "origin": r.origin,
            "nvidia": r.nvidia, "deviation": r.deviation,
            "variants": [{"pattern": v.pattern.pattern, "action": v.action, "nvidia": v.nvidia}
                         for v in r.variants]} for r in rules], indent=2))
        return
    click.echo(f"{'XID':>4}  {'ACTION':<10}  {'NVIDIA':<20}  NAME")
    for r in rules:
        note = " (site override)" if r.origin != "catalog" else (" *" if r.deviation else "")
        variants = f" [+{len(r.variants)} by message]" if r.variants else ""
        click.echo(f"{r.code:>4}  {r.action:<10}  {(r.nvidia or '-'):<20}  {r.name}{note}{variants}")
    click.echo("\n* slurmgpu deviates from NVIDIA's immediate action; --json says why.")
