"""The `slurmgpu` command. Subcommand groups live one per module in this package.

Exit codes follow the Nagios plugin convention: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN.
A bad argument or bad config is one line on stderr and exit 3, with nothing done.
"""

from __future__ import annotations

import sys

import click

from slurmgpu import __version__
from slurmgpu.errors import SlurmGpuError

EXIT_UNKNOWN = 3


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmgpu")
def cli() -> None:
    """GPU node health gating and fleet health for Slurm clusters."""


def fail(message: str, code: int = EXIT_UNKNOWN) -> None:
    """Print one error line and exit."""
    click.echo(f"slurmgpu: error: {message}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        rc = cli.main(args=argv, prog_name="slurmgpu", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        fail("aborted")
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        fail(exc.format_message() + hint)
    except click.ClickException as exc:
        fail(exc.format_message())
    except SlurmGpuError as exc:
        fail(str(exc))
    sys.exit(rc if isinstance(rc, int) else 0)


def _register() -> None:
    from slurmgpu.cli import (
        agent_cmd,
        ckpt_cmd,
        config_cmd,
        fleet_cmd,
        jobs_cmd,
        keys_cmd,
        nightly_cmd,
        report_cmd,
        sim,
        slurm_cmds,
    )
    from slurmgpu.cli import checks as checks_cmds

    for command in (checks_cmds.check, checks_cmds.checks, config_cmd.config, sim.sim, keys_cmd.keys,
                    agent_cmd.agent, fleet_cmd.collector, fleet_cmd.fleet, fleet_cmd.breaker,
                    fleet_cmd.lemon, jobs_cmd.jobs, ckpt_cmd.ckpt, report_cmd.report,
                    nightly_cmd.report_nightly, slurm_cmds.prolog, slurm_cmds.epilog,
                    slurm_cmds.healthcheck, slurm_cmds.drain, slurm_cmds.resume, slurm_cmds.nodes):
        cli.add_command(command)
    sim.sim.add_command(fleet_cmd.fleet_sim)


_register()
