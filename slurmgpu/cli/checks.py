"""`slurmgpu check` and `slurmgpu checks list`.

The `check` command is click's face (help, man page, in-process callers) of
``slurmgpu.cli.checkrun.run_check``, which the real entry point runs without click."""

from __future__ import annotations

import json

import click

from slurmgpu.cli.checkrun import run_check
from slurmgpu.cli.common import config_option, json_option, load_settings


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
    return run_check(config_file, gpus, node, xids, as_json=as_json, show_all=show_all,
                     log_level=log_level)


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
