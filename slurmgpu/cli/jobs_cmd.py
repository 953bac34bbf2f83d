"""`slurmgpu jobs events JOBID`: a job's checkpoint timeline from the collector's database."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from slurmgpu.cli.common import (
    CliError,
    config_option,
    db_option,
    existing_db,
    json_option,
    load_settings,
)


def _open_store(config_file: str | None, db: str | None) -> Any:
    from slurmgpu.collector.store import Store

    return Store(existing_db(load_settings(config_file), db).path)


@click.group("jobs")
def jobs() -> None:
    """What slurmgpu did to jobs (checkpoint requests, acks, drains, requeues)."""


@jobs.command("events")
@click.argument("job_id")
@config_option
@db_option
@json_option("JSON output.")
def events(job_id: str, config_file: str | None, db: str | None, as_json: bool) -> None:
    """The timeline of JOB_ID: detected, signalled, delivered, acked, drained, requeued.

    Exit 0 with the timeline, 1 when slurmgpu never touched that job."""
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
        raise CliError(f"no slurmgpu events for job {job_id}", exit_code=1)
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
