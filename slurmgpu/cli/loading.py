"""How a command gets its settings: ``load_settings`` (the config file, ``SLURMGPU_*``,
the command's flags), and where one-shot commands cache library versions. Without click,
so the one-shot commands (``slurmgpu.cli.oneshot``) load exactly as the rest of the CLI."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from slurmgpu.record import record

if TYPE_CHECKING:
    from slurmgpu.config.load import LoadedConfig
    from slurmgpu.config.schema import Settings


@record(frozen=True)
class Loaded:
    """The config as read, and the settings a command runs with."""

    config: LoadedConfig
    settings: Settings


def load_settings(config_file: str | None, *, node: str | None = None,
                  flags: Mapping[str, Any] | None = None, known_checks: bool = False,
                  environ: Mapping[str, str] = os.environ) -> Loaded:
    """The config file (``--config``, ``$SLURMGPU_CONFIG``, the default path) and the
    settings for ``node`` (None: the top level): defaults < file < ``SLURMGPU_*`` <
    ``flags`` (``{"collector.db": db}``; None values are flags not given).
    ``known_checks``: ``[checks] disabled`` must name registered checks. Raises
    ConfigError."""
    from slurmgpu.config.load import load_config

    checks: Iterable[str] | None = None
    if known_checks:
        from slurmgpu.checks.registry import all_checks

        checks = [c.id for c in all_checks()]
    config = load_config(config_file, environ=environ, known_checks=checks)
    return Loaded(config, config.settings_for(node, environ, flags))


def versions_cache(settings: Settings) -> str:
    """The file in the state dir where one-shot commands keep NCCL/CUDA runtime versions
    between runs, so they need not load those libraries each time."""
    from slurmgpu.sources.versions import CACHE_FILE

    return os.path.join(settings.paths.state_dir, CACHE_FILE)
