"""`slurmgpu config check [FILE]`, `slurmgpu config explain --node NAME`,
`slurmgpu config ranges` and `slurmgpu config env`."""

from __future__ import annotations

import json
import socket
from typing import Any

import click

from slurmgpu.cli.common import CliError, config_option, json_option
from slurmgpu.config import env as config_env
from slurmgpu.config.load import (
    ExplainRow,
    LoadedConfig,
    config_path,
    format_value,
    load_config,
    ranges_markdown,
)
from slurmgpu.errors import ConfigError

EXIT_CONFIG = 3


def _known_checks() -> list[str]:
    """Ids of the registered checks (``checks.disabled`` entries are checked against them)."""
    from slurmgpu.checks.registry import all_checks

    return [spec.id for spec in all_checks()]


def _load(file: str | None, as_json: bool) -> LoadedConfig:
    """The config; a CliError (exit 3) when it is bad, with --json the error as an object."""
    path, _ = config_path(file)
    try:
        loaded = load_config(file, known_checks=_known_checks())
        loaded.settings_for(None)  # the SLURMGPU_* variables are checked too
        return loaded
    except ConfigError as e:
        doc = {"ok": False, "path": e.path or path, "error": str(e), "key": e.key,
               "line": e.line} if as_json else None
        raise CliError(str(e), EXIT_CONFIG, document=doc) from None


@click.group("config")
def config() -> None:
    """Validate the config file and show the effective settings for a node."""


@config.command("check")
@click.argument("file", required=False)
@json_option()
def check(file: str | None, as_json: bool) -> None:
    """Validate FILE (default: $SLURMGPU_CONFIG, then /etc/slurmgpu/slurmgpu.toml).

    Exit status 0 when it is valid (or the default file is absent), 3 when not."""
    path, _ = config_path(file)
    loaded = _load(file, as_json)
    exists = loaded.path is not None
    if as_json:
        click.echo(json.dumps({"ok": True, "path": path, "exists": exists,
                               "host_sections": len(loaded.hosts)}, indent=2))
    elif exists:
        n = len(loaded.hosts)
        click.echo(f"OK: {path}: {n} host section{'' if n == 1 else 's'}")
    else:
        click.echo(f"OK: {path}: not present, the defaults apply")


@config.command("explain")
@click.option("--node", metavar="NAME", default=None,
              help="Slurm node name (default: this host's short name).")
@config_option
@json_option()
@click.option("--all", "show_all", is_flag=True,
              help="Show every setting, not only those the config (or the environment) sets.")
def explain(node: str | None, config_file: str | None, as_json: bool, show_all: bool) -> None:
    """The effective settings for a node and which layer set each: the default, the
    top level, a [[hosts]] section, or a SLURMGPU_* variable (docs/environment.md)."""
    if not node:
        node = socket.gethostname().split(".", 1)[0]
    loaded = _load(config_file, as_json)
    rows = loaded.explain(node)
    sections = [h.label for h in loaded.matching_sections(node)]
    shown = rows if show_all else [r for r in rows if r.source != "default"]
    defaulted = sum(1 for r in rows if r.source == "default")
    if as_json:
        out: dict[str, Any] = {
            "node": node,
            "path": loaded.path,
            "sections": sections,
            "settings": [{"key": r.key, "value": r.value, "source": r.source} for r in shown],
            "defaulted": defaulted,
        }
        click.echo(json.dumps(out, indent=2))
        return
    where = loaded.path or f"{config_path(config_file)[0]} (not present)"
    click.echo(f"node {node}: config {where}")
    click.echo("sections: " + (", ".join(sections) if sections else "(none match)"))
    click.echo(_table(shown))
    if not show_all:
        click.echo(f"{defaulted} setting{'' if defaulted == 1 else 's'} at the default "
                   "(--all shows them)")


@config.command("ranges")
def ranges() -> None:
    """The allowed range of every numeric setting, as Markdown (docs/config-ranges.md)."""
    click.echo(ranges_markdown(), nl=False)


@config.command("env")
@json_option()
def env(as_json: bool) -> None:
    """Every SLURMGPU_* environment variable, the setting it overrides and who sets it,
    as Markdown (docs/environment.md)."""
    if as_json:
        click.echo(json.dumps([{"name": v.name, "setting": v.setting, "audience": v.audience,
                                "doc": v.doc} for v in config_env.ENV_VARS], indent=2))
        return
    click.echo(config_env.markdown(), nl=False)


def _table(rows: list[ExplainRow]) -> str:
    cells = [("KEY", "VALUE", "SOURCE")]
    cells += [(r.key, format_value(r.value), r.source) for r in rows]
    wk = max(len(c[0]) for c in cells)
    wv = max(len(c[1]) for c in cells)
    return "\n".join(f"{k:<{wk}}  {v:<{wv}}  {s}".rstrip() for k, v, s in cells)
