"""The collector's view of which nodes are alive: when each was last heard (any message),
which were heard by heartbeat alone since their last-seen time was stored, and when each
was last answered (acked or heartbeated). Once a heartbeat interval the nodes heard by
heartbeat go to the store; every half interval the nodes heard lately and not answered
for 1.5 intervals are due the collector's heartbeat, so no node goes 2 intervals without
a frame from the collector (an agent gives up after 3); both in chunks, a chunk a loop
turn. Single-threaded: the collector loop's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

HEARD_PER_TURN = 256  # per loop turn: heard nodes handed to the store,
HEARTBEATS_PER_TURN = 1000  # and heartbeats sent
UNANSWERED_INTERVALS = 1.5  # a node not answered for this long is due a heartbeat


class Liveness:
    def __init__(self, heartbeat_s: float, unreachable_after: int) -> None:
        self.heartbeat_s = heartbeat_s
        self.window = unreachable_after * heartbeat_s  # heard within it: heartbeated
        self.seen: dict[str, float] = {}  # node -> wall time last heard (this process)
        self.heard: set[str] = set()  # heard by heartbeat since its last-seen time was stored
        self.answered: dict[str, float] = {}  # node -> monotonic time last acked or heartbeated
        self.handing = False  # heard nodes are being handed over, HEARD_PER_TURN a turn
        self.due: list[str] = []  # nodes still to heartbeat from the last look
        self.next_interval = self.next_look = time.monotonic() + heartbeat_s

    def heartbeat_from(self, node: str, now: float) -> None:
        self.seen[node] = now
        self.heard.add(node)

    def stored(self, new: list[tuple[str, int]]) -> None:
        """Messages stored: their nodes' last-seen time was written with them."""
        if self.heard and new:
            self.heard.difference_update([node for node, _ in new])

    def start_interval(self, mono: float) -> None:
        """At each interval (monotonic ``mono``) hand over the heard nodes; at each half
        interval look for the nodes due a heartbeat."""
        if mono >= self.next_interval:
            self.next_interval = mono + self.heartbeat_s
            self.handing = True
        if mono >= self.next_look:
            self.next_look = mono + self.heartbeat_s / 2
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

    def to_heartbeat(self, mono: float) -> list[str]:
        """HEARTBEATS_PER_TURN of the due nodes, less those answered within
        UNANSWERED_INTERVALS (the caller sets ``answered`` for each heartbeat sent)."""
        due, self.due = self.due[:HEARTBEATS_PER_TURN], self.due[HEARTBEATS_PER_TURN:]
        unanswered = UNANSWERED_INTERVALS * self.heartbeat_s
        return [node for node in due if mono - self.answered.get(node, -1e9) >= unanswered]
