"""nvswitch.sxid: NVSwitch SXids in the kernel log, judged by the SXid catalogue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem, unknown
from slurmgpu.facts import SxidEvent
from slurmgpu.result import Finding, Severity
from slurmgpu.sxid import SxidRule, sxid_rule

Key = tuple[str, int]  # (switch, code)


@check("nvswitch.sxid", severity=Severity.FAIL, reads=("host.sxids", "host.nvswitches"),
       summary="NVSwitch SXids (data/sxid_catalog.toml, NVIDIA's Fabric Manager guide): fatal since boot FAIL, "
               "non-fatal within [nvswitch] nonfatal_window_s WARN")
def nvswitch_sxid(ctx: CheckContext) -> Iterator[Finding]:
    host = ctx.facts.host
    if not host.available or (host.nvswitches == 0 and not host.sxids):
        yield not_applicable("no NVSwitch on this node")
        return
    if "sxids" in host.errors:
        yield unknown(f"kernel log not read: {host.errors['sxids']}")
        return
    first = _first_lines(host.sxids)
    rules = {key: sxid_rule(key[1], event.message) for key, event in first.items()}
    since = ctx.facts.collected_at - ctx.settings.nvswitch.nonfatal_window_s
    counted = Counter(key for e in host.sxids if _counts(rules[key := (e.switch, e.sxid)], e, since))
    for key, count in sorted(counted.items()):
        yield _finding(key, count, rules[key], first[key])
    if not counted:
        yield ok(f"no recent SXid from {host.nvswitches} NVSwitches", nvswitches=host.nvswitches)


def _first_lines(events: list[SxidEvent]) -> dict[Key, SxidEvent]:
    """Each switch's code's first line: the one that says Fatal or Non-fatal."""
    first: dict[Key, SxidEvent] = {}
    for event in events:
        first.setdefault((event.switch, event.sxid), event)
    return first


def _counts(rule: SxidRule, event: SxidEvent, since: float) -> bool:
    """A fatal SXid counts since boot (until a reset); the others within the window."""
    return rule.severity is Severity.FAIL or event.timestamp is None or event.timestamp >= since


def _finding(key: Key, count: int, rule: SxidRule, event: SxidEvent) -> Finding:
    switch, code = key
    times = f" x{count}" if count > 1 else ""
    return problem(rule.severity, f"{switch} SXid {code}{times}: {rule.name} ({rule.sxid_class}) -> {rule.action}",
                   subject=switch, sxid=code, count=count, action=rule.action, sxid_class=rule.sxid_class,
                   pci=event.pci, text=event.message)
