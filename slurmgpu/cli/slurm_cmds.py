"""Slurm-facing commands: the prolog/epilog/healthcheck hooks and drain/resume/nodes."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from slurmgpu.cli.common import config_option, json_option, load_settings
from slurmgpu.config.schema import Settings
from slurmgpu.errors import SlurmGpuError


def _settings(config_file: str | None, node: str | None) -> Settings:
    return load_settings(config_file, node=node, known_checks=True).settings


def _client(settings: Settings) -> Any:
    from slurmgpu.slurm.factory import make_client

    return make_client(settings.slurm, env=os.environ)


def _hook(phase: str, config_file: str | None) -> int:
    try:
        from slurmgpu import log
        from slurmgpu.gate import Watchdog

        log.configure("info", json=True)
    except Exception as exc:  # a missing dependency, a broken module: no verdict possible
        return _cannot_start(phase, config_file, f"{type(exc).__name__}: {exc}")
    # The config itself may hang (a stuck NFS home, a huge hostlist): bound it with the
    # packaged default timeout and policy until the site's are known.
    timeout = float(getattr(getattr(Settings(), phase, None), "timeout_s", 30.0))
    with Watchdog(timeout, lambda step: os._exit(_hook_failed(phase, config_file, "watchdog: loading "
                                                             f"the config exceeded {timeout:g} s"))):
        try:
            gate = _make_gate(config_file)
        except (ImportError, SyntaxError) as exc:  # a broken install, as above
            return _cannot_start(phase, config_file, f"{type(exc).__name__}: {exc}")
        except SlurmGpuError as exc:  # a bad config must not drain the cluster
            return _hook_failed(phase, config_file, f"config: {exc}")
        except Exception as exc:  # nor a bug before the gate runs (the gate catches its own)
            return _hook_failed(phase, config_file, f"setup: {type(exc).__name__}: {exc}")
    try:
        code = int(getattr(gate, phase)())
    except Exception as exc:  # a bug outside the gate's own guards: a FAIL verdict stands
        if gate.verdict is not None and gate.verdict.severity.name == "FAIL":
            return 1
        return _hook_failed(phase, config_file, f"{phase}: {type(exc).__name__}: {exc}")
    from slurmgpu.sources.deadline import leave_if_stuck

    leave_if_stuck(code)  # a hung GPU's gather thread must not hold the hook's exit
    return code


def _make_gate(config_file: str | None) -> Any:
    from slurmgpu.cli import versions_cache
    from slurmgpu.engine import source_facts, system_sources
    from slurmgpu.gate import Gate, job_context
    from slurmgpu.quickgate import tell_decided

    settings = _settings(config_file, job_context(os.environ).node)
    # The sources the gate would make itself, plus the versions cache in the state dir.
    sources = system_sources(settings, versions_cache=versions_cache(settings))
    return Gate(settings, os.environ, lambda: _client(settings),
                facts=source_facts(sources, settings, os.environ), on_decided=tell_decided)


def _cannot_start(phase: str, config_file: str | None, error: str) -> int:
    """slurmgpu cannot even start here (an import failed). Run by the quick client: say
    why on stderr and exit CANNOT_START, undecided (it tries another interpreter, then
    follows on_error itself); else follow on_error with the quick client's own line."""
    from slurmgpu import quickgate

    if os.environ.get(quickgate.DECIDED_FD_ENV):
        sys.stderr.write(f"slurmgpu cannot start with {sys.executable}: {error}\n")
        return quickgate.CANNOT_START
    args = ["--config", config_file] if config_file else []
    return quickgate.cannot_run(phase, args, os.environ, error)


def _hook_failed(phase: str, config_file: str | None, error: str) -> int:
    """The hook cannot judge the node (its own config is broken): follow ``[<phase>]
    on_error`` as far as the file still says it (read leniently), else the packaged
    default (fail-open). Fail-open exits 0 with one loud line; fail-closed refuses the job
    (exit 1: Slurm drains the node, as the admin asked). The healthcheck says UNKNOWN."""
    from slurmgpu import log
    from slurmgpu.quickgate import tell_decided

    policy = _lenient_on_error(phase, config_file)
    if phase == "healthcheck":
        code, action = 3, "none"
    else:
        code, action = (0, "fail-open") if policy == "fail-open" else (1, "fail-closed")
    log.get_logger().error(f"{phase}_decision", phase=phase, action=action, error=error,
                           node=os.environ.get("SLURMD_NODENAME"), job=os.environ.get("SLURM_JOB_ID"))
    tell_decided(action)
    return code


def _lenient_on_error(phase: str, config_file: str | None) -> str:
    """``[<phase>] on_error`` from the raw TOML when it is readable and valid there."""
    import tomllib

    from slurmgpu.config.load import MAX_CONFIG_BYTES, config_path

    default = getattr(Settings(), phase, None)
    fallback = str(getattr(default, "on_error", "fail-open"))
    try:
        path, _ = config_path(config_file)
        with open(path, "rb") as f:
            raw = tomllib.loads(f.read(MAX_CONFIG_BYTES).decode("utf-8"))
        value = raw.get(phase, {}).get("on_error")
    except Exception:  # unreadable, not TOML, not a table: the packaged default
        return fallback
    return value if value in ("fail-open", "fail-closed") else fallback


@click.command()
@config_option
def prolog(config_file: str | None) -> int:
    """Slurm Prolog: gate the job on the health of the GPUs it was given.

    Reads SLURMD_NODENAME, SLURM_JOB_ID and SLURM_JOB_GPUS (or CUDA_VISIBLE_DEVICES).
    Exit 0: the job may start (OK, WARN, or an internal error under fail-open).
    Exit 1: a check failed; the node is drained with a 'slurmgpu:' reason and Slurm
    requeues the job.
    """
    return _hook("prolog", config_file)


@click.command()
@config_option
def epilog(config_file: str | None) -> int:
    """Slurm Epilog: re-check the job's GPUs, catch faults that appeared during the job
    (XIDs, ECC, row remaps), report stray processes, record a per-job GPU summary, and
    drain the node when it is now bad. Exit 1 only when a needed drain could not be done
    (Slurm then drains the node itself)."""
    return _hook("epilog", config_file)


@click.command()
@config_option
def healthcheck(config_file: str | None) -> int:
    """Slurm HealthCheckProgram: check the whole node; drain on FAIL; resume a node that
    slurmgpu drained once it is healthy (never an operator's drain, never a rebooting
    node, never a drain for an XID). Exit code is the verdict (0 OK .. 3 UNKNOWN)."""
    return _hook("healthcheck", config_file)


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
    from slurmgpu.cli.fleet_cmd import automation_status_of

    settings = _settings(config_file, None)
    rows = [n for n in _client(settings).nodes() if n.drained and (show_all or n.owned_by_slurmgpu)]
    resumers = outlook.resumers(settings, automation_status_of(config_file), os.environ) if rows else None
    back = {n.name: outlook.outlook(n, resumers) for n in rows if resumers is not None}
    if as_json:
        click.echo(json.dumps([{"node": n.name, "state": n.state, "flags": sorted(n.flags),
                                "reason": n.reason, "reason_user": n.reason_user,
                                "since": n.reason_time, "slurmgpu": n.owned_by_slurmgpu,
                                "comes_back": back.get(n.name)} for n in rows], indent=2))
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


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"node": result.node, "action": result.action, "reason": result.reason}))
    else:
        click.echo(f"{result.node}: {result.action}" + (f" ({result.reason})" if result.reason else ""))
