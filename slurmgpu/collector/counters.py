"""What the collector's parts share without knowing each other: its ``Counters`` (the
transport counts frames, acks and heartbeats, the fleet logic what it stored and decided;
``/metrics`` and the ``collector_stats`` log line read them), a rate-limited warning, and
``MetricsSource``, what ``metrics.py`` reads from the collector.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from slurmgpu.collector.store import Store

REJECT_LOG_EVERY_S = 10.0


@dataclass
class Counters:
    received: int = 0
    bundles: int = 0  # received frames that were bundles (wire.BUNDLE)
    bundled: int = 0  # the messages in them
    stored: int = 0
    duplicates: int = 0
    acks_sent: int = 0
    acks_failed: int = 0
    heartbeats_received: int = 0
    heartbeats_sent: int = 0
    probes_answered: int = 0  # `slurmgpu doctor`'s heartbeats with {"probe": true}
    batches: int = 0
    store_errors: int = 0
    # Consecutive store batches that failed (0 after one that succeeded): while it is not
    # 0 nothing is acked, agents keep spooling, and /metrics says the store is down.
    store_failing: int = 0
    conflicts: int = 0  # duplicates whose body differs from the stored message
    decisions: int = 0
    automation_errors: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        """Every count in field order (not ``store_failing``, a state), for the stats log lines."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "store_failing"}
        return {**counts, "rejected": dict(self.rejected)}


class LimitedLog:
    """Warnings at most one per event and reason every REJECT_LOG_EVERY_S (with how many
    were suppressed since), so a flood of bad frames cannot flood the log."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self._logged: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, event: str, *, reason: str = "", **detail: Any) -> None:
        now = time.monotonic()
        key = f"{event}:{reason}"
        last = self._logged.get(key)
        if last is not None and now - last < REJECT_LOG_EVERY_S:
            self._suppressed[key] += 1
            return
        self._logged[key] = now
        suppressed = self._suppressed.pop(key, 0)
        extra = {"reason": reason} if reason else {}
        self.log.warning(event, suppressed=suppressed, **extra, **detail)


class MetricsSource(Protocol):
    """What ``/metrics`` reads from the collector (the fleet logic provides it)."""

    @property
    def counters(self) -> Counters: ...

    @property
    def allowed(self) -> Mapping[bytes, str]: ...

    @property
    def automation(self) -> Any: ...  # its ``status()``, when there is one

    @property
    def store(self) -> Store: ...

    @property
    def log(self) -> Any: ...
