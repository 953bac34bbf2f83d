"""Load and validate the slurmgpu TOML config.

The file's top-level tables are the fields of ``Settings`` (``[gpu]``, ``[pins]``,
...). ``[[hosts]]`` sections, each with a ``nodes`` hostlist (Slurm/ClusterShell
syntax, e.g. ``"gpu-h100-[001-128],gpu-h100-[200-210]"``) and an optional
``name``, set any of the same keys for their nodes. The effective settings for a
node are: the schema defaults, then the top level, then every matching
``[[hosts]]`` section in file order. A value replaces the one before it (lists
too); dict-valued settings (``ib.counters_max``, ``xid.overrides``, ...) merge
key by key.

Design notes: docs/design-notes.md (``slurmgpu/config/load.py``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Annotated, Any, Union, get_args, get_origin

from slurmgpu.config.env import CONFIG_ENV, DEFAULT_CONFIG_PATH, apply_env, apply_flags, overrides
from slurmgpu.config.hosts import MAX_HOSTLIST_NODES, HostSection, Table, Tables
from slurmgpu.config.schema import Range, Settings
from slurmgpu.config.tomltext import format_value, quote
from slurmgpu.config.validate import IB_COUNTERS, Validator, type_hints
from slurmgpu.errors import ConfigError
from slurmgpu.record import record

__all__ = [
    "DEFAULT_PATH",
    "ENV_VAR",
    "IB_COUNTERS",
    "MAX_CONFIG_BYTES",
    "MAX_HOSTLIST_NODES",
    "ExplainRow",
    "HostSection",
    "LoadedConfig",
    "NumericSetting",
    "config_path",
    "dropin_dir",
    "dropin_files",
    "format_value",
    "load_config",
    "numeric_settings",
    "ranges_markdown",
]

DEFAULT_PATH = DEFAULT_CONFIG_PATH
ENV_VAR = CONFIG_ENV

# Every hook reads the whole file before its watchdog can help: a real config is a few KiB,
# so anything this big is a mistake (a log, a core file, /dev/zero) to refuse, not to parse.
MAX_CONFIG_BYTES = 1024 * 1024


# --------------------------------------------------------------------------- public model


@record(frozen=True)
class ExplainRow:
    """One effective setting and where its value came from."""

    key: str  # "gpu.count", 'ib.counters_max."symbol_error"'
    value: Any
    source: str  # "default", "top-level" or a section label: "hosts[1] (gpu-h100-[001-128])"


@record
class LoadedConfig:
    """A validated config file: its top-level tables and host sections."""

    path: str | None  # None: no file, defaults only
    base: Tables = field(default_factory=dict)  # validated top-level tables
    hosts: list[HostSection] = field(default_factory=list)
    # The drop-in files read after this one, in order (each a LoadedConfig of its own).
    dropins: list[LoadedConfig] = field(default_factory=list)

    @property
    def all_hosts(self) -> list[HostSection]:
        """The [[hosts]] sections of this file and then of every drop-in."""
        return [*self.hosts, *(h for d in self.dropins for h in d.hosts)]

    def matching_sections(self, node: str | None) -> list[HostSection]:
        if node is None:
            return []
        return [h for h in self.all_hosts if h.matches(node)]

    def _layers(self, node: str | None) -> list[tuple[str, Tables]]:
        return self._own_layers(node, "") + [
            layer for d in self.dropins
            for layer in d._own_layers(node, os.path.basename(d.path or "") + ": ")]

    def _own_layers(self, node: str | None, prefix: str) -> list[tuple[str, Tables]]:
        own = [h for h in self.hosts if node is not None and h.matches(node)]
        return [(prefix + "top-level", self.base)] + [(prefix + h.label, h.values) for h in own]

    def settings_for(self, node: str | None, environ: Mapping[str, str] = os.environ,
                     flags: Mapping[str, Any] | None = None) -> Settings:
        """The settings for ``node``, in the one order (``slurmgpu.config.env``): defaults
        <- top level <- the [[hosts]] sections matching ``node``, in file order <- the
        ``SLURMGPU_*`` variables of ``environ`` <- ``flags`` (``{"collector.db": ...}``,
        None values not given). ``node=None``: the top level only; ``environ={}``: the
        file alone."""
        settings = _build_settings([values for _, values in self._layers(node)])
        return apply_flags(apply_env(settings, environ), flags)

    def explain(self, node: str | None, environ: Mapping[str, str] = os.environ) -> list[ExplainRow]:
        """Every effective setting for ``node`` and which layer set it (a variable:
        ``$SLURMGPU_...``). Dict-valued settings get one row per entry (an empty one
        gets a single row)."""
        layers = self._layers(node)
        settings = apply_env(_build_settings([values for _, values in layers]), environ)
        from_env = overrides(environ)
        defaults = Settings()
        rows: list[ExplainRow] = []
        for tf in dataclasses.fields(Settings):
            table = getattr(settings, tf.name)
            for kf in dataclasses.fields(table):
                key = f"{tf.name}.{kf.name}"
                value = getattr(table, kf.name)
                if isinstance(value, dict):
                    default = getattr(getattr(defaults, tf.name), kf.name)
                    sources = dict.fromkeys(default, "default")
                    for label, values in layers:
                        for k in values.get(tf.name, {}).get(kf.name, {}):
                            sources[k] = label
                    if not value:
                        rows.append(ExplainRow(key, {}, "default"))
                    for k, v in value.items():
                        rows.append(ExplainRow(f"{key}.{quote(k)}", v, sources[k]))
                    continue
                source = "default"
                for label, values in layers:
                    if kf.name in values.get(tf.name, {}):
                        source = label
                if key in from_env:
                    source = "$" + from_env[key][0]
                rows.append(ExplainRow(key, value, source))
        return rows


def config_path(explicit: str | None = None,
                environ: Mapping[str, str] = os.environ) -> tuple[str, bool]:
    """The config file to read and whether it was asked for explicitly:
    ``--config`` > ``$SLURMGPU_CONFIG`` > ``DEFAULT_PATH``. A missing file is an error
    only when it was asked for explicitly."""
    if explicit:
        return explicit, True
    env = environ.get(ENV_VAR)
    if env:
        return env, True
    return DEFAULT_PATH, False


def load_config(path: str | None = None, *, environ: Mapping[str, str] = os.environ,
                known_checks: Iterable[str] | None = None) -> LoadedConfig:
    """Read and validate the config. ``path`` is the ``--config`` value (or None).

    With no ``--config``/``$SLURMGPU_CONFIG`` and no file at ``DEFAULT_PATH`` the
    result is the defaults (``path=None``) and the drop-ins. ``known_checks``: check ids
    that ``checks.disabled`` entries must name (or match, as globs); None skips that check.
    """
    resolved, explicit = config_path(path, environ)
    dropins = [_read_config(f, True, known_checks) for f in dropin_files(resolved)]
    loaded = _read_config(resolved, explicit, known_checks)
    loaded.dropins = dropins
    return loaded


def dropin_dir(path: str) -> str:
    """The drop-in directory of the config file ``path``: ``slurmgpu.toml`` -> ``slurmgpu.d``."""
    root, ext = os.path.splitext(path)
    return (root if ext == ".toml" else path) + ".d"


def dropin_files(path: str) -> list[str]:
    """The ``*.toml`` files of ``dropin_dir(path)`` in byte order of their names (none when
    the directory is absent). Hidden files and other suffixes (``.dpkg-old``, ``.rpmnew``,
    an editor's ``~``) are not read."""
    directory = dropin_dir(path)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise ConfigError(f"cannot list the drop-in directory: {e.strerror or e}",
                          path=directory) from None
    wanted = (n for n in names if n.endswith(".toml") and not n.startswith("."))
    return [os.path.join(directory, n) for n in sorted(wanted, key=os.fsencode)]


def _read_config(resolved: str, explicit: bool,
                 known_checks: Iterable[str] | None) -> LoadedConfig:
    """One file, validated; a missing one is the defaults unless ``explicit``."""
    try:
        with open(resolved, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)  # bounded: a FIFO or /dev/zero cannot hang us
    except FileNotFoundError:
        if not explicit:
            return LoadedConfig(path=None)
        raise ConfigError("config file not found", path=resolved) from None
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror or e}", path=resolved) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file is larger than {MAX_CONFIG_BYTES // 1024} KiB; "
                          "is this the right file?", path=resolved)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not valid UTF-8 (byte {e.start})", path=resolved) from None
    return parse_config(text, path=resolved, known_checks=known_checks)


