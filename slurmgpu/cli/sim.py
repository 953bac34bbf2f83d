"""`slurmgpu sim`: build the fake NVML library, list/show scenarios, run commands under one.

Module imports stay light: pynvml and the build machinery are imported inside commands.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from slurmgpu.cli.common import (
    CliError,
    config_option,
    first_line,
    json_option,
    load_settings,
    os_error,
)
from slurmgpu.errors import SlurmGpuError

EXIT_ERROR = 3
EXIT_NOT_FOUND = 127

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(fn: F) -> F:
    """A slurmgpu or OS error as a CliError (one line on stderr, exit 3), so that the
    group says so in one line even when run on its own, not under the root."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SlurmGpuError as exc:
            raise CliError(first_line(exc)) from None
        except OSError as exc:
            raise os_error(exc) from None

    return wrapper  # type: ignore[return-value]


@click.group("sim", context_settings={"help_option_names": ["-h", "--help"]})
def sim() -> None:
    """GPU simulator: a fake libnvidia-ml.so.1 driven by JSON scenarios.

    The real pynvml code path runs against the fake, so checks can be exercised on a
    machine without GPUs. See docs/simulator.md.
    """


@sim.command("build")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for libnvidia-ml.so.1 (default: $SLURMGPU_SIM_DIR or a cache dir).")
@click.option("--force", is_flag=True, help="Rebuild even when the library is up to date.")
@json_option("Print {\"library\": PATH} as JSON.")
@_one_line_errors
def build_cmd(dest: Path | None, force: bool, as_json: bool) -> None:
    """Compile the fake NVML library and print its path."""
    from slurmgpu.sim.build import build_library

    lib = build_library(dest, force=force)
    click.echo(json.dumps({"library": str(lib)}) if as_json else str(lib))


@sim.command("list")
@json_option("Print a JSON list of {name, description}.")
@_one_line_errors
def list_cmd(as_json: bool) -> None:
    """List the bundled scenarios."""
    from slurmgpu.sim.scenario import list_scenarios

    items = list_scenarios()
    if as_json:
        click.echo(json.dumps([{"name": n, "description": d} for n, d in items], indent=2))
        return
    width = max((len(n) for n, _ in items), default=0)
    for name, desc in items:
        click.echo(f"{name:<{width}}  {desc}")


@sim.command("show")
@click.argument("name")
@_one_line_errors
def show_cmd(name: str) -> None:
    """Print scenario NAME (bundled name or JSON file path) as JSON."""
    from slurmgpu.sim.scenario import dump_scenario, load_scenario

    click.echo(dump_scenario(load_scenario(name)), nl=False)


@sim.command("env")
@click.argument("name")
@_one_line_errors
def env_cmd(name: str) -> None:
    """Print export lines for scenario NAME: eval "$(slurmgpu sim env NAME)"."""
    from slurmgpu.sim.scenario import sim_environment

    for key, value in sim_environment(name).items():
        click.echo(f"export {key}={shlex.quote(value)}")


@sim.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--scenario", "-s", required=True, help="Bundled scenario name or JSON file path.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_one_line_errors
def run_cmd(scenario: str, command: tuple[str, ...]) -> None:
    """Run COMMAND with the fake NVML library and a scenario: sim run -s NAME -- CMD ARGS...

    Sets SLURMGPU_NVML_LIBRARY and SLURMGPU_SIM_SCENARIO, and puts the fake's directory first
    on LD_LIBRARY_PATH so any program that dlopens libnvidia-ml.so.1 gets the fake.
    """
    from slurmgpu.sim.scenario import ENV_LIBRARY, sim_environment

    env = dict(os.environ)
    env.update(sim_environment(scenario))
    lib_dir = str(Path(env[ENV_LIBRARY]).parent)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{lib_dir}{os.pathsep}{old}" if old else lib_dir
    program = command[0]
    if shutil.which(program, path=env.get("PATH")) is None:
        raise CliError(f"command not found: {program}", EXIT_NOT_FOUND)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(program, list(command), env)
    except OSError as exc:
        raise CliError(f"cannot run {program}: {exc.strerror or exc}", EXIT_NOT_FOUND) from None


@sim.command("record")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the scenario to FILE (atomically) instead of stdout.")
@click.option("--name", default=None, help="Scenario name (default: the host name).")
@click.option("--description", default=None, help="Scenario description.")
@_one_line_errors
def record_cmd(out: Path | None, name: str | None, description: str | None) -> None:
    """Record this node's NVML state as a scenario (honours SLURMGPU_NVML_LIBRARY)."""
    from slurmgpu.sim.record import record_node
    from slurmgpu.sim.scenario import dump_scenario, write_scenario

    data = record_node(name=name, description=description)
    if out is None:
        click.echo(dump_scenario(data), nl=False)
    else:
        write_scenario(out, data)


