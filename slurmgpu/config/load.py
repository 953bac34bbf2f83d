"""Load and validate the slurmgpu TOML config.

The file's top-level tables are the fields of ``Settings`` (``[gpu]``, ``[pins]``,
...). ``[[hosts]]`` sections, each with a ``nodes`` hostlist (Slurm/ClusterShell
syntax, e.g. ``"gpu-h100-[001-128],gpu-h100-[200-210]"``) and an optional
``name``, set any of the same keys for their nodes. The effective settings for a
node are: the schema defaults, then the top level, then every matching
``[[hosts]]`` section in file order. A value replaces the one before it (lists
too); dict-valued settings (``ib.counters_max``, ``xid.overrides``, ...) merge
key by key.

Validation is generic over the dataclass annotations in ``schema.py``; every
problem is one ``ConfigError`` naming the file, the key path and (best effort)
the line. This module is imported by the prolog: it keeps to the standard
library and imports ClusterShell only when the file has ``[[hosts]]`` sections.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import tomllib
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from slurmgpu.config.schema import Range, Settings
from slurmgpu.config.versions_match import spec_error
from slurmgpu.errors import ConfigError

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
    "format_value",
    "load_config",
    "numeric_settings",
    "ranges_markdown",
]

DEFAULT_PATH = "/etc/slurmgpu/slurmgpu.toml"
ENV_VAR = "SLURMGPU_CONFIG"

# Every hook reads the whole file before its watchdog can help: a real config is a few KiB,
# so anything this big is a mistake (a log, a core file, /dev/zero) to refuse, not to parse.
MAX_CONFIG_BYTES = 1024 * 1024
# A [[hosts]] hostlist is expanded into a set of names when it is parsed, so a typo such as
# "gpu-[1-99999999]" would hang every hook; its size is counted from the text first.
MAX_HOSTLIST_NODES = 100_000

# Port counters under /sys/class/infiniband/<dev>/ports/<n>/counters/.
IB_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "port_rcv_switch_relay_errors",
    "VL15_dropped",
)

XID_MIN, XID_MAX = 1, 1000

# Keys that moved to another table: old "table.key" -> the table that holds it now. A file
# that still writes the old name keeps working: the value is checked where it is written
# and read as the new key.
_MOVED = {
    "agent.flap_window_s": "ib",
    "agent.flap_count": "ib",
    "agent.flap_strikes": "ib",
}

# One [ib] devices entry: "<device glob>" or "<device glob>/<port glob>"; port numbers are
# decimal, so a port glob holds digits and glob characters only.
_IB_DEVICE_RE = re.compile(r"[^/\s]+(?:/[0-9*?\[\]!-]+)?")
# ib.hw_counters_delta_max keys: file names under ports/<n>/hw_counters.
_HW_COUNTER_RE = re.compile(r"[A-Za-z0-9_]+")

# The bound for a numeric setting the schema gave no Range (a test requires one for each):
# finite, not negative, and small enough for the int64 columns of the store.
_FALLBACK_RANGE = Range(0, 2**63 - 1)
_HOST_KEYS = ("nodes", "name")

Table = dict[str, Any]
Tables = dict[str, Table]


# --------------------------------------------------------------------------- public model


@dataclass(frozen=True)
class ExplainRow:
    key: str  # "gpu.count", 'ib.counters_max."symbol_error"'
    value: Any
    source: str  # "default", "top-level" or a section label: "hosts[1] (gpu-h100-[001-128])"


@dataclass(frozen=True)
class HostSection:
    index: int  # position among the [[hosts]] sections, from 0
    nodes: str  # the hostlist as written
    values: Tables  # validated tables this section sets
    name: str | None = None
    nodeset: Any = field(default=None, repr=False, compare=False)  # ClusterShell NodeSet

    @property
    def label(self) -> str:
        name = f" {self.name}" if self.name else ""
        return f"hosts[{self.index}]{name} ({self.nodes})"

    def matches(self, node: str) -> bool:
        nodeset = self.nodeset
        if nodeset is None:
            nodeset = _parse_nodeset(self.nodes)
            object.__setattr__(self, "nodeset", nodeset)
        try:
            return node in nodeset
        except Exception:  # a node name that is not valid hostlist syntax matches nothing
            return False


@dataclass
class LoadedConfig:
    path: str | None  # None: no file, defaults only
    base: Tables = field(default_factory=dict)  # validated top-level tables
    hosts: list[HostSection] = field(default_factory=list)

    def matching_sections(self, node: str | None) -> list[HostSection]:
        if node is None:
            return []
        return [h for h in self.hosts if h.matches(node)]

    def _layers(self, node: str | None) -> list[tuple[str, Tables]]:
        return [("top-level", self.base)] + [(h.label, h.values)
                                             for h in self.matching_sections(node)]

    def settings_for(self, node: str | None) -> Settings:
        """Defaults <- top level <- the [[hosts]] sections matching ``node``, in order.
        ``node=None``: the top level only."""
        return _build_settings([values for _, values in self._layers(node)])

    def explain(self, node: str | None) -> list[ExplainRow]:
        """Every effective setting for ``node`` and which layer set it. Dict-valued
        settings get one row per entry (an empty one gets a single row)."""
        layers = self._layers(node)
        settings = _build_settings([values for _, values in layers])
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
                        rows.append(ExplainRow(f"{key}.{_quote(k)}", v, sources[k]))
                    continue
                source = "default"
                for label, values in layers:
                    if kf.name in values.get(tf.name, {}):
                        source = label
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
    result is the defaults (``path=None``). ``known_checks``: check ids that
    ``checks.disabled`` entries must name (or match, as globs); None skips that check.
    """
    resolved, explicit = config_path(path, environ)
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
        m = re.search(r"at line (\d+)", str(e))
        raise ConfigError(f"invalid TOML: {e}", path=path,
                          line=int(m.group(1)) if m else None) from None
    except RecursionError:  # tomllib recurses per nesting level: a = [[[[...]]]]
        raise ConfigError("invalid TOML: arrays or tables nested too deeply",
                          path=path) from None
    except ValueError as e:  # not a TOMLDecodeError: int() refusing over 4300 digits
        why = "an integer with too many digits" if "digits" in str(e) else str(e)
        raise ConfigError(f"invalid TOML: {why}", path=path) from None
    v = _Validator(path, text, known_checks)
    base = v.tables(raw, (), extra=("hosts",))
    hosts = v.hosts(raw.get("hosts", []), "hosts" in raw)
    return LoadedConfig(path=path, base=base, hosts=hosts)