def parse_config(text: str, *, path: str | None = None,
                 known_checks: Iterable[str] | None = None) -> LoadedConfig:
    """Validate config text (``path`` is only used in messages)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"invalid TOML: {e}", path=path, line=_toml_error_line(str(e), text)) from None
    except RecursionError:  # tomllib recurses per nesting level: a = [[[[...]]]]
        raise ConfigError("invalid TOML: arrays or tables nested too deeply",
                          path=path) from None
    except ValueError as e:  # not a TOMLDecodeError: int() refusing over 4300 digits
        why = "an integer with too many digits" if "digits" in str(e) else str(e)
        raise ConfigError(f"invalid TOML: {why}", path=path) from None
    v = Validator(path, text, known_checks)
    base: Tables = {}
    hosts: list[HostSection] = []
    with v.collecting():
        base = v.tables(raw, (), extra=("hosts",))
    with v.collecting():
        hosts = v.hosts(raw.get("hosts", []), "hosts" in raw)
    v.raise_errors()
    return LoadedConfig(path=path, base=base, hosts=hosts)


def _toml_error_line(message: str, text: str) -> int:
    """The line a TOML syntax error is on: tomllib's "at line N", else (an error "at end
    of document": an unclosed array, string or table) the file's last non-blank line."""
    m = re.search(r"at line (\d+)", message)
    if m:
        return int(m.group(1))
    lines = text.splitlines()
    return max((i for i, line in enumerate(lines, 1) if line.strip()), default=1)


