"""`slurmgpu config check [FILE]`, `slurmgpu config explain --node NAME`,
`slurmgpu config ranges`, `slurmgpu config env` and `slurmgpu config init --from-this-node`."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import click

from slurmgpu.cli.common import CliError, config_option, first_line, json_option, report
from slurmgpu.config import env as config_env
from slurmgpu.config.load import (
    ExplainRow,
    LoadedConfig,
    config_path,
    format_value,
    load_config,
    ranges_markdown,
)
from slurmgpu.errors import ConfigError, ConfigErrors

EXIT_CONFIG = 3


def _known_checks() -> list[str]:
    """Ids of the registered checks (``checks.disabled`` entries are checked against them)."""
    from slurmgpu.checks.registry import all_checks

    return [spec.id for spec in all_checks()]


def _load(file: str | None, as_json: bool, *, every_error: bool = False) -> LoadedConfig:
    """The config; a CliError (exit 3) when it is bad, with --json the error as an object.
    ``every_error``: each problem of the file on its own line (`config check`), the last
    one the CliError's."""
    path, _ = config_path(file)
    try:
        loaded = load_config(file, known_checks=_known_checks())
        loaded.settings_for(None)  # the SLURMGPU_* variables are checked too
        return loaded
    except ConfigError as e:
        errors = e.errors if isinstance(e, ConfigErrors) else [e]
        doc = {"ok": False, "path": e.path or path, "error": str(e), "key": e.key, "line": e.line,
               "errors": [_error_doc(x) for x in errors]} if as_json else None
        if not every_error or as_json:
            raise CliError(str(e), EXIT_CONFIG, document=doc) from None
        for earlier in errors[:-1]:
            report(str(earlier))
        raise CliError(str(errors[-1]), EXIT_CONFIG) from None


def _error_doc(e: ConfigError) -> dict[str, Any]:
    return {"error": str(e), "key": e.key, "line": e.line}


@click.group("config")
def config() -> None:
    """Validate the config file and show the effective settings for a node."""


@config.command("check")
@click.argument("file", required=False)
@click.option("--slurm", "ask_slurm", is_flag=True,
              help="Ask Slurm for its nodes (an error when it does not answer): warn about "
                   "[[hosts]] sections that match none. Without it they are checked whenever "
                   "slurmctld answers.")
@json_option()
def check(file: str | None, ask_slurm: bool, as_json: bool) -> None:
    """Validate FILE (default: $SLURMGPU_CONFIG, then /etc/slurmgpu/slurmgpu.toml) and its
    drop-ins (FILE's name with .d for .toml: /etc/slurmgpu/slurmgpu.d/*.toml): every
    problem, one line each.

    Exit status 0 when it is valid (or the default file is absent; warnings included),
    3 when not."""
    path, _ = config_path(file)
    loaded = _load(file, as_json, every_error=True)
    exists = loaded.path is not None
    dropins = [d.path for d in loaded.dropins]
    warnings = _hosts_warnings(loaded, ask_slurm)
    if as_json:
        click.echo(json.dumps({"ok": True, "path": path, "exists": exists,
                               "host_sections": len(loaded.all_hosts), "dropins": dropins,
                               "warnings": warnings}, indent=2))
        return
    for warning in warnings:
        click.echo(f"WARN: {warning}")
    n = len(loaded.all_hosts)
    said = f"{n} host section{'' if n == 1 else 's'}" if exists else "not present, the defaults apply"
    click.echo(f"OK: {path}: {said}{_dropins_line(dropins)}")


def _dropins_line(dropins: list[str | None]) -> str:
    return f"; drop-ins, later wins: {', '.join(str(d) for d in dropins)}" if dropins else ""


def _hosts_warnings(loaded: LoadedConfig, ask_slurm: bool) -> list[str]:
    """A line per [[hosts]] section whose hostlist matches no node Slurm knows (none when
    Slurm does not answer, unless ``ask_slurm``: then a CliError)."""
    if not loaded.all_hosts:
        return []
    known = _slurm_nodes(loaded, ask_slurm)
    if known is None:
        return []
    return [f"{layer.path}:{_section_line(layer, h.index)}: {h.label}: matches none of the "
            f"{len(known)} nodes Slurm knows"
            for layer in (loaded, *loaded.dropins) for h in layer.hosts
            if not any(h.matches(n) for n in known)]


def _slurm_nodes(loaded: LoadedConfig, ask_slurm: bool) -> list[str] | None:
    import dataclasses

    from slurmgpu.slurm import SlurmError
    from slurmgpu.slurm.factory import make_client

    quick = dataclasses.replace(loaded.settings_for(None).slurm, retries=1)
    try:
        return [n.name for n in make_client(quick).nodes()]
    except (SlurmError, OSError) as exc:
        if ask_slurm:
            raise CliError(f"--slurm: Slurm did not list its nodes: {first_line(exc)}") from None
        return None


