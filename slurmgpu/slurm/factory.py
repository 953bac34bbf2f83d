"""Pick a ``SlurmClient``: pyslurm when it is installed and built for the running
Slurm's major.minor, else the command-line client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurmgpu.slurm import SlurmClient

if TYPE_CHECKING:
    from slurmgpu.config.schema import SlurmSettings


def make_client(settings: SlurmSettings, env: Mapping[str, str] | None = None) -> SlurmClient:
    from slurmgpu.slurm.cli import CliSlurmClient
    from slurmgpu.slurm.pyslurm_client import PyslurmClient, available

    ok, _why = available(env, settings.bin_dir)
    if ok:
        return PyslurmClient.from_settings(settings, env)
    return CliSlurmClient.from_settings(settings, env)


def bounded(client: SlurmClient) -> SlurmClient:
    """``client``, or for a ``PyslurmClient`` the command client with its settings: a
    caller with a deadline (a hook) needs every try cut at its timeout, and a libslurm
    call waits out slurm.conf's MessageTimeout per try and cannot be cut short."""
    from slurmgpu.slurm.pyslurm_client import PyslurmClient

    return client.command_client() if isinstance(client, PyslurmClient) else client
