"""The one-shot commands (`check`, `prolog`, `epilog`, `healthcheck`) without click.

They start fresh for every job or health poll, so the real entry point
(``slurmgpu.cli.main``) reads their options here, with the standard library, and runs
them directly. Only the plain forms are read here (``--opt VALUE``, ``--opt=VALUE``,
flags); anything else (``--help``, an unknown option, a missing value, a bad choice)
gets ``None`` and goes to the click commands, which print the same help and the same
one-line usage errors (exit 3) as always. Importing this module imports nothing but
the standard library: a hook whose install is broken still reaches ``on_error``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

#: Per command: each option that takes a value -> its parameter ("xids": repeatable).
VALUED: dict[str, dict[str, str]] = {
    "check": {"--config": "config_file", "--gpus": "gpus", "--node": "node", "--xid": "xids",
              "--log-level": "log_level"},
    "prolog": {"--config": "config_file"},
    "epilog": {"--config": "config_file"},
    "healthcheck": {"--config": "config_file"},
}
#: Per command: each flag -> its parameter.
FLAGS: dict[str, dict[str, str]] = {"check": {"--json": "as_json", "--all": "show_all"}}
LOG_LEVELS = ("debug", "info", "warning", "error")
EXIT_UNKNOWN = 3


def parse(command: str, args: Sequence[str]) -> dict[str, Any] | None:
    """``command``'s parameters from ``args``; None when click must read them."""
    valued, flags = VALUED[command], FLAGS.get(command, {})
    found: dict[str, Any] = {}
    rest = list(args)
    while rest:
        name, eq, value = rest.pop(0).partition("=")
        if name in flags and not eq:
            found[flags[name]] = True
            continue
        if name not in valued:
            return None
        if not eq:
            if not rest or rest[0].startswith("-"):
                return None
            value = rest.pop(0)
        if valued[name] == "xids":
            found.setdefault("xids", []).append(value)
        else:
            found[valued[name]] = value
    return found if found.get("log_level", "error") in LOG_LEVELS else None


def run(args: Sequence[str]) -> int | None:
    """Run ``args`` (``[command, *options]``); its exit code, or None when click must."""
    options = parse(args[0], args[1:])
    if options is None:
        return None
    if args[0] == "check":
        return check(options)
    from slurmgpu.cli.hooks import run_hook

    return run_hook(args[0], options.get("config_file"))


def check(options: dict[str, Any]) -> int:
    """`slurmgpu check`: a bad argument or config is one line on stderr and exit 3."""
    from slurmgpu.cli.checkrun import run_check
    from slurmgpu.errors import SlurmGpuError, error_line, first_line

    try:
        return run_check(options.get("config_file"), options.get("gpus"), options.get("node"),
                         options.get("xids", []), as_json=options.get("as_json", False),
                         show_all=options.get("show_all", False),
                         log_level=options.get("log_level", "error"))
    except SlurmGpuError as exc:
        sys.stderr.write(error_line(first_line(exc)) + "\n")
        return EXIT_UNKNOWN
