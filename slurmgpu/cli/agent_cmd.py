"""`slurmgpu agent`: the per-node daemon (systemd unit daemon/slurmgpu-agent.service)."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import click

from slurmgpu.cli.common import config_option, json_option, load_settings


def default_node_name() -> str:
    from slurmgpu.engine import node_name

    return os.environ.get("SLURMD_NODENAME") or node_name()


@click.command()
@config_option
@click.option("--node", metavar="NAME", help="Node name (default: $SLURMD_NODENAME or the short hostname).")
@click.option("--keys-dir", metavar="DIR",
              help="CURVE key bundle (default: [collector] keys_dir; $SLURMGPU_KEYS_DIR).")
@click.option("--once", is_flag=True, help="Poll once and exit (debugging); nothing is sent.")
@json_option("With --once: print the report body as JSON.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def agent(config_file: str | None, node: str | None, keys_dir: str | None, once: bool,
          as_json: bool, log_level: str) -> int:
    """Watch this node's GPUs and InfiniBand; report to the collector. Runs until SIGTERM."""
    from slurmgpu import log
    from slurmgpu.agent.core import Agent

    log.configure(log_level)
    name = node or default_node_name()
    settings = load_settings(config_file, node=name, flags={"collector.keys_dir": keys_dir},
                             known_checks=True).settings
    the_agent = Agent(settings, name)

    if once:
        facts, verdict = the_agent.poll()
        body = the_agent.report_body(facts, verdict)
        if as_json:
            click.echo(json.dumps(body, indent=2, sort_keys=True, default=str))
        else:
            click.echo(f"{name}: {verdict.severity.name} - {len(verdict.problems())} problem(s) "
                       f"in {verdict.duration_ms:.0f} ms")
        return 0

    def on_signal(signum: int, frame: Any) -> None:
        the_agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    local = _start_local(the_agent)
    the_agent.run()
    if local is not None:  # it sees the stop too: closes and removes its socket
        local.join(LOCAL_STOP_S)
    return 0


#: How long a clean exit waits for the local socket's thread to remove its socket.
LOCAL_STOP_S = 5.0


def _start_local(the_agent: Any) -> threading.Thread | None:
    """The local query socket (prolog/epilog), in a thread of its own."""
    from slurmgpu.agent.local import serve_local

    thread = threading.Thread(target=serve_local, name="slurmgpu-local",
                              args=(the_agent, the_agent.settings.agent.socket, the_agent.stop_event),
                              daemon=True)
    thread.start()
    return thread


def main() -> None:
    from slurmgpu.cli import cli
    from slurmgpu.cli import main as cli_main

    if "agent" not in cli.commands:
        cli.add_command(agent)
    cli_main()


if __name__ == "__main__":
    main()
