"""The XID policy: the bundled table (data, in ``data/xid_catalog.toml``) plus
site overrides from ``[xid] overrides``."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from slurmgpu.result import Severity

ACTIONS = ("ignore", "warn", "checkpoint", "drain", "reset", "reboot")
ACTION_SEVERITY = {
    "ignore": Severity.OK,
    "warn": Severity.WARN,
    "checkpoint": Severity.WARN,
    "drain": Severity.FAIL,
    "reset": Severity.FAIL,
    "reboot": Severity.FAIL,
}


@dataclass(frozen=True)
class XidRule:
    code: int
    name: str
    category: str
    action: str
    # "catalog", "site override" or "unknown XID"
    origin: str = "catalog"

    @property
    def severity(self) -> Severity:
        return ACTION_SEVERITY[self.action]


@cache
def catalog() -> dict[int, XidRule]:
    # A plain path, not importlib.resources: that import costs the prolog ~15 ms, and the
    # catalog always ships as a file beside this module (package data).
    text = (Path(__file__).resolve().parent / "data" / "xid_catalog.toml").read_text(encoding="utf-8")
    rows = tomllib.loads(text)["xid"]
    table = {}
    for row in rows:
        if row["action"] not in ACTIONS:
            raise ValueError(f"xid_catalog.toml: XID {row['code']}: bad action {row['action']!r}")
        table[int(row["code"])] = XidRule(int(row["code"]), row["name"], row["category"], row["action"])
    return table


class XidPolicy:
    def __init__(self, overrides: Mapping[str, str] | None = None, unknown_action: str = "warn"):
        self.overrides = {int(k): v for k, v in (overrides or {}).items()}
        self.unknown_action = unknown_action

    def rule(self, code: int) -> XidRule:
        base = catalog().get(code)
        if code in self.overrides:
            name = base.name if base else "site-defined XID"
            category = base.category if base else "site"
            return XidRule(code, name, category, self.overrides[code], "site override")
        if base:
            return base
        return XidRule(code, "not in slurmgpu's XID table", "unknown", self.unknown_action, "unknown XID")

    def rows(self) -> list[XidRule]:
        codes = sorted(set(catalog()) | set(self.overrides))
        return [self.rule(c) for c in codes]
