"""The `slurmgpu` click group: the table of subcommands (each imported only when used,
see ``slurmgpu.cli.lazy``) and the root, where a command's error becomes its one line
and exit code (``RootGroup.main``), for the real program and in-process callers alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from slurmgpu import __version__
from slurmgpu.cli.common import EXIT_UNKNOWN, CliError, first_line, report
from slurmgpu.cli.lazy import LazyCommand, LazyGroup
from slurmgpu.errors import SlurmGpuError

_C = LazyCommand
COMMANDS: dict[str, LazyCommand] = {
    "agent": _C("slurmgpu.cli.agent_cmd", "agent",
                "Watch this node's GPUs and InfiniBand; report to the collector."),
    "breaker": _C("slurmgpu.cli.fleet_cmd", "breaker",
                  "The automation's circuit breaker (state in the collector's database)."),
    "check": _C("slurmgpu.cli.checks", "check",
                "Check this node's GPUs, InfiniBand and software versions."),
    "checks": _C("slurmgpu.cli.checks", "checks", "Inspect the registered checks."),
    "ckpt": _C("slurmgpu.cli.ckpt_cmd", "ckpt",
               "Checkpoint requests to a job: see one, acknowledge one."),
    "collector": _C("slurmgpu.cli.fleet_cmd", "collector",
                    "Run the fleet collector until SIGTERM/SIGINT (SIGHUP reloads the allow-list)."),
    "config": _C("slurmgpu.cli.config_cmd", "config",
                 "Validate the config file and show the effective settings for a node."),
    "db": _C("slurmgpu.cli.db_cmd", "db", "The fleet database: copy a SQLite one into PostgreSQL."),
    "demo": _C("slurmgpu.cli.demo_cmd", "demo",
               "Show the whole product in one command: a Slurm mini-cluster, GPU jobs, live "
               "faults, the automation, return to service and the fleet report."),
    "doctor": _C("slurmgpu.cli.doctor_cmd", "doctor",
                 "Check this host's slurmgpu installation and say what to fix, one line per problem."),
    "drain": _C("slurmgpu.cli.slurm_cmds", "drain",
                "Drain NODE with a slurmgpu-owned reason (an operator's drain is left as it is)."),
    "epilog": _C("slurmgpu.cli.slurm_cmds", "epilog",
                 "Slurm Epilog: re-check the job's GPUs, catch faults that appeared during the job "
                 "(XIDs, ECC, row remaps), report stray processes, record a per-job GPU summary, "
                 "and drain the node when it is now bad."),
    "fleet": _C("slurmgpu.cli.fleet_cmd", "fleet",
                "Fleet health from the collector's database: one line per node."),
    "healthcheck": _C("slurmgpu.cli.slurm_cmds", "healthcheck",
                      "Slurm HealthCheckProgram: check the whole node; drain on FAIL; resume a node "
                      "that slurmgpu drained once it is healthy (never an operator's drain, never a "
                      "rebooting node, never a drain for an XID)."),
    "jobs": _C("slurmgpu.cli.jobs_cmd", "jobs",
               "What slurmgpu did to jobs (checkpoint requests, acks, drains, requeues)."),
    "keys": _C("slurmgpu.cli.keys_cmd", "keys",
               "CURVE keys: the collector keypair, per-node keypairs and the allow-list."),
    "lemon": _C("slurmgpu.cli.fleet_cmd", "lemon",
                "Lemon nodes: drained too often, kept drained until an operator clears them."),
    "nodes": _C("slurmgpu.cli.slurm_cmds", "nodes",
                "Nodes drained by slurmgpu: state, reason, since when."),
    "prolog": _C("slurmgpu.cli.slurm_cmds", "prolog",
                 "Slurm Prolog: gate the job on the health of the GPUs it was given."),
    "remediate": _C("slurmgpu.cli.remediate_cmd", "remediate",
                    "Remediation steps on this node: reset a GPU that no process holds."),
    "report": _C("slurmgpu.cli.report_cmd", "report",
                 "Fleet health over a window: availability, drains, failures, XIDs, ECC trends, "
                 "throttling, IB ports, version pin drift, nodes due for service, jobs, MTBF."),
    "report-nightly": _C("slurmgpu.cli.nightly_cmd", "report_nightly",
                         "Write the daily fleet report (HTML + JSON) for one day, prune old ones, "
                         "mail it."),
    "resume": _C("slurmgpu.cli.slurm_cmds", "resume",
                 "Resume NODE if slurmgpu drained it (any drained node with --force)."),
    "sim": _C("slurmgpu.cli.sim", "sim",
              "GPU simulator: a fake libnvidia-ml.so.1 driven by JSON scenarios."),
    "validate": _C("slurmgpu.cli.validate_cmd", "validate",
                   "Run active tests on this node (GPU burn with silent-data-corruption screening, "
                   "memory, PCIe, P2P/NVLink and NCCL bandwidth, DCGM diag, IB loopback): for idle "
                   "nodes only, never from a prolog."),
    "validations": _C("slurmgpu.cli.validations_cmd", "validations",
                      "The validation history from the collector's database: one row per run "
                      "(return to service, idle-time, manual)."),
}

class RootGroup(LazyGroup):
    """The `slurmgpu` group: where a command's error becomes its one line and exit code."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> int:
        """Run the command; return its exit code (``standalone_mode``: exit with it)."""
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.Abort:
            report("aborted")
            code = EXIT_UNKNOWN
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            report(exc.format_message() + hint)
            code = EXIT_UNKNOWN
        except CliError as exc:
            exc.show()
            code = exc.exit_code
        except click.ClickException as exc:
            report(exc.format_message())
            code = EXIT_UNKNOWN
        except SlurmGpuError as exc:
            report(first_line(exc))
            code = EXIT_UNKNOWN
        if standalone_mode:
            sys.exit(code)
        return code


@click.group(cls=RootGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmgpu")
def cli() -> None:
    """GPU node health gating and fleet health for Slurm clusters."""
