"""`slurmgpu ckpt ack|status`: a job's side of checkpoint coordination.

When a node of a job degrades, the node's agent writes the job's checkpoint file
(``$SLURMGPU_CHECKPOINT_FILE``, set by the TaskProlog; else
``<jobs_dir>/<job id>/checkpoint``) and Slurm signals the job. Once it has
checkpointed, the job runs ``slurmgpu ckpt ack`` (or writes "done" into the file);
the agent reports the ack to the collector, which then drains the node without
waiting for the deadline.

JOBID defaults to $SLURM_JOB_ID. jobs_dir: $SLURMGPU_JOBS_DIR, else ``[agent]
jobs_dir`` of the config file (--config, $SLURMGPU_CONFIG, /etc/slurmgpu/slurmgpu.toml).
Exit codes: 0 acked / a request is open or acked; 1 (status) no checkpoint requested;
3 bad usage (no job id, the job has no directory on this node, unreadable file).
Light on purpose: no zmq, no NVML, no settings validation.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from slurmgpu import jobfiles
from slurmgpu.cli.common import CliError, config_option, json_option

EXIT_OK, EXIT_NONE, EXIT_USAGE = 0, 1, 3


def resolve(job: str | None, config_file: str | None) -> tuple[str, Path]:
    """(job id, checkpoint file) for --job / the environment; CliError (exit 3) on bad usage."""
    env = os.environ
    env_job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    env_file = env.get(jobfiles.CHECKPOINT_FILE_ENV)
    job_id = job or env_job
    if env_file and (job is None or job == env_job):
        path = Path(env_file)
        job_id = job_id or path.parent.name
    else:
        if not job_id:
            raise CliError("no job id: use --job JOBID or run inside a Slurm job", EXIT_USAGE)
        if not jobfiles.valid_job_id(job_id):
            raise CliError(f"bad job id {job_id[:40]!r}", EXIT_USAGE)
        path = jobfiles.checkpoint_file(jobfiles.configured_jobs_dir(env, config_file), job_id)
    if not path.parent.is_dir():
        raise CliError(f"job {job_id} has no directory {path.parent} on this node", EXIT_USAGE)
    return job_id, path


def _options(f: Any) -> Any:
    f = json_option()(f)
    f = config_option(f)  # only [agent] jobs_dir is read, and the file is not validated
    return click.option("--job", "job", metavar="JOBID",
                        help="The job (default: $SLURM_JOB_ID).")(f)


@click.group("ckpt", context_settings={"help_option_names": ["-h", "--help"]})
def ckpt() -> None:
    """Checkpoint requests to a job: see one, acknowledge one."""


@ckpt.command("ack")
@_options
@click.option("--note", metavar="TEXT", help="Free text passed on to the collector.")
def ack(job: str | None, config_file: str | None, as_json: bool, note: str | None) -> int:
    """Tell slurmgpu this job has checkpointed (its node may be drained now)."""
    job_id, path = resolve(job, config_file)
    data = {**_request_fields(path), "job_id": job_id, "state": jobfiles.ACKED, "acked_at": time.time(),
            "note": note}
    try:
        jobfiles.write_atomic(path, data)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}", EXIT_USAGE) from None
    if as_json:
        click.echo(json.dumps({**data, "file": str(path)}))
    else:
        click.echo(f"job {job_id}: checkpoint acked ({path})")
    return EXIT_OK


@ckpt.command("status")
@_options
def status(job: str | None, config_file: str | None, as_json: bool) -> int:
    """Is a checkpoint requested from this job? Exit 0 requested or acked, 1 none."""
    job_id, path = resolve(job, config_file)
    try:
        current = jobfiles.read_file(path)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_USAGE) from None
    parsed = jobfiles.parse(current[0] if current else None)
    state = parsed["state"]
    if state == "unknown":
        raise CliError(f"{path} holds neither a checkpoint request nor an ack", EXIT_USAGE)
    if state == jobfiles.ACKED and parsed.get("acked_at") is None and current is not None:
        parsed["acked_at"] = current[1]  # a plain "done": the file's time
    out = {**parsed, "job_id": job_id, "file": str(path)}
    out.pop("plain", None)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    elif state == "absent":
        click.echo(f"job {job_id}: no checkpoint requested")
    elif state == jobfiles.ACKED:
        click.echo(f"job {job_id}: checkpoint acked at {_when(out.get('acked_at'))}"
                   + (f" ({out['note']})" if out.get("note") else ""))
    else:
        deadline = out.get("deadline")
        left = (f"{max(0.0, deadline - time.time()):.0f} s left, deadline {_when(deadline)}"
                if isinstance(deadline, (int, float)) else "no deadline")
        click.echo(f"job {job_id}: {out.get('action', 'checkpoint')} requested by "
                   f"{out.get('trigger_node') or out.get('node') or '?'}: {out.get('reason') or '-'}; "
                   f"{left}")
    held = jobfiles.held_note_of(out.get("reason"))
    if held is not None and not as_json:
        click.echo(f"job {job_id}: {held}")
    return EXIT_NONE if state == "absent" else EXIT_OK


#: The request's fields an ack keeps, so `ckpt status` still says what was asked and why.
_KEPT = ("action", "reason", "deadline", "requested_at", "node", "trigger_node")


def _request_fields(path: Path) -> dict[str, Any]:
    try:
        current = jobfiles.read_file(path)
    except OSError:
        return {}
    parsed = jobfiles.parse(current[0] if current else None)
    return {k: parsed[k] for k in _KEPT if parsed.get(k) is not None} if parsed["state"] == jobfiles.REQUESTED else {}


def _when(at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