@sim.command("report-seed")
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Fleet database to create (must be new or empty).")
@click.option("--nodes", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--days", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True)
@click.option("--seed", "seed_", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--end", default=None, help="End of the history: ISO 8601 time or Unix seconds "
                                          "(default: the current hour).")
@json_option("Print the summary as JSON.")
@_one_line_errors
def report_seed_cmd(db_path: Path, nodes: int, days: float, seed_: int, end: str | None,
                    as_json: bool) -> None:
    """Fill a fleet database with a simulated month (demo and benchmark of `slurmgpu report`),
    the automation's state (two lemon nodes) included."""
    from datetime import datetime

    from slurmgpu.sim.seed import seed

    end_ts: float | None = None
    if end is not None:
        try:
            end_ts = float(end)
        except ValueError:
            try:
                end_ts = datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise CliError(f"--end: not an ISO 8601 time or Unix seconds: {end!r}") from None
    summary = seed(db_path, nodes, days, end=end_ts, seed=seed_)
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    rows = summary["rows"]
    click.echo(f"{summary['db']}: {nodes} nodes x {days:g} days in {summary['seconds']:.2f} s "
               f"({sum(rows.values())} rows)")
    for table, count in rows.items():
        click.echo(f"  {table:<15} {count}")
    click.echo(f"lemons: {', '.join(summary['lemons']) or '-'}; drifted: {len(summary['drifted'])}; "
               f"drained at the end: {len(summary['drained_at_end'])}")


@sim.command("fleet")
@config_option
@click.option("--nodes", "count", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0), default=1 / 15, show_default="1/15",
              help="Reports per second per node; 0: as fast as --window allows.")
@click.option("--window", type=click.IntRange(1, 10_000), default=16, show_default=True,
              help="With --rate 0: unacknowledged reports allowed per node.")
@click.option("--duration", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option("--address", default=None, help="Collector endpoint (collector.address).")
@click.option("--keys-dir", default=None,
              help="The collector's keys dir: node keys are allow-listed in its nodes/.")
@click.option("--prefix", default="sim", show_default=True, help="Node name prefix.")
@click.option("--connect-timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for every node's hello to be acked.")
@json_option("Print the rates as JSON.")
def fleet_sim(config_file: str | None, count: int, rate: float, window: int, duration: float,
              address: str | None, keys_dir: str | None, prefix: str, connect_timeout: float,
              as_json: bool) -> None:
    """Simulate N agents sending reports to a collector and print the send/ack rates.

    The node keys are written to the collector's allow-list; a collector that is
    already running picks them up within 30 s (or at once on SIGHUP).
    """
    from slurmgpu.sim import fleet as simfleet

    settings = load_settings(config_file, flags={"collector.address": address,
                                                 "collector.keys_dir": keys_dir}).settings.collector
    nodes = simfleet.make_nodes(settings.keys_dir, count, prefix=prefix)
    click.echo(f"allow-listed {count} simulated nodes in {settings.keys_dir}/nodes "
               "(a running collector needs SIGHUP or up to 30 s)", err=True)
    server_key = simfleet.collector_public_key(settings.keys_dir)
    with simfleet.SimFleet(settings.addresses[0], server_key, nodes) as agents:
        connected = agents.hello(connect_timeout)
        if connected < count:
            click.echo(f"only {connected}/{count} nodes connected within {connect_timeout}s", err=True)
        stats = agents.run(duration, rate or None, window=window)
        stats.connected = connected
    summary = stats.summary()
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"nodes {summary['nodes']} (connected {connected}), sent {stats.sent} "
                   f"({summary['send_rate']}/s), acked {stats.acked} ({summary['ack_rate']}/s), "
                   f"ack latency p50 {summary['ack_p50_ms']} ms p99 {summary['ack_p99_ms']} ms")
    if stats.acked < stats.sent:
        sys.exit(1)


# ------------------------------------------------------------------ sim cluster

_dir_option = click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Cluster directory (default: $SLURMGPU_CLUSTER_DIR, else /tmp/slurmgpu-cluster).",
)


def _cluster(directory: Path | None) -> Any:
    from slurmgpu.sim.cluster import SimCluster

    return SimCluster(directory)


