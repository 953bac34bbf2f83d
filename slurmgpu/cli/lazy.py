"""A click group whose subcommands are imported only when one of them is used.

`slurmgpu check` and the Slurm hooks are started fresh for every job; importing every
command module up front would make them pay for zmq, the CURVE keys, the collector and
the report on each run. A `LazyGroup` keeps a static table instead and imports a
command's module only when that command is invoked (or its own help is asked for);
the group's `--help` listing is rendered from the table, so it imports none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import click


class LazyCommand(NamedTuple):
    """Where a subcommand lives: ``getattr(import_module(module), attribute)``."""

    module: str
    attribute: str
    # The first sentence of the command's help: what the group's --help lists.
    # tests/test_cold_imports.py checks that it matches the real command.
    short_help: str


class LazyGroup(click.Group):
    """A `click.Group` with eagerly registered commands plus a table of lazy ones."""

    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, LazyCommand] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            # Registered once loaded, so later look-ups (and `commands`) see it.
            self.add_command(self.load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def load(self, name: str) -> click.Command:
        """Import the module of lazy command ``name`` and return the command."""
        entry = self.lazy[name]
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{entry.module}.{entry.attribute} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Like `click.Group.format_commands`, but an unloaded command is listed from the
        table through a stand-in, so the text is shortened exactly as click would."""
        listed = [(name, self._listed(name)) for name in self.list_commands(ctx)]
        rows = [(name, cmd) for name, cmd in listed if not cmd.hidden]
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)  # as click computes it
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

    def _listed(self, name: str) -> click.Command:
        loaded = self.commands.get(name)
        if loaded is not None:
            return loaded
        return click.Command(name, help=self.lazy[name].short_help)
