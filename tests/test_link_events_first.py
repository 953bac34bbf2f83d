"""Issue 15, events first on the agent's side: after an outage the link sends the
spool's events and command results ahead of its backlog of reports, and never has more
than ``WINDOW`` frames unacked on a connection (the rest follow as acks come back), so a
fresh fault waits behind at most a window of its own node's frames."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slurmgpu import wire
from slurmgpu.agent import link as link_mod
from slurmgpu.agent.spool import Spool
from tests.agenthelpers import query_db, wait_until
from tests.test_agent_failover import (  # noqa: F401
    BOUND_S,
    NODE,
    Serving,
    keys_dir,
    make_link,
    pair,
    report,
    spool,
)


def event(spool: Spool) -> int:  # noqa: F811
    body = {"kind": "xid", "gpu": 3, "data": 79, "verdict": "FAIL", "findings": []}
    item = spool.append(wire.EVENT, lambda seq: wire.message_frame(wire.EVENT, NODE, seq, body,
                                                                  epoch=spool.epoch))
    assert item.stored
    return item.seq


def test_the_event_goes_ahead_of_the_backlog(pair: tuple[Serving, Serving], spool: Spool,  # noqa: F811
                                             make_link: Any) -> None:  # noqa: F811
    a, _ = pair
    backlog = {report(spool) for _ in range(3 * link_mod.WINDOW)}  # spooled while no collector ran
    fault = event(spool)
    a.start()
    link = make_link(a.address)
    wait_until(lambda: backlog | {fault} <= a.stored(spool.epoch), timeout=BOUND_S, what="all stored")
    rows = query_db(Path(a.settings.db), "SELECT seq, received_at FROM messages WHERE node = ? AND type != 'hello'",
                    NODE)
    when = dict(rows)
    # stored in a batch of its own, before any report of the backlog
    assert all(when[seq] > when[fault] for seq in backlog), sorted(when.items(), key=lambda kv: kv[1])[:5]
    # every ack back (the link drops acked seqs from its window, then from the spool)
    wait_until(lambda: spool.pending() == [], timeout=BOUND_S, what="every ack back")
    assert link._inflight == set()


def test_no_more_than_a_window_unacked(pair: tuple[Serving, Serving], spool: Spool,  # noqa: F811
                                       make_link: Any) -> None:  # noqa: F811
    """A collector that stores nothing (hung): the link sends one window, not the spool;
    before this connection's first ack (which says what the collector takes), that
    window is one frame."""
    a, _ = pair
    for _ in range(3 * link_mod.WINDOW):
        report(spool)
    a.start()
    a.hang()  # the socket stays, nothing is read, stored or acked
    link = make_link(a.address)
    wait_until(lambda: len(link._inflight) == 1, timeout=BOUND_S, what="a window sent")
    time.sleep(1.0)  # (the loop turns meanwhile; a silent collector makes it reconnect: 0 again)
    assert len(link._inflight) <= 1 and link.sent_upto <= 1