def _existing_cluster(directory: Path | None) -> Any:
    """The cluster in --dir, else the default one, else the demo's; ClusterError when none."""
    from slurmgpu.sim.cluster import ClusterError, SimCluster, find_cluster

    if directory is not None:
        c = SimCluster(directory)
        if not c.nodes:
            raise ClusterError(f"no simulated cluster in {c.dir} (start one: slurmgpu sim cluster up "
                               f"--dir {shlex.quote(str(c.dir))})")
        return c
    return find_cluster()


@sim.group("cluster")
def cluster() -> None:
    """A real Slurm mini-cluster on this machine (root, no systemd): one slurmctld, one
    slurmd per simulated node, each node's GPUs a simulator scenario.

    \b
    slurmgpu sim cluster up --nodes 4 --gpus 8
    eval "$(slurmgpu sim cluster env)"; sinfo
    sbatch --gres=gpu:2 --wrap 'echo "GPUs $CUDA_VISIBLE_DEVICES on $SLURMD_NODENAME"'
    slurmgpu sim cluster inject gpu-n2 fault-ecc-dbe
    slurmgpu sim cluster down

    See docs/simcluster.md.
    """


@cluster.command("up")
@click.option("--nodes", "-n", type=int, default=4, show_default=True, help="Number of nodes.")
@click.option("--gpus", "-g", type=int, default=8, show_default=True, help="GPUs per node.")
@click.option("--scenario", "-s", default="h100-sxm-8", show_default=True,
              help="Bundled scenario name or JSON file every node starts from.")
@click.option("--hooks/--no-hooks", default=True, show_default=True,
              help="Prolog/Epilog/HealthCheck run slurmgpu (or just exit 0).")
@click.option("--agents/--no-agents", default=None,
              help="Also run a collector and one slurmgpu agent per node, with generated "
                   "CURVE keys [default: agents on a fresh cluster; a running one keeps "
                   "its choice].")
@click.option("--automation/--no-automation", default=None,
              help="Run the collector with [automation] enabled: it drains and resumes nodes "
                   "and asks jobs to checkpoint (the defaults allow it on a 3-4 node "
                   "cluster) [default: a running cluster keeps its choice; off on a fresh one].")
@click.option("--dry-run", is_flag=True,
              help="With --automation: record every decision, make no Slurm call.")
@click.option("--installed-hooks", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="DIR",
              help="slurm.conf's hooks run the wrappers a package installed in DIR "
                   "(/usr/libexec/slurmgpu), which find slurmgpu as on a real node "
                   "[default: this installation's].")
@click.option("--slurm-prefix", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="PREFIX",
              help="Run the Slurm that tools/build_slurm.sh built into PREFIX "
                   "[default: Debian's packages, installed if missing].")
@click.option("--timeout", type=float, default=60, show_default=True,
              help="Seconds to wait for every node to be idle (and every agent ready).")
@_dir_option
@json_option("Print the status as JSON.")
@_one_line_errors
def cluster_up(nodes: int, gpus: int, scenario: str, hooks: bool, agents: bool | None,
               automation: bool | None, dry_run: bool, installed_hooks: Path | None,
               slurm_prefix: Path | None, timeout: float, directory: Path | None,
               as_json: bool) -> None:
    """Install Slurm if needed, write the configs and start the daemons (idempotent)."""
    import time

    if dry_run and not automation:
        raise click.UsageError("--dry-run needs --automation")
    if automation and agents is False:
        raise click.UsageError("--automation needs the agents and the collector (drop --no-agents)")
    started = time.monotonic()
    c = _cluster(directory)
    c.up(nodes=nodes, gpus=gpus, scenario=scenario, hooks_enabled=hooks, timeout=timeout,
         agents=True if automation else agents, installed_hooks=installed_hooks,
         slurm_prefix=slurm_prefix)
    if automation is not None:
        wanted = ("dry_run = true" if dry_run else "") if automation else None
        if c.automation_settings() != wanted:
            c.set_automation(wanted)
    status = c.status()
    status["elapsed_s"] = round(time.monotonic() - started, 2)
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    agents_text = (f", {len(c.nodes)} agents + collector at {status['collector']['address']}"
                   if status["agents"] else "")
    wanted_now = c.automation_settings()
    if wanted_now is not None:
        agents_text += ", automation on" + (" (dry run)" if "dry_run = true" in wanted_now else "")
    if c.installed_hooks is not None:
        agents_text += f", hooks from {c.installed_hooks}"
    click.echo(f"cluster up in {c.dir}: {len(c.nodes)} nodes x {c.gpus} GPUs, "
               f"Slurm {status['slurm_version']}{agents_text} ({status['elapsed_s']} s)")
    env_hint = f" --dir {shlex.quote(str(c.dir))}" if directory is not None else ""
    click.echo(f'use it: eval "$(slurmgpu sim cluster env{env_hint})"')


