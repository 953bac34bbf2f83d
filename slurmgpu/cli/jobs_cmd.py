"""`slurmgpu jobs events JOBID`: a job's checkpoint timeline from the collector's database."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from slurmgpu.cli.fleetdb import db_option
from slurmgpu.config.schema import Settings


def _settings(config_file: str | None) -> Settings:
    from slurmgpu.config.load import load_config

    return load_config(config_file).settings_for(None)


def _open_store(config_file: str | None, db: str | None) -> Any:
    from slurmgpu.cli.fleetdb import existing_db
    from slurmgpu.collector.store import Store
    from slurmgpu.config.load import load_config

    config = load_config(config_file)
    return Store(existing_db(db, config.path, config.settings_for(None).collector.db).path)


@click.group("jobs")
def jobs() -> None:
    """What slurmgpu did to jobs (checkpoint requests, acks, drains, requeues)."""


@jobs.command("events")
@click.argument("job_id")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: $SLURMGPU_CONFIG or /etc/slurmgpu/slurmgpu.toml).")
@db_option
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def events(job_id: str, config_file: str | None, db: str | None, as_json: bool) -> None:
    """The timeline of JOB_ID: detected, signalled, delivered, acked, drained, requeued.

    Exit 0 with the timeline, 1 when slurmgpu never touched that job."""
    from slurmgpu.cli import fail

    store = _open_store(config_file, db)
    try:
        timeline = store.job_events(job_id)
        requests = store.checkpoints(job_id=job_id)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "events": timeline, "checkpoints": requests},
                              indent=2, sort_keys=True))
        if not timeline:
            raise SystemExit(1)
        return
    if not timeline:
        fail(f"no slurmgpu events for job {job_id}", code=1)
    start = timeline[0]["ts"]
    for e in timeline:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"]))
        delta = f"+{e['ts'] - start:.2f}s"
        click.echo(f"{stamp}  {delta:>9}  {e['kind']:<18} {e['node'] or '-':<16} "
                   f"{e['detail'] or ''}".rstrip())
    for r in requests:
        acked = f", acked by {r['acked_by']} after {r['acked_at'] - r['requested']:.1f} s" \
            if r["acked_at"] else ""
        click.echo(f"request {r['id']}: {r['action']} on {r['trigger_node']}, state {r['state']}"
                   f"{acked}")
