"""The XID policy: the bundled table (data, in ``data/xid_catalog.toml``) plus
site overrides from ``[xid] overrides``.

A row may carry ``[[xid.variant]]`` entries: a case-insensitive regular expression over
the driver's message text and the action when it matches (NVIDIA's action for the GB200
NVLink5 family 144-150 depends on the sub-unit and on Fatal/Nonfatal in the text). The
first matching variant wins; without a message, or with none matching, the row's own
action applies."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import field
from functools import cache
from pathlib import Path

from slurmgpu.decision import XID_ACTION_SEVERITY, XID_ACTIONS, Action
from slurmgpu.record import record
from slurmgpu.result import Severity

# (the XID actions and their severities are slurmgpu.decision's; these names stay)
ACTIONS = XID_ACTIONS
ACTION_SEVERITY = XID_ACTION_SEVERITY


@record(frozen=True)
class XidVariant:
    """An XID whose action depends on the driver's message."""

    pattern: re.Pattern[str]
    action: str
    name: str
    nvidia: str | None = None


@record(frozen=True)
class XidRule:
    """What to do about one XID code."""

    code: int
    name: str
    category: str
    action: str
    # "catalog", "site override" or "unknown XID"
    origin: str = "catalog"
    # NVIDIA's immediate action for this code (its XID catalog), and why slurmgpu differs.
    nvidia: str | None = None
    deviation: str | None = None
    variants: tuple[XidVariant, ...] = field(default=(), compare=False)
    # The variant's pattern that decided this rule, when one did.
    matched: str | None = None

    def for_message(self, message: str | None) -> XidRule:
        """This rule as it applies to one event's message text (first matching variant)."""
        for v in self.variants if message else ():
            if v.pattern.search(message or ""):
                return XidRule(self.code, v.name, self.category, v.action, self.origin,
                               v.nvidia or self.nvidia, self.deviation, matched=v.pattern.pattern)
        return self

    @property
    def severity(self) -> Severity:
        return ACTION_SEVERITY[self.action]


@cache
def catalog() -> dict[int, XidRule]:
    # A plain path, not importlib.resources: that import costs the prolog ~15 ms, and the
    # catalog always ships as a file beside this module (package data).
    text = (Path(__file__).resolve().parent / "data" / "xid_catalog.toml").read_text(encoding="utf-8")
    return {int(row["code"]): _rule(row) for row in tomllib.loads(text)["xid"]}


def _rule(row: Mapping[str, object]) -> XidRule:
    code = int(str(row["code"]))
    for action in [row["action"], *(v["action"] for v in _variant_rows(row))]:
        if action not in ACTIONS:
            raise ValueError(f"xid_catalog.toml: XID {code}: bad action {action!r}")
    variants = tuple(XidVariant(re.compile(str(v["pattern"]), re.IGNORECASE), str(v["action"]),
                                str(v.get("name") or row["name"]),
                                str(v["nvidia"]) if v.get("nvidia") else None) for v in _variant_rows(row))
    return XidRule(code, str(row["name"]), str(row["category"]), str(row["action"]),
                   nvidia=str(row["nvidia"]) if row.get("nvidia") else None,
                   deviation=str(row["deviation"]) if row.get("deviation") else None,
                   variants=variants)


def _variant_rows(row: Mapping[str, object]) -> list[dict[str, object]]:
    variants = row.get("variant") or []
    return list(variants) if isinstance(variants, list) else []


class XidPolicy:
    def __init__(self, overrides: Mapping[str, str] | None = None,
                 unknown_action: str = Action.WARN.value) -> None:
        self.overrides = {int(k): v for k, v in (overrides or {}).items()}
        self.unknown_action = unknown_action

    def rule(self, code: int, message: str | None = None) -> XidRule:
        """The rule for one XID; ``message`` (the driver's text) picks a row's variant."""
        base = catalog().get(code)
        if code in self.overrides:
            name = base.name if base else "site-defined XID"
            category = base.category if base else "site"
            return XidRule(code, name, category, self.overrides[code], "site override",
                           nvidia=base.nvidia if base else None)
        if base:
            return base.for_message(message)
        return XidRule(code, "not in slurmgpu's XID table", "unknown", self.unknown_action, "unknown XID")

    def rows(self) -> list[XidRule]:
        codes = sorted(set(catalog()) | set(self.overrides))
        return [self.rule(c) for c in codes]