@cluster.command("down")
@click.option("--purge", is_flag=True, help="Also remove the cluster directory.")
@_dir_option
@_one_line_errors
def cluster_down(purge: bool, directory: Path | None) -> None:
    """Stop the cluster's own daemons (by their recorded PIDs); idempotent."""
    c = _cluster(directory)
    stopped = c.running_daemons()
    c.down(purge=purge)
    done = f"stopped {', '.join(stopped)}" if stopped else "nothing was running"
    click.echo(f"{c.dir}: {done}" + ("; directory removed" if purge and not c.dir.exists() else ""))


@cluster.command("status")
@_dir_option
@json_option("Print the status as JSON.")
@_one_line_errors
def cluster_status(directory: Path | None, as_json: bool) -> None:
    """Daemons and node states. Exit 0 when the cluster is up, 1 otherwise."""
    status = _cluster(directory).status()
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        click.echo(_render_status(status))
    sys.exit(0 if status["up"] else 1)


def _render_status(status: dict[str, Any]) -> str:
    if not status["exists"]:
        return f"no simulated cluster in {status['dir']}"
    word = "up" if status["up"] else "DOWN"
    lines = [f"cluster {status['dir']}: {word} (Slurm {status['slurm_version']}, "
             f"{len(status['nodes'])} nodes x {status['gpus']} GPUs, "
             f"scenario {status['scenario']}, hooks {'on' if status['hooks_enabled'] else 'off'})"]
    daemons = ["munged", "slurmctld"] + (["collector"] if status.get("agents") else [])
    for daemon in daemons:
        info = status[daemon]
        extra = f" {info['address']}" if daemon == "collector" and info["running"] else ""
        lines.append(f"{daemon:<10} {'running pid ' + str(info['pid']) if info['running'] else 'stopped'}"
                     f"{extra}")
    agents = bool(status.get("agents"))
    lines.append(f"{'NODE':<10} {'STATE':<12} {'SLURMD':<34}{' AGENT' if agents else ''}")
    for node in status["nodes"]:
        slurmd = f"running pid {node['slurmd_pid']}" if node["slurmd_running"] else "stopped"
        agent = ""
        if agents:
            agent = f" running pid {node['agent_pid']}" if node.get("agent_running") else " stopped"
        lines.append(f"{node['name']:<10} {node['state']:<12} {slurmd + ' port ' + str(node['port']):<34}"
                     f"{agent}")
    return "\n".join(lines)


@cluster.command("env")
@_dir_option
@_one_line_errors
def cluster_env(directory: Path | None) -> None:
    """Print export lines for Slurm clients and slurmgpu's fleet commands:
    eval "$(slurmgpu sim cluster env)" (SLURM_CONF, and SLURMGPU_CONFIG: the head node's
    config, so `fleet`, `report`, `breaker` and `jobs events` read this cluster)."""
    from slurmgpu.sim.cluster import path_additions, prefix_dirs

    c = _existing_cluster(directory)
    for key, value in c.shell_env().items():
        if key == "PATH":  # keep the shell's own PATH: a Slurm prefix first, what is missing last
            first = "".join(f"{shlex.quote(p)}:" for p in prefix_dirs(c.slurm_prefix))
            last = "".join(f":{p}" for p in path_additions())
            click.echo(f'export PATH={first}"$PATH"{last}')
        else:
            click.echo(f"export {key}={shlex.quote(value)}")


@cluster.command("inject")
@click.argument("node")
@click.argument("scenario")
@_dir_option
@_one_line_errors
def cluster_inject(node: str, scenario: str, directory: Path | None) -> None:
    """Swap NODE's simulated GPUs for SCENARIO (bundled name or JSON file), atomically."""
    _cluster(directory).inject(node, scenario)


@cluster.command("inject-xid")
@click.argument("node")
@click.argument("gpu", type=int)
@click.argument("xid", type=int)
@_dir_option
@_one_line_errors
def cluster_inject_xid(node: str, gpu: int, xid: int, directory: Path | None) -> None:
    """Log XID on NODE's GPU: a kernel-log record and an NVML event in its scenario."""
    _cluster(directory).inject_xid(node, gpu, xid)