def format_value(value: Any) -> str:
    """A setting's value as it would be written in TOML (None: "(not set)")."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_quote(str(k))} = {format_value(v)}"
                                for k, v in value.items()) + " }"
    return str(value)


@dataclass(frozen=True)
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
    for table, cls in _hints(Settings).items():
        for name, tp in _hints(cls).items():
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


# --------------------------------------------------------------------------- validation


class _DictKey(str):
    """A key of a dict-valued setting in a key path (rendered quoted)."""


_Path = tuple[str | int, ...]


def _quote(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def _render(path: _Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, _DictKey):
            out += f".{_quote(part)}"
        else:
            out += f".{part}" if out else part
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)  # keep Annotated[..., Range(...)]


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, int):
        kind = "an integer"
    elif isinstance(value, float):
        kind = "a float"
    elif isinstance(value, str):
        kind = "a string"
    elif isinstance(value, list):
        return "an array"
    elif isinstance(value, dict):
        return "a table"
    else:
        return "a date/time"
    shown = format_value(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} ({shown})"


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _type_name(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(format_value(a) for a in get_args(tp))
    if origin is list:
        return "an array" if get_args(tp)[0] is not str else "an array of strings"
    if origin is dict:
        return "a table"
    return {bool: "a boolean (true or false)", int: "an integer", float: "a number",
            str: "a string"}.get(tp, str(tp))


def _parse_nodeset(nodes: str) -> Any:
    """Parse a hostlist; raises ValueError with a readable message."""
    if not nodes.strip():
        raise ValueError("empty hostlist")
    if "@" in nodes:
        raise ValueError(f"invalid hostlist {_quote(nodes)}: node groups (@group) are not "
                         "supported; list the nodes")
    if _hostlist_size_bound(nodes) > MAX_HOSTLIST_NODES:
        raise ValueError(f"hostlist {_quote(nodes)} names more than {MAX_HOSTLIST_NODES:,} "
                         "nodes; a typo in a range?")

    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    try:
        nodeset = NodeSet(nodes, resolver=RESOLVER_NOGROUP)
    except NodeSetException as e:
        raise ValueError(f"invalid hostlist {_quote(nodes)}: {e}") from None
    if len(nodeset) == 0:
        raise ValueError(f"hostlist {_quote(nodes)} names no nodes")
    for part in re.split(r"[,!&^]", nodes):  # NodeSet would keep "a1 a2" as one name
        if any(c.isspace() for c in part.strip()):
            raise ValueError(f"invalid hostlist {_quote(nodes)}: node names cannot contain "
                             "spaces; separate nodes and ranges with commas")
    return nodeset


_RANGE_ITEM_RE = re.compile(r"\s*(\d+)(?:-(\d+))?(?:/(\d+))?\s*")


def _hostlist_size_bound(nodes: str) -> int:
    """An upper bound on the nodes ``nodes`` expands to, from the text alone: each
    top-level element (split at ``,`` and the set operators outside brackets) counts the
    product of its bracket ranges. Malformed ranges count 0 here; NodeSet reports them."""
    total, depth, start = 0, 0, 0
    for i, c in enumerate(nodes + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and c in ",!&^":
            total += _element_size_bound(nodes[start:i])
            start = i + 1
    return total


def _element_size_bound(element: str) -> int:
    size = 1
    for group in re.findall(r"\[([^\[\]]*)\]", element):
        count = 0
        for item in group.split(","):
            m = _RANGE_ITEM_RE.fullmatch(item)
            if not m:
                continue
            lo, hi, step = m.groups()
            if max(len(lo), len(hi or "")) > 18:  # also keeps int() under its digit limit
                return MAX_HOSTLIST_NODES + 1
            span = int(hi) - int(lo) if hi else 0
            count += max(span, 0) // max(int(step or 1), 1) + 1
        size *= max(count, 1)
        if size > MAX_HOSTLIST_NODES:  # stop before the product itself grows huge
            return size
    return size


class _Validator:
    def __init__(self, path: str | None, text: str, known_checks: Iterable[str] | None):
        self.path = path
        self.text = text
        self.known_checks = None if known_checks is None else sorted(set(known_checks))

    def error(self, key: _Path, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, key=_render(key) or None,
                           line=_find_line(self.text, key) if key else None)

    def unknown(self, key: _Path, name: str, valid: Sequence[str], what: str = "key",
                otherwise: str | None = None) -> ConfigError:
        import difflib

        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean '{close[0]}'?"
        else:
            hint = otherwise or "expected one of: " + ", ".join(valid)
        return self.error(key, f"unknown {what} '{name}' ({hint})")

    # ---- structure

    def tables(self, raw: Table, prefix: _Path, extra: Sequence[str]) -> Tables:
        table_types = _hints(Settings)
        raw = self.moved(raw, prefix)
        out: Tables = {}
        for name, value in raw.items():
            if name in extra:
                continue
            key = (*prefix, name)
            if name not in table_types:
                if not prefix and name in _HOST_KEYS:
                    raise self.error(key, f"'{name}' belongs in a [[hosts]] section")
                what = "table" if isinstance(value, dict) else "key"
                raise self.unknown(key, name, [*table_types, *extra], what)
            if not isinstance(value, dict):
                raise self.error(key, f"expected a table, got {_describe(value)}")
            out[name] = self.table(value, table_types[name], key)
        return out

    def table(self, raw: Table, cls: type, prefix: _Path) -> Table:
        hints = _hints(cls)
        table_name = str(prefix[-1])
        out: Table = {}
        for name, value in raw.items():
            key = (*prefix, name)
            if name not in hints:
                raise self.unknown(key, name, list(hints))
            setting = f"{table_name}.{name}"
            checked = self.value(value, hints[name], key, setting)
            self.semantics(setting, key, checked, single=isinstance(value, str))
            out[name] = checked
        return out

    def moved(self, raw: Table, prefix: _Path) -> Table:
        """``raw`` with the old names of moved keys (``_MOVED``) read as their new key."""
        for old, new_table in _MOVED.items():
            table, name = old.split(".")
            section, target = raw.get(table), raw.get(new_table, {})
            if not isinstance(section, dict) or name not in section or not isinstance(target, dict):
                continue  # nothing to move, or tables() reports the wrong type
            key = (*prefix, table, name)
            if name in target:
                raise self.error(key, f"moved to [{new_table}] {name}, which is set too; "
                                 "remove this one")
            cls = _hints(Settings)[new_table]
            value = self.value(section[name], _hints(cls)[name], key, f"{new_table}.{name}")
            raw = {**raw, table: {k: v for k, v in section.items() if k != name},
                   new_table: {**target, name: value}}
        return raw

    def hosts(self, raw: Any, present: bool) -> list[HostSection]:
        if not present:
            return []
        if not isinstance(raw, list):
            raise self.error(("hosts",), "expected an array of tables: write each section "
                             "as [[hosts]] (double brackets)")
        sections: list[HostSection] = []
        for i, section in enumerate(raw):
            key: _Path = ("hosts", i)
            if not isinstance(section, dict):
                raise self.error(key, f"expected a table, got {_describe(section)}")
            if "nodes" not in section:
                raise self.error(key, "missing required key 'nodes' (a hostlist such as "
                                 '"gpu-h100-[001-128]")')
            nodes = self.value(section["nodes"], str, (*key, "nodes"), "hosts.nodes")
            name = None
            if "name" in section:
                name = self.value(section["name"], str, (*key, "name"), "hosts.name")
            try:
                nodeset = _parse_nodeset(nodes)
            except ValueError as e:
                raise self.error((*key, "nodes"), str(e)) from None
            values = self.tables(section, key, extra=_HOST_KEYS)
            sections.append(HostSection(index=i, nodes=nodes.strip(), values=values, name=name,
                                        nodeset=nodeset))
        return sections

    # ---- types

    def value(self, value: Any, tp: Any, key: _Path, setting: str,
              bounds: Range | None = None) -> Any:
        """``value`` checked against the annotation ``tp``; ``bounds``: the Range of the
        Annotated around it, applied once the value is known to be a number."""
        origin = get_origin(tp)
        if origin is Annotated:
            base, *extras = get_args(tp)
            bounds = next((x for x in extras if isinstance(x, Range)), bounds)
            return self.value(value, base, key, setting, bounds)
        if origin in (Union, types.UnionType):
            # TOML has no null: None is only ever a default (omit the key to keep it).
            options = [a for a in get_args(tp) if a is not type(None)]
            if len(options) == 1:
                return self.value(value, options[0], key, setting, bounds)
            for option in options:
                try:
                    return self.value(value, option, key, setting, bounds)
                except ConfigError:
                    pass
            raise self.error(key, f"expected {_type_name(tp)}, got {_describe(value)}")
        if origin is Literal:
            allowed = get_args(tp)
            if any(type(value) is type(a) and value == a for a in allowed):
                return value
            raise self.error(key, f"must be {_type_name(tp)}; got {_describe(value)}")
        if origin is list:
            (item,) = get_args(tp)
            if item is str and isinstance(value, str):
                value = [value]
            if not isinstance(value, list):
                raise self.error(key, f"expected {_type_name(tp)}, got {_describe(value)}")
            return [self.value(v, item, (*key, i), setting) for i, v in enumerate(value)]
        if origin is dict:
            _, item = get_args(tp)
            if not isinstance(value, dict):
                raise self.error(key, f"expected {_type_name(tp)}, got {_describe(value)}")
            return {k: self.value(v, item, (*key, _DictKey(k)), setting)
                    for k, v in value.items()}
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif tp is str:
            ok = isinstance(value, str)
        else:  # pragma: no cover - a schema annotation this loader does not know
            raise TypeError(f"unsupported annotation {tp!r} for {setting}")
        if not ok:
            raise self.error(key, f"expected {_type_name(tp)}, got {_describe(value)}")
        if tp is int or tp is float:
            bounds = bounds or _FALLBACK_RANGE
            # NaN fails every comparison and +-inf lies outside any finite span, so the
            # range test alone refuses them; the message says "finite" for clarity.
            if value not in bounds:
                finite = ("" if isinstance(value, int) or math.isfinite(value)
                          else "a finite number, ")
                raise self.error(key, f"must be {finite}{bounds.describe('from ')}; "
                                 f"got {_shown_number(value)}")
            return float(value) if tp is float else value
        return value

    # ---- meaning

    def semantics(self, setting: str, key: _Path, value: Any, single: bool) -> None:
        table = setting.split(".", 1)[0]
        if table == "pins" and isinstance(value, list):
            for i, spec in enumerate(value):
                err = spec_error(spec)
                if err:
                    raise self.error(key if single else (*key, i), err)
        elif setting == "checks.disabled" and self.known_checks is not None:
            self.check_ids(key, value, single)
        elif setting == "xid.overrides":
            seen: dict[int, str] = {}
            for k in value:
                if not re.fullmatch(r"[0-9]+", k) or not XID_MIN <= int(k) <= XID_MAX:
                    raise self.error((*key, _DictKey(k)), "XID must be an integer from "
                                     f"{XID_MIN} to {XID_MAX} written as a key, e.g. \"79\"")
                if int(k) in seen:
                    raise self.error((*key, _DictKey(k)),
                                     f"XID {int(k)} is also set as {_quote(seen[int(k)])}")
                seen[int(k)] = k
            if any(str(int(k)) != k for k in value):
                value_items = list(value.items())
                value.clear()
                value.update((str(int(k)), v) for k, v in value_items)
        elif setting in ("ib.counters_max", "ib.counters_delta_max"):
            for k in value:
                if k not in IB_COUNTERS:
                    raise self.unknown((*key, _DictKey(k)), k, IB_COUNTERS, "IB counter")
        elif setting == "ib.devices":
            for i, pattern in enumerate(value):
                err = _ib_device_error(pattern)
                if err:
                    raise self.error(key if single else (*key, i), err)
        elif setting == "ib.hw_counters_delta_max":
            for k in value:
                if not _HW_COUNTER_RE.fullmatch(k):
                    raise self.error((*key, _DictKey(k)), "not a hw_counters file name "
                                     '(letters, digits and "_", e.g. "local_ack_timeout_err")')

    def check_ids(self, key: _Path, patterns: list[str], single: bool) -> None:
        import fnmatch

        known = self.known_checks or []
        for i, pattern in enumerate(patterns):
            where = key if single else (*key, i)
            if pattern in known:
                continue
            is_glob = any(c in pattern for c in "*?[")
            if is_glob and any(fnmatch.fnmatchcase(c, pattern) for c in known):
                continue
            if _plugin_pattern(pattern):
                continue
            if is_glob:
                raise self.error(where, f"pattern '{pattern}' matches no check")
            raise self.unknown(where, pattern, known, "check",
                               otherwise="see `slurmgpu checks list`")


def _plugin_pattern(pattern: str) -> bool:
    """True for a ``checks.disabled`` entry in a namespace site plugins use: ``site.*``,
    ``plugin.*`` (a plugin's loader check) or an installed plugin distribution's. Such an
    entry is valid whether or not a plugin registers that id (a plugin that fails to load,
    or ``plugins = false``, must not make the config invalid). Entries in other namespaces
    must name a built-in check (``known_checks``)."""
    namespace, dot, _ = pattern.partition(".")
    if not dot or any(c in namespace for c in "*?["):
        return False
    if namespace in ("site", "plugin"):
        return True
    try:  # entry-point metadata only: no plugin is imported to validate a config
        from slurmgpu.checks.plugins import installed_namespaces
    except ImportError:  # pragma: no cover - the config loaded without the registry
        return False
    return namespace in installed_namespaces()


def _shown_number(value: float) -> str:
    shown = format_value(value)
    return shown if len(shown) <= 40 else f"{shown[:20]}... ({len(shown)} digits)"


def _ib_device_error(pattern: str) -> str | None:
    """Why an [ib] devices entry is malformed, or None. fnmatch takes any string, so a
    typo would silently select nothing: reject what cannot name a device or port."""
    example = 'write "<device glob>" or "<device glob>/<port glob>", e.g. "mlx5_0", "mlx5_*/1"'
    if not _IB_DEVICE_RE.fullmatch(pattern):
        return f"invalid device pattern {_quote(pattern)}: {example}"
    for part in pattern.split("/"):
        if part.count("[") != part.count("]"):
            return f"invalid device pattern {_quote(pattern)}: unbalanced [ ] in {_quote(part)}"
    return None


# --------------------------------------------------------------------------- line numbers


@functools.cache
def _key_part() -> re.Pattern[str]:  # compiled on first use: only error messages need it
    bare = r"[A-Za-z0-9_-]+"
    return re.compile(rf"\s*(?:({bare})|\"((?:[^\"\\]|\\.)*)\"|'([^']*)')\s*")


def _parse_key(s: str, pos: int) -> tuple[list[str], int] | None:
    """A dotted key starting at ``s[pos]``: its parts and the position after it."""
    parts: list[str] = []
    while True:
        m = _key_part().match(s, pos)
        if not m:
            return None
        bare, basic, literal = m.groups()
        if bare is not None:
            parts.append(bare)
        elif basic is not None:
            try:
                parts.append(json.loads(f'"{basic}"'))
            except ValueError:
                parts.append(basic)
        else:
            parts.append(literal)
        pos = m.end()
        if pos < len(s) and s[pos] == ".":
            pos += 1
            continue
        return parts, pos


def _find_line(text: str, target: _Path) -> int | None:
    """Best-effort line of ``target`` (a key path; ints index [[arrays]]): the line that
    sets it, else the header or dotted key of the nearest enclosing table."""
    want = [str(p) if isinstance(p, str) else p for p in target]
    arrays: dict[tuple[str, ...], int] = {}
    region: list[str | int] = []
    best_line, best_score = None, 0
    multiline: str | None = None

    def consider(full: list[str | int], lineno: int) -> None:
        nonlocal best_line, best_score
        n = min(len(full), len(want))
        if full[:n] != want[:n]:
            return
        if n > best_score:
            best_line, best_score = lineno, n

    for lineno, line in enumerate(text.splitlines(), 1):
        if multiline:
            if line.count(multiline) % 2 == 1:
                multiline = None
            continue
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("["):
            is_array = s.startswith("[[")
            parsed = _parse_key(s, 2 if is_array else 1)
            if parsed is None:
                continue
            names = tuple(parsed[0])
            path: list[str | int] = []
            for i in range(len(names)):
                path.append(names[i])
                prefix = names[: i + 1]
                if is_array and i == len(names) - 1:
                    arrays[prefix] = arrays.get(prefix, -1) + 1
                    for k in [k for k in arrays if len(k) > len(prefix) and
                              k[: len(prefix)] == prefix]:
                        del arrays[k]
                if prefix in arrays:
                    path.append(arrays[prefix])
            region = path
            consider(region, lineno)
            continue
        parsed = _parse_key(s, 0)
        if parsed is None or parsed[1] >= len(s) or s[parsed[1]] != "=":
            continue
        consider([*region, *parsed[0]], lineno)
        rest = s[parsed[1] + 1:]
        for quote in ('"""', "'''"):
            if rest.count(quote) % 2 == 1:
                multiline = quote
    return best_line
