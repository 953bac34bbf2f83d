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
    from slurmgpu.cli import agent_cmd, config_cmd, fleet_cmd, jobs_cmd, keys_cmd, sim, slurm_cmds
    from slurmgpu.cli import checks as checks_cmds
    from slurmgpu.cli.ckpt_cmd import ckpt

    cli.add_command(ckpt)

    cli.add_command(checks_cmds.check)
    cli.add_command(checks_cmds.checks)
    cli.add_command(config_cmd.config)
    cli.add_command(sim.sim)
    cli.add_command(keys_cmd.keys)
    cli.add_command(agent_cmd.agent)
    cli.add_command(fleet_cmd.collector)
    cli.add_command(fleet_cmd.fleet)
    cli.add_command(fleet_cmd.breaker)
    cli.add_command(fleet_cmd.lemon)
    cli.add_command(jobs_cmd.jobs)
    from slurmgpu.cli import nightly_cmd, report_cmd

    cli.add_command(report_cmd.report)
    cli.add_command(nightly_cmd.report_nightly)
    sim.sim.add_command(fleet_cmd.fleet_sim)
    for command in (slurm_cmds.prolog, slurm_cmds.epilog, slurm_cmds.healthcheck, slurm_cmds.drain,
                    slurm_cmds.resume, slurm_cmds.nodes):
        cli.add_command(command)


_register()
