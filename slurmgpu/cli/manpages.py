"""Man pages for `slurmgpu` and each of its commands, written from the click commands.

``python3 -m slurmgpu.cli.manpages OUTDIR`` writes ``slurmgpu.1`` (the commands, the exit
statuses, the files) and ``slurmgpu-<command>.1`` for every command (its usage, help and
options; a group's page holds each of its subcommands). The packages run it at build
time, so a page can never disagree with ``--help``. Plain roff of the man(7) macros:
nothing beyond click is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import click

from slurmgpu import __version__

SECTION = "1"
MANUAL = "slurmgpu manual"

EXIT_STATUS = (("0", "OK"), ("1", "WARN"), ("2", "FAIL (a node check found a problem)"),
               ("3", "UNKNOWN: a bad argument, a bad config file or slurmgpu's own trouble "
                     "(one line on stderr, nothing done)"))
FILES = (("/etc/slurmgpu/slurmgpu.toml", "the configuration (minimal as shipped)"),
         ("/etc/slurmgpu/slurmgpu.d/*.toml", "drop-ins, read after it in name order; a later "
                                             "file wins"),
         ("/etc/slurmgpu/keys/", "CURVE keys (slurmgpu keys)"),
         ("/var/lib/slurmgpu/", "state: gate.jsonl, per-job state, the fleet database, reports"),
         ("/usr/share/doc/slurmgpu/", "the documentation and the commented example config"))


def escape(text: str) -> str:
    """Text safe in roff: backslashes doubled, dashes as ``\\-`` (so options stay copyable),
    and a line that would start with a control character (``.`` or ``'``) guarded."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in out.splitlines())


def paragraphs(text: str) -> str:
    """click's help text (blank-line separated paragraphs, ``\\b`` for verbatim blocks) as roff."""
    blocks = []
    for block in click.unstyle(text).strip().split("\n\n"):
        if block.startswith("\b\n"):
            blocks.append(".nf\n" + escape(block[2:]) + "\n.fi")
        else:
            blocks.append(escape(" ".join(line.strip() for line in block.splitlines())))
    return "\n.PP\n".join(b for b in blocks if b)


def options(command: click.Command, ctx: click.Context) -> Iterator[str]:
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is not None:
            yield f".TP\n.B {escape(record[0])}\n{escape(record[1]) or ' '}"


def usage(command: click.Command, ctx: click.Context) -> str:
    pieces = " ".join(command.collect_usage_pieces(ctx))
    return f".B {escape(ctx.command_path)}\n{escape(pieces)}"


def describe(command: click.Command, ctx: click.Context) -> str:
    """SYNOPSIS, DESCRIPTION and OPTIONS of one command."""
    parts = [".SH SYNOPSIS", usage(command, ctx), ".SH DESCRIPTION",
             paragraphs(command.help or command.short_help or "")]
    opts = list(options(command, ctx))
    if opts:
        parts += [".SH OPTIONS", *opts]
    return "\n".join(parts)


def subcommands(group: click.Group, ctx: click.Context) -> Iterator[str]:
    """One SS section per subcommand of ``group`` (nested groups walked too)."""
    for name, sub in visible(group, ctx):
        sub_ctx = context(sub, name, ctx)
        yield f".SS {escape(sub_ctx.command_path)}\n{usage(sub, sub_ctx)}\n.PP\n" \
              f"{paragraphs(sub.help or sub.short_help or '')}"
        opts = list(options(sub, sub_ctx))
        if opts:
            yield "\n".join(opts)
        if isinstance(sub, click.Group):
            yield from subcommands(sub, sub_ctx)


def header(name: str, summary: str) -> str:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    return (f'.TH "{name.upper()}" "{SECTION}" "{date}" "slurmgpu {__version__}" "{MANUAL}"\n'
            f".SH NAME\n{escape(name)} \\- {escape(summary)}")


def definition_list(title: str, rows: tuple[tuple[str, str], ...]) -> str:
    return "\n".join([f".SH {title}", *(f".TP\n.B {escape(k)}\n{escape(v)}" for k, v in rows)])


def command_page(name: str, command: click.Command, root: click.Context) -> str:
    ctx = context(command, name, root)
    parts = [header(f"slurmgpu-{name}", command.get_short_help_str(limit=200)),
             describe(command, ctx)]
    if isinstance(command, click.Group):
        parts += [".SH COMMANDS", *subcommands(command, ctx)]
    parts += [definition_list("EXIT STATUS", EXIT_STATUS), f'.SH SEE ALSO\n.BR slurmgpu ({SECTION})']
    return "\n".join(parts) + "\n"


def context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    """The context click would make for ``command`` (its context_settings, and the parent's
    help option names: ``-h`` too), without parsing arguments."""
    return click.Context(command, info_name=name, parent=parent, **command.context_settings)


def visible(group: click.Group, ctx: click.Context) -> list[tuple[str, click.Command]]:
    """The group's commands that --help lists, by name."""
    found = ((name, group.get_command(ctx, name)) for name in group.list_commands(ctx))
    return [(name, cmd) for name, cmd in found if cmd is not None and not cmd.hidden]


def root_page(group: click.Group, ctx: click.Context) -> str:
    listed = visible(group, ctx)
    commands = tuple((n, cmd.get_short_help_str(limit=200)) for n, cmd in listed)
    see_also = ",\n".join(f".BR slurmgpu\\-{escape(n)} ({SECTION})" for n, _ in listed)
    parts = [header("slurmgpu", group.help or ""), describe(group, ctx),
             definition_list("COMMANDS", commands), definition_list("EXIT STATUS", EXIT_STATUS),
             definition_list("FILES", FILES), f".SH SEE ALSO\n{see_also}"]
    return "\n".join(parts) + "\n"


def pages(group: click.Group) -> dict[str, str]:
    """File name -> roff text of every page."""
    ctx = context(group, "slurmgpu", None)
    out = {f"slurmgpu.{SECTION}": root_page(group, ctx)}
    for name, command in visible(group, ctx):
        out[f"slurmgpu-{name}.{SECTION}"] = command_page(name, command, ctx)
    return out


def write_pages(outdir: Path) -> list[Path]:
    from slurmgpu.cli import cli

    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages(cli).items():
        (outdir / name).write_text(text, encoding="utf-8")
        written.append(outdir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m slurmgpu.cli.manpages OUTDIR\n")
        return 2
    written = write_pages(Path(args[0]))
    print(f"{len(written)} man pages in {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
