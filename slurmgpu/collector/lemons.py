"""Lemon nodes: drained ``lemon_drains`` times within ``lemon_window_s``, they are kept
drained (never auto-resumed) until an operator clears them (``slurmgpu lemon clear``).
Pure functions over the automation's state; ``policy.Automation`` calls them."""

from __future__ import annotations

from slurmgpu.collector.store import AutomationState
from slurmgpu.collector.store.automation import Lemon
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.report.render_util import span


def note_drain(state: AutomationState, settings: AutomationSettings, node: str, reason: str,
               now: float) -> None:
    """A new drain of ``node``: its drain history, and a lemon when there are too many."""
    history = [t for t in state.history.get(node, []) if now - t < settings.lemon_window_s] + [now]
    state.history[node] = history
    if len(history) >= settings.lemon_drains and node not in state.lemons:
        state.lemons[node] = Lemon(now, f"{len(history)} drains within {span(settings.lemon_window_s)}, "
                                        f"last: {reason}")


def is_lemon(state: AutomationState, node: str) -> bool:
    return node in state.lemons


def clear(state: AutomationState, node: str) -> None:
    """The node was repaired: its drain history starts afresh."""
    state.lemons.pop(node, None)
    state.history.pop(node, None)
