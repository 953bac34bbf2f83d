"""`slurmgpu.cli.oneshot` reads the one-shot commands' options as click would, and hands
everything else (help, bad options) to click."""

from __future__ import annotations

from typing import Any

import pytest

from slurmgpu.cli import cli
from slurmgpu.cli.oneshot import parse

DEFAULTS: dict[str, dict[str, Any]] = {
    "check": {"config_file": None, "gpus": None, "node": None, "xids": (), "as_json": False,
              "show_all": False, "log_level": "error"},
    "prolog": {"config_file": None}, "epilog": {"config_file": None}, "healthcheck": {"config_file": None},
}


def clicks(command: str, args: list[str]) -> dict[str, Any]:
    """The parameters click gives ``command`` for ``args``."""
    group_ctx = cli.make_context("slurmgpu", [command, *args], resilient_parsing=True)
    sub = cli.get_command(group_ctx, command)
    assert sub is not None
    return dict(sub.make_context(command, list(args), parent=group_ctx).params)


def ours(command: str, args: list[str]) -> dict[str, Any] | None:
    found = parse(command, args)
    if found is None:
        return None
    merged = {**DEFAULTS[command], **found}
    if "xids" in found:
        merged["xids"] = tuple(found["xids"])
    return merged


@pytest.mark.parametrize(("command", "args"), [
    ("check", []),
    ("check", ["--json", "--config", "/etc/x.toml", "--node", "n1"]),
    ("check", ["--gpus=0,2", "--xid", "79:3", "--xid=48:1:Double Bit", "--all", "--log-level", "info"]),
    ("check", ["--config", "a", "--config", "b"]),
    ("check", ["--config="]),
    ("prolog", ["--config", "/etc/slurmgpu/slurmgpu.toml"]),
    ("epilog", ["--config=/x"]),
    ("healthcheck", []),
])
def test_plain_options_read_as_click_reads_them(command: str, args: list[str]) -> None:
    assert ours(command, args) == clicks(command, args)


@pytest.mark.parametrize(("command", "args"), [
    ("check", ["--help"]), ("check", ["-h"]), ("prolog", ["--help"]), ("check", ["--bogus"]),
    ("check", ["--gpus"]), ("check", ["--log-level", "loud"]), ("check", ["--json=yes"]),
    ("prolog", ["--json"]), ("epilog", ["extra"]), ("check", ["--gpus", "-1"]), ("prolog", ["--"]),
])
def test_the_rest_goes_to_click(command: str, args: list[str]) -> None:
    assert parse(command, args) is None