@record(frozen=True)
class NumericSetting:
    """One numeric setting of the schema and its Range (``slurmgpu config ranges``)."""

    table: str
    name: str
    kind: type  # int or float
    bounds: Range | None  # None only for a schema bug (a test requires one everywhere)
    default: Any  # a number, None (not checked), or the default dict of a per-entry setting
    per_entry: bool  # a dict-valued setting (ib.counters_max): the range applies to each entry

    @property
    def key(self) -> str:
        return f"{self.table}.{self.name}" + (".<entry>" if self.per_entry else "")


def numeric_settings() -> list[NumericSetting]:
    """Every numeric setting in schema order, found from the annotations (so a new
    setting cannot miss the ranges table or the tests that iterate it)."""
    out: list[NumericSetting] = []
    defaults = Settings()
    for table, cls in type_hints(Settings).items():
        for name, tp in type_hints(cls).items():
            found = _numeric(tp)
            if found:
                kind, bounds, per_entry = found
                default = getattr(getattr(defaults, table), name)
                out.append(NumericSetting(table, name, kind, bounds, default, per_entry))
    return out


def _numeric(tp: Any, bounds: Range | None = None,
             per_entry: bool = False) -> tuple[type, Range | None, bool] | None:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        bounds = next((x for x in extras if isinstance(x, Range)), bounds)
        return _numeric(base, bounds, per_entry)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return _numeric(options[0], bounds, per_entry) if len(options) == 1 else None
    if origin is dict:
        return _numeric(get_args(tp)[1], bounds, True)
    if tp is int or tp is float:
        return tp, bounds, per_entry
    return None


def ranges_markdown() -> str:
    """The allowed range of every numeric setting as a Markdown table (the body of
    docs/config-ranges.md, which a test keeps equal to this)."""
    lines = [
        "# Config ranges",
        "",
        "Generated from `slurmgpu/config/schema.py` by `slurmgpu config ranges`; do not edit.",
        "",
        "Every numeric setting must lie in its range (bounds included). NaN, `inf` and",
        "`-inf` are refused everywhere. A value outside its range is a config error: one",
        "line naming the file, line and key, and exit status 3 from `slurmgpu config check`",
        "and from every command that loads the config. `[[hosts]]` sections are held to",
        f"the same ranges. The file itself may be at most {MAX_CONFIG_BYTES // 1024} KiB, and",
        f"a `[[hosts]]` hostlist may name at most {MAX_HOSTLIST_NODES:,} nodes.",
        "",
        "| Setting | Type | Allowed | Default |",
        "|---|---|---|---|",
    ]
    for n in numeric_settings():
        kind = "integer" if n.kind is int else "number"
        allowed = n.bounds.describe() if n.bounds else "(no range declared)"
        if n.per_entry:
            default = ", ".join(f"{k} = {format_value(v)}" for k, v in n.default.items())
            default = default or "{}"
        else:
            default = format_value(n.default)
        lines.append(f"| `{n.key}` | {kind} | {allowed} | {default} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- merging


def _build_settings(layers: Sequence[Tables]) -> Settings:
    settings = Settings()
    for tf in dataclasses.fields(Settings):
        table = getattr(settings, tf.name)
        changes: Table = {}
        for layer in layers:
            for key, value in layer.get(tf.name, {}).items():
                if isinstance(value, dict):
                    before = changes.get(key, getattr(table, key))
                    changes[key] = {**before, **value}
                elif isinstance(value, list):
                    changes[key] = list(value)
                else:
                    changes[key] = value
        if changes:
            setattr(settings, tf.name, dataclasses.replace(table, **changes))
    return settings
