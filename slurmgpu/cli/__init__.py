"""The `slurmgpu` command. Subcommand groups live one per module in this package.

Exit codes follow the Nagios plugin convention: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN.
A bad argument or bad config is one line on stderr and exit 3, with nothing done.
Commands raise their errors (``slurmgpu.cli.common``); only the root group prints them
(``RootGroup.main``), for the real program and for in-process callers alike.

Subcommands are listed in ``COMMANDS`` and imported only when used (see
``slurmgpu.cli.lazy``): `slurmgpu check` and the Slurm hooks run once per job and must
not import zmq, the collector or the report.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click

from slurmgpu import __version__
from slurmgpu.cli.common import EXIT_UNKNOWN, CliError, first_line, report
from slurmgpu.cli.lazy import LazyCommand, LazyGroup
from slurmgpu.errors import SlurmGpuError

if TYPE_CHECKING:
    from slurmgpu.config.schema import Settings


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
               "faults, the automation and the fleet report."),
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
}

# Run once per job or health poll and then done: `main()` leaves them with os._exit.
ONE_SHOT = frozenset({"check", "prolog", "epilog", "healthcheck"})


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


def versions_cache(settings: Settings) -> str:
    """The file in the state dir where one-shot commands keep NCCL/CUDA runtime versions
    between runs, so they need not load those libraries each time."""
    from slurmgpu.sources.versions import CACHE_FILE

    return os.path.join(settings.paths.state_dir, CACHE_FILE)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    code = cli.main(args=args, prog_name="slurmgpu", standalone_mode=False)
    # The group's own options (--help, --version) take no value, so args[0] is either one
    # of them or the command that ran (`check --help` too: exiting fast is harmless then).
    if args and args[0] in ONE_SHOT:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int) -> NoReturn:
    """Flush what the command wrote and leave without interpreter teardown (freeing every
    module, atexit hooks): ~19 ms per prolog/check for nothing. Only for the real entry
    point, once the result is known; in-process callers (click's CliRunner in tests)
    never get here, as they call the group, not ``main``."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # what logging's atexit hook does: flush and close the handlers
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: the exit code still matters
            pass
    os._exit(code)
