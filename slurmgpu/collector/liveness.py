"""The collector's view of which nodes are alive: when each was last heard (any message),
which were heard by heartbeat alone since their last-seen time was stored, and when each
was last acked. Once a heartbeat interval, the nodes heard by heartbeat go to the store
and the nodes heard lately and not acked within the interval are due the collector's
heartbeat; both in chunks, a chunk a loop turn. Single-threaded: the collector loop's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

HEARD_PER_TURN = 256  # per loop turn: heard nodes handed to the store,
HEARTBEATS_PER_TURN = 1000  # and heartbeats sent


class Liveness:
    def __init__(self, heartbeat_s: float, unreachable_after: int) -> None:
        self.heartbeat_s = heartbeat_s
        self.window = unreachable_after * heartbeat_s  # heard within it: heartbeated
        self.seen: dict[str, float] = {}  # node -> wall time last heard (this process)
        self.heard: set[str] = set()  # heard by heartbeat since its last-seen time was stored
        self.answered: dict[str, float] = {}  # node -> monotonic time of its last ack
        self.handing = False  # heard nodes are being handed over, HEARD_PER_TURN a turn
        self.due: list[str] = []  # nodes still to heartbeat this interval
        self.next_interval = time.monotonic() + heartbeat_s

    def heartbeat_from(self, node: str, now: float) -> None:
        self.seen[node] = now
        self.heard.add(node)

    def stored(self, new: list[tuple[str, int]]) -> None:
        """Messages stored: their nodes' last-seen time was written with them."""
        if self.heard and new:
            self.heard.difference_update([node for node, _ in new])

    def start_interval(self, mono: float) -> None:
        """At each interval (monotonic ``mono``): hand over the heard nodes, heartbeat
        the nodes heard within the window (the rest are forgotten)."""
        if mono < self.next_interval:
            return
        self.next_interval = mono + self.heartbeat_s
        self.handing = True
        self.due = self.heartbeats_due()

    def heartbeats_due(self) -> list[str]:
        """The nodes heard within the window (the rest forgotten)."""
        now = time.time()
        for node in [node for node, seen in self.seen.items() if now - seen > self.window]:
            del self.seen[node]
            self.answered.pop(node, None)
        return list(self.seen)

    def hand_over(self, record: Callable[[set[str], float], bool]) -> None:
        """HEARD_PER_TURN of the heard nodes to ``record``; kept for later if it fails."""
        chunk = set(itertools.islice(self.heard, HEARD_PER_TURN))
        if not chunk or not record(chunk, time.time()):
            self.handing = False
            return
        self.heard -= chunk
        self.handing = bool(self.heard)

    def to_heartbeat(self) -> list[str]:
        """HEARTBEATS_PER_TURN of the due nodes, less those acked within the interval."""
        mono = time.monotonic()
        due, self.due = self.due[:HEARTBEATS_PER_TURN], self.due[HEARTBEATS_PER_TURN:]
        return [node for node in due if mono - self.answered.get(node, -1e9) >= self.heartbeat_s]
