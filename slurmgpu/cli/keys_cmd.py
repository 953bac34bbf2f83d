"""`slurmgpu keys init|add-node|revoke|list`: CURVE keys for the agent <-> collector link.

The keys directory is ``[collector] keys_dir`` as the one order of ``slurmgpu.config.env``
leaves it: --dir, else $SLURMGPU_KEYS_DIR, else the config file's, else /etc/slurmgpu/keys
(what the collector and the agents use). Errors are KeyFileError: one line on stderr and
exit 3 (the root prints it)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import click

from slurmgpu import keys as keylib
from slurmgpu.cli.common import config_option, json_option, load_settings

_DIR_HELP = (f"Keys directory (default: [collector] keys_dir of the config, which "
             f"$SLURMGPU_KEYS_DIR overrides; built in: {keylib.DEFAULT_KEYS_DIR}).")


def _dir_option(f: Any) -> Any:
    """``--dir`` and ``--config``; the command gets the resolved ``keys_dir``."""

    @functools.wraps(f)
    def resolved(*args: Any, keys_dir: str | None, config_file: str | None, **kwargs: Any) -> Any:
        settings = load_settings(config_file, flags={"collector.keys_dir": keys_dir}).settings
        return f(*args, keys_dir=settings.collector.keys_dir, **kwargs)

    return click.option("--dir", "keys_dir", metavar="DIR", default=None, help=_DIR_HELP)(
        config_option(resolved))


_json_option = json_option()


def _emit(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group("keys", context_settings={"help_option_names": ["-h", "--help"]})
def keys() -> None:
    """CURVE keys: the collector keypair, per-node keypairs and the allow-list.

    Run on the head node; copy each node's bundle to that node with your
    config management (see docs/keys.md)."""


@keys.command("init")
@_dir_option
@click.option("--force", is_flag=True,
              help="Replace an existing collector keypair (every node bundle then needs "
                   "the new collector.key).")
@_json_option
def init_cmd(keys_dir: str, force: bool, as_json: bool) -> None:
    """Create the collector keypair (collector.key, collector.key_secret) in DIR."""
    public_path = keylib.init(keys_dir, force=force)
    public = keylib.public_key(public_path)
    if as_json:
        _emit({"ok": True, "keys_dir": keys_dir, "public_key_file": str(public_path),
               "public_key": public.decode(), "fingerprint": keylib.fingerprint(public)})
        return
    click.echo(f"collector key {keylib.fingerprint(public)}: {public_path}")
    click.echo(f"secret key: {Path(keys_dir) / 'collector.key_secret'} (mode 0600)")


@keys.command("add-node")
@click.argument("node")
@_dir_option
@click.option("--out", "out_dir", metavar="DIR", default=None,
              help="Where to write the node bundle (default: DIR/bundles/NODE).")
@click.option("--force", is_flag=True,
              help="Replace the key of a node that already has one (rotation); the old key "
                   "is moved to revoked/.")
@_json_option
def add_node_cmd(node: str, keys_dir: str, out_dir: str | None, force: bool,
                 as_json: bool) -> None:
    """Make a keypair for NODE, allow-list its public key and write its bundle.

    The bundle (node.key, node.key_secret, collector.key) goes to the node's keys
    directory; keep node.key_secret mode 0600. Reload the collector afterwards."""
    bundle = keylib.add_node(keys_dir, node, out_dir=out_dir, force=force)
    public = keylib.public_key(bundle / "node.key")
    files = [str(bundle / name) for name in ("node.key", "node.key_secret", "collector.key")]
    if as_json:
        _emit({"ok": True, "node": node, "bundle_dir": str(bundle), "files": files,
               "public_key": public.decode(), "fingerprint": keylib.fingerprint(public)})
        return
    click.echo(f"node {node} key {keylib.fingerprint(public)} allow-listed; bundle: {bundle}")
    click.echo(f"copy {bundle}/* to {node}'s keys directory (node.key_secret mode 0600), "
               "restart its agent and reload the collector")


@keys.command("revoke")
@click.argument("node")
@_dir_option
@_json_option
def revoke_cmd(node: str, keys_dir: str, as_json: bool) -> None:
    """Remove NODE from the allow-list (its key moves to revoked/).

    Takes effect when the collector reloads."""
    keylib.validate_node_name(node)
    path = Path(keys_dir) / "nodes" / f"{node}.key"
    fp = keylib.fingerprint(keylib.public_key(path)) if path.is_file() else None
    keylib.revoke(keys_dir, node)
    if as_json:
        _emit({"ok": True, "node": node, "fingerprint": fp})
        return
    click.echo(f"node {node} key {fp} revoked (moved to {Path(keys_dir) / 'revoked'}); "
               "reload the collector")


@keys.command("list")
@_dir_option
@_json_option
def list_cmd(keys_dir: str, as_json: bool) -> None:
    """List the allow-listed nodes and their key fingerprints."""
    allowed = keylib.allowed_nodes(keys_dir)
    collector_path = Path(keys_dir) / "collector.key"
    collector = keylib.fingerprint(keylib.public_key(collector_path)) if collector_path.is_file() \
        else None
    rows = sorted((node, keylib.fingerprint(public)) for public, node in allowed.items())
    if as_json:
        _emit({"keys_dir": keys_dir, "collector": collector,
               "nodes": [{"node": n, "fingerprint": fp} for n, fp in rows]})
        return
    click.echo(f"collector: {collector or '-'}")
    if not rows:
        click.echo("no nodes allow-listed")
    width = max((len(n) for n, _ in rows), default=0)
    for node, fp in rows:
        click.echo(f"{node:<{width}}  {fp}")
