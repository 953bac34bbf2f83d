"""The NVSwitch SXid catalogue (``data/sxid_catalog.toml``): NVIDIA's class for each code
(non-fatal, notable, fatal, always fatal) and what slurmgpu does about it. A code the
table does not know is judged by the driver's own word in its line ("Fatal",
"Non-fatal"), else warned about."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

from slurmgpu.decision import XID_ACTION_SEVERITY
from slurmgpu.record import record
from slurmgpu.result import Severity

CLASS_ACTION = {"non-fatal": "warn", "notable": "warn", "fatal": "drain", "always-fatal": "reboot"}
_FATAL_WORD = re.compile(r"(?<![-\w])fatal\b", re.I)
_NON_FATAL_WORD = re.compile(r"\bnon-?fatal\b", re.I)


@record(frozen=True)
class SxidRule:
    """What to do about one NVSwitch SXid code."""

    code: int
    name: str
    sxid_class: str  # a key of CLASS_ACTION, or "unknown"
    origin: str = "catalog"  # "catalog", "message" (the line's own word) or "unknown"

    @property
    def action(self) -> str:
        return CLASS_ACTION.get(self.sxid_class, "warn")

    @property
    def severity(self) -> Severity:
        return XID_ACTION_SEVERITY[self.action]


@cache
def catalog() -> dict[int, SxidRule]:
    path = Path(__file__).resolve().parent / "data" / "sxid_catalog.toml"
    rows = tomllib.loads(path.read_text(encoding="utf-8"))["sxid"]
    return {int(code): SxidRule(int(code), row["name"], row["class"]) for code, row in rows.items()}


def sxid_rule(code: int, message: str | None = None) -> SxidRule:
    """The catalogue's row for ``code``; for a code it lacks, the line's own word."""
    known = catalog().get(code)
    if known is not None:
        return known
    text = message or ""
    if _NON_FATAL_WORD.search(text):
        return SxidRule(code, "not in the catalogue", "non-fatal", "message")
    if _FATAL_WORD.search(text):
        return SxidRule(code, "not in the catalogue", "fatal", "message")
    return SxidRule(code, "not in the catalogue", "unknown", "unknown")