def _section_line(loaded: LoadedConfig, index: int) -> int | str:
    from slurmgpu.config.tomltext import find_line

    if loaded.path is None:
        return "?"
    with open(loaded.path, encoding="utf-8") as fh:
        return find_line(fh.read(), ("hosts", index, "nodes")) or "?"


@config.command("explain")
@click.option("--node", metavar="NAME", default=None,
              help="Slurm node name (default: this host's short name).")
@config_option
@json_option()
@click.option("--all", "show_all", is_flag=True,
              help="Show every setting, not only those the config (or the environment) sets.")
def explain(node: str | None, config_file: str | None, as_json: bool, show_all: bool) -> None:
    """The effective settings for a node and which layer set each: the default, the
    top level, a [[hosts]] section, a drop-in ("50-site.toml: top-level"), or a
    SLURMGPU_* variable (docs/environment.md)."""
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
            "dropins": [d.path for d in loaded.dropins],
            "settings": [{"key": r.key, "value": r.value, "source": r.source} for r in shown],
            "defaulted": defaulted,
        }
        click.echo(json.dumps(out, indent=2))
        return
    where = loaded.path or f"{config_path(config_file)[0]} (not present)"
    click.echo(f"node {node}: config {where}{_dropins_line([d.path for d in loaded.dropins])}")
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


@config.command("init")
@click.option("--from-this-node", "from_node", is_flag=True,
              help="Pin what this node has (the only source so far; required).")
@click.option("--out", metavar="FILE", default=None,
              help="Where to write it (default: 50-this-node.toml in the config's drop-in "
                   "directory, /etc/slurmgpu/slurmgpu.d/); - prints it.")
@click.option("--force", is_flag=True, help="Replace FILE when it exists.")
@click.option("--node", metavar="NAME", default=None,
              help="Node name for the config's [[hosts]] sections (default: this host).")
@config_option
def init(from_node: bool, out: str | None, force: bool, node: str | None,
         config_file: str | None) -> None:
    """Write a drop-in that pins what this node has: driver, VBIOS, GPU model and count,
    active NVLinks per GPU, the InfiniBand ports in scope and their rate and firmware, CUDA
    and NCCL versions. What the node lacks stays unpinned; what looks wrong (a port down, a
    GPU short of links) is said on stderr and in the file. The result is checked like any
    config file before it is written."""
    from slurmgpu.cli.common import load_settings
    from slurmgpu.cli.loading import versions_cache
    from slurmgpu.config.from_node import baseline, render
    from slurmgpu.config.load import dropin_dir, parse_config
    from slurmgpu.engine import gather, node_name, system_sources

    if not from_node:
        raise CliError("config init: say what to pin: --from-this-node", EXIT_CONFIG)
    name = node or node_name()
    settings = load_settings(config_file, node=name).settings
    facts = gather(system_sources(settings, versions_cache=versions_cache(settings)), node=name)
    found = baseline(facts, settings.ib)
    target = out or os.path.join(dropin_dir(config_path(config_file)[0]), DEFAULT_INIT_NAME)
    text = render(facts, found, generator="slurmgpu config init --from-this-node")
    parse_config(text, path=target, known_checks=None)
    for note in found.notes:
        click.echo(f"note: {note}", err=True)
    if out is None:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    _write_new(target, text, force)


DEFAULT_INIT_NAME = "50-this-node.toml"


def _write_new(target: str, text: str, force: bool) -> None:
    """Print ``text`` (``-``) or write it to ``target``, which must not exist unless ``force``."""
    from slurmgpu.fileutil import write_text_atomic

    if target == "-":
        click.echo(text, nl=False)
        return
    if os.path.lexists(target) and not force:
        raise CliError(f"config init: {target} exists (--force replaces it)", EXIT_CONFIG)
    try:
        write_text_atomic(target, text)
    except OSError as e:
        raise CliError(f"config init: cannot write {target}: {e.strerror or e}", EXIT_CONFIG) from None
    click.echo(f"wrote {target}: `slurmgpu config check` reads it after the config file")


def _table(rows: list[ExplainRow]) -> str:
    cells = [("KEY", "VALUE", "SOURCE")]
    cells += [(r.key, format_value(r.value), r.source) for r in rows]
    wk = max(len(c[0]) for c in cells)
    wv = max(len(c[1]) for c in cells)
    return "\n".join(f"{k:<{wk}}  {v:<{wv}}  {s}".rstrip() for k, v, s in cells)
