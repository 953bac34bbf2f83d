"""Validation of the config's tables against the schema (``schema.py``): generic over the
dataclass annotations (types, ``Range`` bounds, ``Literal`` choices), plus what a type
cannot say (pin specs, XID keys, IB counter names and device patterns, check ids). Every
problem is one ``ConfigError`` naming the file, the key path and (best effort) the line.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from slurmgpu.config.hosts import HOST_KEYS, HostSection, Table, Tables, parse_nodeset
from slurmgpu.config.schema import Range, Settings, free_threshold
from slurmgpu.config.tomltext import DictKey, KeyPath, find_line, format_value, quote, render_key
from slurmgpu.config.versions_match import spec_error
from slurmgpu.errors import ConfigError, ConfigErrors

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
_IB_DEVICE_RE = r"[^/\s]+(?:/[0-9*?\[\]!-]+)?"
# ib.hw_counters_delta_max keys: file names under ports/<n>/hw_counters.
_HW_COUNTER_RE = r"[A-Za-z0-9_]+"

# [collector] address entries: what an agent's DEALER can connect to.
_TCP_RE = r"tcp://(?:[A-Za-z0-9_.-]+|\[[0-9A-Za-z:.%]+\]):([0-9]{1,5})"
_IPC_RE = r"ipc://\S+"

# The bound for a numeric setting the schema gave no Range (a test requires one for each):
# finite, not negative, and small enough for the int64 columns of the store.
_FALLBACK_RANGE = Range(0, 2**63 - 1)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)  # keep Annotated[..., Range(...)]


def describe(value: Any) -> str:
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


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return type_name(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(format_value(a) for a in get_args(tp))
    if origin is list:
        return "an array" if get_args(tp)[0] is not str else "an array of strings"
    if origin is dict:
        return "a table"
    return {bool: "a boolean (true or false)", int: "an integer", float: "a number",
            str: "a string"}.get(tp, str(tp))


class Validator:
    def __init__(self, path: str | None, text: str, known_checks: Iterable[str] | None):
        self.path = path
        self.text = text
        self.known_checks = None if known_checks is None else sorted(set(known_checks))
        self.errors: list[ConfigError] = []  # every problem found (``collecting``)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Record a problem in ``errors`` and go on with the next key or section."""
        try:
            yield
        except ConfigError as e:
            self.errors.append(e)

    def raise_errors(self) -> None:
        """Every problem recorded, in file order: one ConfigError, or ConfigErrors."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            ordered = sorted(self.errors, key=lambda e: e.line if e.line is not None else 0)
            raise ConfigErrors(ordered)

    def error(self, key: KeyPath, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, key=render_key(key) or None,
                           line=find_line(self.text, key) if key else None)

    def unknown(self, key: KeyPath, name: str, valid: Sequence[str], what: str = "key",
                otherwise: str | None = None) -> ConfigError:
        import difflib

        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean '{close[0]}'?"
        else:
            hint = otherwise or "expected one of: " + ", ".join(valid)
        return self.error(key, f"unknown {what} '{name}' ({hint})")

    # ---- structure

    def tables(self, raw: Table, prefix: KeyPath, extra: Sequence[str]) -> Tables:
        table_types = type_hints(Settings)
        raw = self.moved(raw, prefix)
        out: Tables = {}
        for name, value in raw.items():
            if name not in extra:
                with self.collecting():
                    out[name] = self._one_table(name, value, prefix, table_types, extra)
        return out

    def _one_table(self, name: str, value: Any, prefix: KeyPath, table_types: dict[str, Any],
                   extra: Sequence[str]) -> Table:
        key = (*prefix, name)
        if name not in table_types:
            if not prefix and name in HOST_KEYS:
                raise self.error(key, f"'{name}' belongs in a [[hosts]] section")
            what = "table" if isinstance(value, dict) else "key"
            raise self.unknown(key, name, [*table_types, *extra], what)
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {describe(value)}")
        return self.table(value, table_types[name], key)

    def table(self, raw: Table, cls: type, prefix: KeyPath) -> Table:
        hints = type_hints(cls)
        table_name = str(prefix[-1])
        out: Table = {}
        for name, value in raw.items():
            key = (*prefix, name)
            with self.collecting():
                if name not in hints:
                    raise self.unknown(key, name, list(hints))
                setting = f"{table_name}.{name}"
                checked = self.value(value, hints[name], key, setting)
                self.semantics(setting, key, checked, single=isinstance(value, str))
                out[name] = checked
        return out

    def moved(self, raw: Table, prefix: KeyPath) -> Table:
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
            cls = type_hints(Settings)[new_table]
            value = self.value(section[name], type_hints(cls)[name], key, f"{new_table}.{name}")
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
            with self.collecting():
                sections.append(self._host_section(i, section))
        return sections

    def _host_section(self, i: int, section: Any) -> HostSection:
        key: KeyPath = ("hosts", i)
        if not isinstance(section, dict):
            raise self.error(key, f"expected a table, got {describe(section)}")
        if "nodes" not in section:
            raise self.error(key, "missing required key 'nodes' (a hostlist such as "
                             '"gpu-h100-[001-128]")')
        values = self.tables(section, key, extra=HOST_KEYS)  # its problems too, whatever the nodes
        nodes = self.value(section["nodes"], str, (*key, "nodes"), "hosts.nodes")
        name = None
        if "name" in section:
            name = self.value(section["name"], str, (*key, "name"), "hosts.name")
        try:
            nodeset = parse_nodeset(nodes)
        except ValueError as e:
            raise self.error((*key, "nodes"), str(e)) from None
        return HostSection(index=i, nodes=nodes.strip(), values=values, name=name, nodeset=nodeset)

    # ---- types

    def value(self, value: Any, tp: Any, key: KeyPath, setting: str,
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
                    if isinstance(value, list) and get_origin(option) is list:
                        raise  # an array where one may be: what is wrong inside it
            raise self.error(key, f"expected {type_name(tp)}, got {describe(value)}")
        if origin is Literal:
            allowed = get_args(tp)
            if any(type(value) is type(a) and value == a for a in allowed):
                return value
            raise self.error(key, f"must be {type_name(tp)}; got {describe(value)}")
        if origin is list:
            (item,) = get_args(tp)
            if item is str and isinstance(value, str):
                value = [value]
            if not isinstance(value, list):
                raise self.error(key, f"expected {type_name(tp)}, got {describe(value)}")
            return [self.value(v, item, (*key, i), setting) for i, v in enumerate(value)]
        if origin is dict:
            _, item = get_args(tp)
            if not isinstance(value, dict):
                raise self.error(key, f"expected {type_name(tp)}, got {describe(value)}")
            return {k: self.value(v, item, (*key, DictKey(k)), setting)
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
            raise self.error(key, f"expected {type_name(tp)}, got {describe(value)}")
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

    def semantics(self, setting: str, key: KeyPath, value: Any, single: bool) -> None:
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
                    raise self.error((*key, DictKey(k)), "XID must be an integer from "
                                     f"{XID_MIN} to {XID_MAX} written as a key, e.g. \"79\"")
                if int(k) in seen:
                    raise self.error((*key, DictKey(k)),
                                     f"XID {int(k)} is also set as {quote(seen[int(k)])}")
                seen[int(k)] = k
            if any(str(int(k)) != k for k in value):
                value_items = list(value.items())
                value.clear()
                value.update((str(int(k)), v) for k, v in value_items)
        elif setting in ("ib.counters_max", "ib.counters_delta_max"):
            for k in value:
                if k not in IB_COUNTERS:
                    raise self.unknown((*key, DictKey(k)), k, IB_COUNTERS, "IB counter")
        elif setting == "ib.devices":
            for i, pattern in enumerate(value):
                err = _ib_device_error(pattern)
                if err:
                    raise self.error(key if single else (*key, i), err)
        elif setting == "collector.address":
            self.addresses(key, [value] if single else value, single)
        elif setting == "disk.free_min":
            for k, v in value.items():
                err = _free_min_error(v)
                if err:
                    raise self.error((*key, DictKey(k)), err)
        elif setting in _TEXT_RULES:
            err = _TEXT_RULES[setting](value)
            if err:
                raise self.error(key, err)
        elif setting == "ib.hw_counters_delta_max":
            for k in value:
                if not re.fullmatch(_HW_COUNTER_RE, k):
                    raise self.error((*key, DictKey(k)), "not a hw_counters file name "
                                     '(letters, digits and "_", e.g. "local_ack_timeout_err")')

    def addresses(self, key: KeyPath, entries: list[str], single: bool) -> None:
        """``[collector] address``: at least one endpoint, each usable, none twice."""
        if not entries:
            raise self.error(key, 'no collector address: write one, e.g. "tcp://slurm-head:7150", '
                             'or a list of them')
        for i, entry in enumerate(entries):
            where = key if single else (*key, i)
            err = endpoint_error(entry)
            if err:
                raise self.error(where, err)
            if entry in entries[:i]:
                raise self.error(where, f"{quote(entry)} is listed twice")

    def check_ids(self, key: KeyPath, patterns: list[str], single: bool) -> None:
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


def endpoint_error(address: str) -> str | None:
    """Why a collector address is not a ZeroMQ endpoint an agent can connect to, or None:
    ``tcp://HOST:PORT`` (HOST a name, an IPv4 address or a bracketed IPv6 one) or
    ``ipc://PATH``."""
    if re.fullmatch(_IPC_RE, address):
        return None
    found = re.fullmatch(_TCP_RE, address)
    if found is None:
        return (f"not a collector endpoint: {quote(address)}; write \"tcp://HOST:PORT\", "
                'e.g. "tcp://slurm-head:7150"')
    if not 1 <= int(found.group(1)) <= 65535:
        return f"port out of range in {quote(address)} (1 to 65535)"
    return None


