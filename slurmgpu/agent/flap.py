"""InfiniBand link flapping across polls (agent-level finding ``ib.flap``).

Per port, each poll where ``link_downed`` rose is a *rise*. ``flap_count`` rises
within ``flap_window_s`` are one *strike* (WARN on that port); the rises are then
spent, so the next strike needs fresh ones. ``flap_strikes`` strikes fail the port.
A strike is forgotten after ``STRIKE_TTL_S`` (a repaired link stops warning a day
later; an agent restart, i.e. a reboot, forgets it at once). A counter that goes
down (driver reload) just resets the baseline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from slurmgpu.config.schema import AgentSettings
from slurmgpu.facts import IbFacts
from slurmgpu.result import Finding, Severity

CHECK_ID = "ib.flap"
COUNTER = "link_downed"
STRIKE_TTL_S = 86400.0


@dataclass
class _Port:
    last: int | None = None
    rises: deque[float] = field(default_factory=deque)
    strikes: deque[float] = field(default_factory=deque)


class FlapTracker:
    def __init__(self, settings: AgentSettings) -> None:
        self.window_s = settings.flap_window_s
        self.count = max(1, settings.flap_count)
        self.strikes_to_fail = max(1, settings.flap_strikes)
        self.ports: dict[str, _Port] = {}

    def observe(self, ib: IbFacts, now: float) -> list[Finding]:
        """Feed one poll's IB facts (``now``: monotonic seconds); the ``ib.flap`` findings."""
        seen = 0
        for hca in ib.hcas:
            for port in hca.ports:
                value = port.counters.get(COUNTER)
                if value is None:
                    continue
                seen += 1
                self._update(f"{hca.name}/{port.port}", value, now)
        findings = []
        for name, state in sorted(self.ports.items()):
            while state.strikes and now - state.strikes[0] > STRIKE_TTL_S:
                state.strikes.popleft()
            n = len(state.strikes)
            if not n:
                continue
            severity = Severity.FAIL if n >= self.strikes_to_fail else Severity.WARN
            findings.append(Finding(
                CHECK_ID, severity,
                f"link flapping: {n} strike{'s' if n > 1 else ''} ({self.count} link_downed rises "
                f"within {self.window_s:g} s each; {self.strikes_to_fail} fail the port)",
                subject=name, data={"strikes": n, "link_downed": state.last}))
        if not findings:
            if seen:
                findings.append(Finding(CHECK_ID, Severity.OK, "no link flapping"))
            else:
                findings.append(Finding(CHECK_ID, Severity.OK, "no InfiniBand link_downed counters",
                                        not_applicable=True))
        return findings

    def _update(self, name: str, value: int, now: float) -> None:
        state = self.ports.setdefault(name, _Port())
        previous, state.last = state.last, value
        if previous is None or value <= previous:
            return  # first sample, unchanged, or a reset counter
        state.rises.append(now)
        while state.rises and now - state.rises[0] > self.window_s:
            state.rises.popleft()
        if len(state.rises) >= self.count:
            state.strikes.append(now)
            state.rises.clear()
