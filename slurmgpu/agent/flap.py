"""InfiniBand link flapping across polls: the history the ``ib.flap`` check judges.

A check is pure over one sample, but flapping is a pattern over many, so the agent
keeps this tracker and writes what it saw into the facts (``IbPort.flap_rises`` and
``flap_strikes``); the registered ``ib.flap`` check then judges those numbers with the
same port scope and ``[checks] disabled`` as every other check. Every port is tracked,
whatever the scope: the scope is the check's business, and a port brought into scope
later then has its history.

Per port, each poll where ``link_downed`` rose is a *rise*. ``flap_count`` rises
within ``flap_window_s`` are one *strike*; the rises are then spent, so the next
strike needs fresh ones. A strike is forgotten after ``STRIKE_TTL_S`` (a repaired link
stops warning a day later; an agent restart, i.e. a reboot, forgets it at once). A
counter that goes down (driver reload, ``perfquery -R``) just resets the baseline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from slurmgpu.config.schema import IbSettings
from slurmgpu.facts import IbFacts

COUNTER = "link_downed"
STRIKE_TTL_S = 86400.0


@dataclass
class _Port:
    last: int | None = None
    rises: deque[float] = field(default_factory=deque)
    strikes: deque[float] = field(default_factory=deque)


class FlapTracker:
    def __init__(self, settings: IbSettings) -> None:
        self.window_s = settings.flap_window_s
        self.count = max(1, settings.flap_count)
        self.ports: dict[str, _Port] = {}

    def observe(self, ib: IbFacts, now: float) -> None:
        """Feed one poll's IB facts (``now``: monotonic seconds) and record each port's
        rises and strikes in them. A port without a ``link_downed`` counter is left
        untracked (``None``): there is nothing to judge."""
        for hca in ib.hcas:
            for port in hca.ports:
                value = port.counters.get(COUNTER)
                if value is None:
                    continue
                state = self._update(f"{hca.name}/{port.port}", value, now)
                port.flap_rises, port.flap_strikes = len(state.rises), len(state.strikes)

    def _update(self, name: str, value: int, now: float) -> _Port:
        state = self.ports.setdefault(name, _Port())
        previous, state.last = state.last, value
        while state.strikes and now - state.strikes[0] > STRIKE_TTL_S:
            state.strikes.popleft()
        while state.rises and now - state.rises[0] > self.window_s:
            state.rises.popleft()
        if previous is None or value <= previous:
            return state  # first sample, unchanged, or a reset counter
        state.rises.append(now)
        if len(state.rises) >= self.count:
            state.strikes.append(now)
            state.rises.clear()
        return state