def _command_error(text: str) -> str | None:
    """``[remediation] repair_command``: "" or a line ``shlex`` can split."""
    import shlex

    try:
        shlex.split(text)
    except ValueError as exc:
        return f"not a command line ({exc}): quote it as a shell would"
    return None


def _tag_error(text: str) -> str | None:
    """``[remediation] operator_tag``: a word an operator writes in a drain reason."""
    if not text.strip() or text != text.strip():
        return 'must be a non-empty tag without surrounding spaces, e.g. "[validate]"'
    return None


# Settings whose string value has a form a type cannot say: setting -> its error (None: fine).
_TEXT_RULES = {"remediation.repair_command": _command_error, "remediation.job_program": _command_error,
               "remediation.operator_tag": _tag_error}


def _free_min_error(text: str) -> str | None:
    try:
        free_threshold(text)
    except (ValueError, OverflowError):
        return (f"not a free-space threshold: {quote(text)}; write a share or a size, "
                'e.g. "3%", "10G", "500M"')
    return None


def _ib_device_error(pattern: str) -> str | None:
    """Why an [ib] devices entry is malformed, or None. fnmatch takes any string, so a
    typo would silently select nothing: reject what cannot name a device or port."""
    example = 'write "<device glob>" or "<device glob>/<port glob>", e.g. "mlx5_0", "mlx5_*/1"'
    if not re.fullmatch(_IB_DEVICE_RE, pattern):
        return f"invalid device pattern {quote(pattern)}: {example}"
    for part in pattern.split("/"):
        if part.count("[") != part.count("]"):
            return f"invalid device pattern {quote(pattern)}: unbalanced [ ] in {quote(part)}"
    return None
