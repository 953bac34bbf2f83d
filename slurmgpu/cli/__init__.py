"""The `slurmgpu` command. Subcommand groups live one per module in this package.

Exit codes follow the Nagios plugin convention: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN.
A bad argument or bad config is one line on stderr and exit 3, with nothing done.
Commands raise their errors (``slurmgpu.cli.common``); only the root group prints them
(``slurmgpu.cli.root``), for the real program and for in-process callers alike.

The click group (``cli``, ``COMMANDS``) lives in ``slurmgpu.cli.root`` and is imported on
first use: the one-shot commands (`check` and the Slurm hooks, once per job) run through
``slurmgpu.cli.oneshot`` without click, and must not import zmq, the collector or the
report either.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, NoReturn

# Run once per job or health poll and then done: `main()` runs them without click
# (slurmgpu.cli.oneshot) and leaves them with os._exit.
ONE_SHOT = frozenset({"check", "prolog", "epilog", "healthcheck"})
#: Names that ``from slurmgpu.cli import ...`` finds in slurmgpu.cli.root (imports click).
ROOT_NAMES = frozenset({"cli", "COMMANDS", "RootGroup"})


def __getattr__(name: str) -> Any:
    if name in ROOT_NAMES:
        from slurmgpu.cli import root

        return getattr(root, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ONE_SHOT:
        # A one-shot run makes next to no cyclic garbage: the collector would only rescan,
        # dozens of times, the objects its imports make to keep (docs/benchmarks.md).
        gc.disable()
        from slurmgpu.cli.oneshot import run

        fast = run(args)
        if fast is not None:
            exit_now(fast)
    from slurmgpu.cli.root import cli

    code = cli.main(args=args, prog_name="slurmgpu", standalone_mode=False)
    # The group's own options (--help, --version) take no value, so args[0] is either one
    # of them or the command that ran (`check --help` too: exiting fast is harmless then).
    if args and args[0] in ONE_SHOT:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int) -> NoReturn:
    """Flush what the command wrote and leave without interpreter teardown (freeing every
    module, atexit hooks): ~19 ms per prolog/check for nothing. Only for the real entry
    point, once the result is known; in-process callers (click's CliRunner in tests)
    never get here, as they call the group, not ``main``."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # what logging's atexit hook does: flush and close the handlers
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: the exit code still matters
            pass
    os._exit(code)
