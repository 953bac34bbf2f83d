"""The automation's circuit breaker: when a drain would take too much of the fleet (a
fraction at once, a rate per hour, a storm of one check), it opens and holds every new
drain until an operator releases them (``Automation.release``). Pure functions over the
automation's state; ``policy.Automation`` calls them."""

from __future__ import annotations

import math
from typing import Any

from slurmgpu.collector.store import AutomationState
from slurmgpu.collector.store.automation import Breaker
from slurmgpu.config.schema import AutomationSettings

HOUR = 3600.0


def fraction_limit(settings: AutomationSettings, fleet: int) -> tuple[int, str]:
    """The most nodes slurmgpu may have drained at once on a fleet of ``fleet`` nodes, and
    the setting that decides it: max(1, floor(max_fraction x fleet), min(min_nodes, fleet - 1))."""
    by_fraction = max(1, math.floor(settings.max_fraction * fleet + 1e-9))
    floor = min(settings.min_nodes, fleet - 1)
    return (floor, "min_nodes") if floor > by_fraction else (by_fraction, "max_fraction")


def storm_threshold(settings: AutomationSettings, fleet: int) -> tuple[int, str]:
    """How many nodes failing one check within ``storm_window_s`` trip the breaker, and the
    setting that decides it: max(2, ceil(storm_fraction x fleet), min(min_nodes + 1, fleet))."""
    by_fraction = max(2, math.ceil(settings.storm_fraction * fleet - 1e-9))
    floor = min(settings.min_nodes + 1, fleet)
    return (floor, "min_nodes") if floor > by_fraction else (by_fraction, "storm_fraction")


def setting_text(settings: AutomationSettings, key: str) -> str:
    """``key = value`` as in the TOML file (the [automation] table)."""
    value = getattr(settings, key)
    return f"{key} = {value:g}" if isinstance(value, float) else f"{key} = {value}"


def trip(state: AutomationState, why: str, now: float) -> None:
    """Open the breaker (an open one keeps the reason it opened with)."""
    if not state.breaker.open:
        state.breaker = Breaker(True, now, why)


def check_drain(state: AutomationState, settings: AutomationSettings, fleet: int, node: str,
                now: float) -> None:
    """Before a new drain of ``node``: trip the breaker if it would take more than the
    fraction allows, or come past the hourly rate (``state.drain_times``: the last hour's)."""
    state.drain_times = [t for t in state.drain_times if now - t < HOUR]
    limit, key = fraction_limit(settings, fleet)
    drained = len(state.drained)
    if drained + 1 > limit:
        trip(state, f"fraction: {drained} of {fleet} nodes drained, {node} would make {drained + 1}; "
                    f"{setting_text(settings, key)} trips at {limit + 1} nodes", now)
    elif len(state.drain_times) >= settings.max_per_hour:
        trip(state, f"rate: {len(state.drain_times)} drains in the last hour "
                    f"({setting_text(settings, 'max_per_hour')})", now)


def note_failing(state: AutomationState, settings: AutomationSettings, fleet: int, check: str,
                 node: str, now: float) -> None:
    """``node`` failed ``check``: trip the breaker when that check fails on a storm's worth
    of nodes within ``storm_window_s``."""
    window = state.failing.setdefault(check, {})
    window[node] = now
    for n in [n for n, t in window.items() if now - t > settings.storm_window_s]:
        del window[n]
    threshold, key = storm_threshold(settings, fleet)
    if len(window) >= threshold:
        trip(state, f"storm: {check} failing on {len(window)} of {fleet} nodes within "
                    f"{settings.storm_window_s:g} s ({setting_text(settings, key)} trips at {threshold} nodes)", now)


def forecast(state: AutomationState, settings: AutomationSettings, fleet: int, now: float) -> dict[str, Any]:
    """The breaker once the drains it holds (or that were released) are done: per rule
    (fraction, rate, storm) the count, the limit, the [automation] setting that decides
    it, and whether it trips again (the next drain, or the drained nodes' next reports
    of a storm). ``would_trip``: any of them; ``why``: their texts."""
    st, s = state, settings
    coming = sorted((set(st.held) | set(st.released)) - set(st.drained))
    drained = len(st.drained) + len(coming)
    pct = round(100 * drained / fleet) if fleet else 0
    rules = [_fraction_rule(s, fleet, drained, pct), _rate_rule(st, s, now, len(coming)),
             _storm_rule(st, s, fleet, coming)]
    for rule in rules:
        if rule["trips_again"]:
            rule["text"] += (": their next reports trip the breaker again while they still fail"
                             if rule["rule"] == "storm" else ": the next drain trips the breaker again")
    why = [r["text"] for r in rules if r["trips_again"]]
    return {"fleet": fleet, "drained": drained, "drained_pct": pct, "coming": coming,
            "would_trip": bool(why), "why": why, "rules": rules}


def _fraction_rule(s: AutomationSettings, fleet: int, drained: int, pct: int) -> dict[str, Any]:
    limit, key = fraction_limit(s, fleet)
    return {"rule": "fraction", "setting": f"automation.{key}", "value": getattr(s, key),
            "count": drained, "limit": limit, "trips_at": limit + 1, "trips_again": drained + 1 > limit,
            "text": f"{drained} of {fleet} nodes ({pct}%) would be drained; {setting_text(s, key)} "
                    f"trips at {limit + 1} nodes"}


def _rate_rule(st: AutomationState, s: AutomationSettings, now: float, coming: int) -> dict[str, Any]:
    hour = sum(1 for t in st.drain_times if now - t < HOUR) + coming
    return {"rule": "rate", "setting": "automation.max_per_hour", "value": s.max_per_hour,
            "count": hour, "limit": s.max_per_hour, "trips_at": s.max_per_hour + 1,
            "trips_again": hour + 1 > s.max_per_hour,
            "text": f"{hour} drain(s) in the last hour would be counted; {setting_text(s, 'max_per_hour')} "
                    f"trips at drain {s.max_per_hour + 1} within an hour"}


def _storm_rule(st: AutomationState, s: AutomationSettings, fleet: int, coming: list[str]) -> dict[str, Any]:
    # Nodes drained (or about to be) for a check their last report still failed: they
    # report it again, and that counts towards a storm as soon as the breaker closes.
    per_check: dict[str, int] = {}
    for node in [*st.drained, *coming]:
        entry = st.drained.get(node) or st.released.get(node) or st.held.get(node)
        check = entry.trigger if entry is not None else ""
        if check in st.strikes.get(node, {}):
            per_check[check] = per_check.get(check, 0) + 1
    check, failing = max(sorted(per_check.items()), key=lambda kv: kv[1], default=("", 0))
    threshold, skey = storm_threshold(s, fleet)
    return {"rule": "storm", "setting": f"automation.{skey}", "value": getattr(s, skey),
            "count": failing, "check": check or None, "limit": threshold - 1, "trips_at": threshold,
            "trips_again": failing >= threshold,
            "text": (f"{failing} node(s) drained for {check}" if check else "no node drained")
                    + f"; {setting_text(s, skey)} trips when one check fails on {threshold} nodes "
                      f"within {s.storm_window_s:g} s"}
