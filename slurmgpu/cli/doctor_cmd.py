"""`slurmgpu doctor`: check an installation and say what to fix (slurmgpu.doctor)."""

from __future__ import annotations

import json
from collections import Counter

import click

from slurmgpu.cli.common import config_option, json_option
from slurmgpu.doctor.model import Finding, Level

ROLES = ("auto", "node", "head")


@click.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option("--slurm-conf", "slurm_conf", metavar="FILE",
              help="slurm.conf to check (default: $SLURM_CONF, then /etc/slurm/slurm.conf, "
                   "then /etc/slurm-llnl/slurm.conf).")
@click.option("--role", type=click.Choice(ROLES), default="auto", show_default=True,
              help="node: a GPU node (agent, hooks, NVML); head: the collector's host. auto: head "
                   "where the collector's keypair is in the keys directory, else node.")
@click.option("--node", metavar="NAME",
              help="This node's Slurm name (default: $SLURMD_NODENAME, then the short hostname).")
@click.option("--keys-dir", metavar="DIR",
              help="CURVE keys (default: [collector] keys_dir; $SLURMGPU_KEYS_DIR).")
@json_option("Print a JSON list of {check, severity, message, fix}.")
@click.pass_context
def doctor(ctx: click.Context, config_file: str | None, slurm_conf: str | None, role: str,
           node: str | None, keys_dir: str | None, as_json: bool) -> None:
    """Check this host's slurmgpu installation and say what to fix, one line per problem.

    Checks the config file, the CURVE keys and their modes, slurm.conf (Prolog, Epilog,
    PrologFlags=Alloc, TaskProlog, JobRequeue, HealthCheckProgram) and the programs it
    names, slurmctld (scontrol ping), NVML and [gpu] count, the agent's socket, the
    collector (CURVE handshake and a heartbeat), the state/spool directories and the
    clock against the collector's. Nothing is changed: the Prolog, Epilog and health
    check are never run (they drain nodes); the TaskProlog is.

    Each finding is OK, WARN, FAIL or SKIP (not applicable here) with a one-line fix;
    docs/troubleshooting.md explains every message.

    \b
    Exit status (the worst finding):
      0  every check OK or SKIP
      1  a WARN
      2  a FAIL
      3  the config file is invalid (as for every command), or a bad option
    """
    from slurmgpu.cli.agent_cmd import default_node_name
    from slurmgpu.doctor import diagnose, exit_code

    name = node or default_node_name()
    context, findings, seconds = diagnose(node=name, role=role, config_file=config_file,
                                          slurm_conf=slurm_conf, keys_dir=keys_dir)
    if as_json:
        click.echo(json.dumps([f.to_json() for f in findings], indent=2))
    else:
        click.echo(f"slurmgpu doctor: {name} as {context.role} ({context.role_reason})")
        click.echo(render(findings))
        click.echo(summary(name, findings, seconds))
    ctx.exit(exit_code(findings, context))


def render(findings: list[Finding]) -> str:
    """One line per finding: severity, check, message and, for a problem, its fix."""
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        fix = f" -> fix: {f.fix}" if f.fix else ""
        lines.append(f"{f.level.value:<4}  {f.check:<{width}}  {f.message}{fix}")
    return "\n".join(lines)


def summary(node: str, findings: list[Finding], seconds: float) -> str:
    counts = Counter(f.level for f in findings)
    worst = next((lvl for lvl in (Level.FAIL, Level.WARN) if counts[lvl]), Level.OK)
    parts = ", ".join(f"{counts[lvl]} {lvl.value}" for lvl in Level)
    return f"{node}: {worst.value} - {sum(counts.values())} findings ({parts}) in {seconds:.1f} s"
