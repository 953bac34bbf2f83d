"""Slurm-facing commands: the prolog/epilog/healthcheck hooks and drain/resume/nodes.

The hooks' click commands are for `--help`, man pages and in-process callers; they run
``slurmgpu.cli.hooks.run_hook``, as the real entry point does without click
(``slurmgpu.cli.oneshot``)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from slurmgpu.cli.common import config_option, json_option
from slurmgpu.cli.hooks import _client, _settings, run_hook


@click.command()
@config_option
def prolog(config_file: str | None) -> int:
    """Slurm Prolog: gate the job on the health of the GPUs it was given.

    Reads SLURMD_NODENAME, SLURM_JOB_ID and SLURM_JOB_GPUS (or CUDA_VISIBLE_DEVICES).
    Exit 0: the job may start (OK, WARN, or an internal error under fail-open).
    Exit 1: a check failed; the node is drained with a 'slurmgpu:' reason and Slurm
    requeues the job.
    """
    return run_hook("prolog", config_file)


@click.command()
@config_option
def epilog(config_file: str | None) -> int:
    """Slurm Epilog: re-check the job's GPUs, catch faults that appeared during the job
    (XIDs, ECC, row remaps), report stray processes, record a per-job GPU summary, and
    drain the node when it is now bad. Exit 1 only when a needed drain could not be done
    (Slurm then drains the node itself)."""
    return run_hook("epilog", config_file)


@click.command()
@config_option
def healthcheck(config_file: str | None) -> int:
    """Slurm HealthCheckProgram: check the whole node; drain on FAIL; resume a node that
    slurmgpu drained once it is healthy (never an operator's drain, never a rebooting
    node, never a drain for an XID). Exit code is the verdict (0 OK .. 3 UNKNOWN)."""
    return run_hook("healthcheck", config_file)


@click.command()
@click.argument("node")
@click.option("--reason", required=True,
              help="Why; stored as 'slurmgpu: <reason> [by operator <you>]'.")
@config_option
@json_option("Print the result as JSON.")
def drain(node: str, reason: str, config_file: str | None, as_json: bool) -> None:
    """Drain NODE with a slurmgpu-owned reason (an operator's drain is left as it is).
    The reason ends with "[by operator <login>]" ($SUDO_USER under sudo), which the
    collector records as who drained the node (the fleet report's drains)."""
    from slurmgpu.actions import Actions

    settings = _settings(config_file, node)
    result = Actions(_client(settings), settings.paths.state_dir).drain(
        node, reason, actor="operator", user=_operator())
    _print_result(result, as_json)


def _operator() -> str | None:
    """The login of whoever runs the command: the one behind sudo when under sudo."""
    import getpass

    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):  # no user name to be found
        return None


@click.command()
@click.argument("node")
@click.option("--force", is_flag=True, help="Also resume a node someone else drained.")
@config_option
@json_option("Print the result as JSON.")
def resume(node: str, force: bool, config_file: str | None, as_json: bool) -> None:
    """Resume NODE if slurmgpu drained it (any drained node with --force)."""
    from slurmgpu.actions import Actions
    from slurmgpu.decision import Outcome

    settings = _settings(config_file, node)
    result = Actions(_client(settings), settings.paths.state_dir).resume(node, force=force)
    _print_result(result, as_json)
    if result.action == Outcome.OPERATOR_DRAIN_KEPT:
        click.echo(f"slurmgpu: {node} was drained by someone else ({result.reason}); use --force",
                   err=True)
        sys.exit(1)


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Show every drained node, not only slurmgpu's.")
@config_option
@json_option("Print as JSON.")
def nodes(show_all: bool, config_file: str | None, as_json: bool) -> None:
    """Nodes drained by slurmgpu: state, reason, since when."""
    from slurmgpu.cli import outlook
    from slurmgpu.cli.fleet_cmd import automation_status_of, ladders_of

    settings = _settings(config_file, None)
    rows = [n for n in _client(settings).nodes() if n.drained and (show_all or n.owned_by_slurmgpu)]
    resumers = outlook.resumers(settings, automation_status_of(config_file), os.environ) if rows else None
    back = {n.name: outlook.outlook(n, resumers) for n in rows if resumers is not None}
    ladders = ladders_of(config_file) if rows else {}
    if as_json:
        click.echo(json.dumps([{"node": n.name, "state": n.state, "flags": sorted(n.flags),
                                "reason": n.reason, "reason_user": n.reason_user,
                                "since": n.reason_time, "slurmgpu": n.owned_by_slurmgpu,
                                "comes_back": back.get(n.name),
                                "ladder": ladders[n.name].to_json() if n.name in ladders else None}
                               for n in rows], indent=2))
        return
    if not rows:
        click.echo("no nodes drained by slurmgpu" if not show_all else "no drained nodes")
        return
    click.echo(f"{'NODE':<16} {'STATE':<14} {'SINCE':<20} REASON")
    for n in rows:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n.reason_time)) if n.reason_time else "-"
        state = n.state + "".join(f"+{f}" for f in sorted(n.flags))
        click.echo(f"{n.name:<16} {state:<14} {since:<20} {n.reason or ''}")
        click.echo(f"{'':<16} -> {back.get(n.name)}")
        if n.name in ladders:
            click.echo(f"{'':<16} -> return to service: {ladders[n.name].text(time.time())}")


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"node": result.node, "action": result.action, "reason": result.reason}))
    else:
        click.echo(f"{result.node}: {result.action}" + (f" ({result.reason})" if result.reason else ""))
