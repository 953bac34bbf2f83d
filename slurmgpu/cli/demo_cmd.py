"""`slurmgpu demo`: the whole product on this machine (orchestration in slurmgpu.sim.demo,
imported inside the command so that `slurmgpu --help` stays light)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from slurmgpu.cli.common import json_option


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/tmp/slurmgpu-demo"), show_default=True,
              help="The mini-cluster's directory: brought up there, or reused (and reset) "
                   "when a demo cluster already runs there.")
@click.option("--timeout", type=click.FloatRange(min=5, max=600), default=30.0,
              show_default=True, metavar="SECONDS",
              help="The longest any one wait may take; every wait is bounded.")
@json_option("Print one JSON object (steps with timings, final states, report path) on "
             "stdout; the narration goes to stderr.")
@click.pass_context
def demo(ctx: click.Context, directory: Path, timeout: float, as_json: bool) -> None:
    """Show the whole product in one command: a Slurm mini-cluster, GPU jobs, live faults, the automation, return to service and the fleet report.

    As root, on Debian 12/13 (Slurm is installed with apt-get if missing), in about a
    minute and a quarter:

    \b
    1. a 4-node Slurm mini-cluster (8 simulated H100s per node, an agent per
       node, the collector with automation on) in --dir, or the one already
       there, reset (cancelled jobs, healthy GPUs, resumed nodes);
    2. GPU jobs, and examples/train_with_checkpoint.py, a training job that
       saves a checkpoint when asked;
    3. XID 79 under the training job: drain-now, checkpoint signal, the job's
       ack, drain, requeue, and the job resuming on a healthy node from the
       saved step;
    4. a pending row remap on a second node (mem.row_remap FAIL): the
       automation's checkpoint action drains it;
    5. the wrong driver on a third (pin.driver FAIL): the circuit breaker holds
       the automation's third drain, the prolog refuses the next job there,
       drains the node, and Slurm requeues the job;
    6. the breaker's view, the jobs finishing on the healthy node, and the fleet
       report (slurmgpu report --since 1h) in <dir>/fleet-report.html;
    7. return to service, the collector restarted with [remediation] on: a
       transient fault on the healthy node (drain, heal, a passing validation
       in the slurmgpu-rts-<node> reservation, the node takes jobs again), a
       persistent one (validation fails, GPU reset, fails, reboot, fails,
       repair ticket in <dir>/demo/repair-ticket.json), slurmgpu validations.

    Each effect is one line with the seconds since its step began. The cluster
    is left up: the last lines say how to explore it and how to tear it down
    (slurmgpu sim cluster down --dir DIR).

    \b
    Exit status:
      0  every expected effect was observed
      1  one was not (the output names it)
      3  a bad argument or --dir, or not root
    """
    from slurmgpu.cli.common import CliError
    from slurmgpu.sim.demo import DemoError, check_directory, render_end, render_tables, run_demo
    from slurmgpu.sim.demo_rts import ALL_STEPS

    try:
        directory = check_directory(directory)
    except DemoError as exc:
        raise CliError(str(exc)) from None

    def say(line: str) -> None:
        click.echo(line, err=as_json)
        (sys.stderr if as_json else sys.stdout).flush()

    if not as_json:
        say(f"slurmgpu demo in {directory}")
    result = run_demo(directory, timeout=timeout, say=say, steps=ALL_STEPS)
    if as_json:
        for line in render_end(result):
            say(line)
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        say("")
        for line in render_tables(result):
            say(line)
        say("")
        for line in render_end(result):
            say(line)
    ctx.exit(result.exit_code)
