"""`slurmgpu remediate reset --gpu N`: reset one GPU of this node (``slurmgpu.gpureset``),
refused while a process holds it. Exit 0 reset, 1 refused (in use), 2 the reset failed,
3 NVML could not say who holds the GPU, or bad arguments/config."""

from __future__ import annotations

import json
import os

import click

from slurmgpu.cli.common import EXIT_UNKNOWN, CliError, config_option, json_option, load_settings

JSON_SCHEMA = "slurmgpu.remediate.reset/1"
EXIT_BY_ACTION = {"reset": 0, "refused": 1, "failed": 2}


@click.group()
def remediate() -> None:
    """Remediation steps on this node: reset a GPU that no process holds."""


@remediate.command("reset")
@config_option
@click.option("--gpu", "gpu", type=click.IntRange(min=0), required=True, help="NVML index of the GPU.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds nvidia-smi -r may take.")
@json_option("Print the outcome as JSON.")
def reset(config_file: str | None, gpu: int, timeout_s: float, as_json: bool) -> int:
    """Reset GPU N with `nvidia-smi -r -i N`, only when NVML lists no process on it."""
    from slurmgpu.engine import node_name
    from slurmgpu.gpureset import NvmlUnanswered, reset_gpu

    settings = load_settings(config_file).settings
    try:
        outcome = reset_gpu(gpu, library=settings.nvml.library, environ=os.environ,
                            timeout_s=timeout_s)
    except NvmlUnanswered as exc:
        document = {"schema": JSON_SCHEMA, "gpu": gpu, "action": "unknown", "message": str(exc)}
        raise CliError(str(exc), EXIT_UNKNOWN, document=document if as_json else None) from exc
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "node": node_name(), **outcome.to_json()}, indent=2))
    else:
        click.echo(f"GPU {gpu}: {outcome.action}: {outcome.message}")
    return EXIT_BY_ACTION[outcome.action]
