"""Config text: values and key paths as TOML spells them, and the line a key is on.

Error messages and ``slurmgpu config explain`` show values and keys as a file would write
them (``format_value``, ``render_key``); ``find_line`` finds, best effort, the line of the
file that sets a key. Standard library only (the prolog imports the config loader).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any


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
        return "{ " + ", ".join(f"{quote(str(k))} = {format_value(v)}"
                                for k, v in value.items()) + " }"
    return str(value)


class DictKey(str):
    """A key of a dict-valued setting in a key path (rendered quoted)."""


KeyPath = tuple[str | int, ...]


def quote(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def render_key(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, DictKey):
            out += f".{quote(part)}"
        else:
            out += f".{part}" if out else part
    return out


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


def find_line(text: str, target: KeyPath) -> int | None:
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
