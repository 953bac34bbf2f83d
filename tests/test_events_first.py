"""Issue 15, events first: an event may overtake the reports an agent spooled before it
(the collector ends a batch at an event; agents send fresh events ahead of a backlog).
A node's state is then its newest message by seq, not the last to arrive: older reports
arriving later are history (stored, acked, counted), never the node's state, and never
fed to the automation (stale "OK" reports must not undo a fresh fault)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import zmq

from slurmgpu.collector.store import Store
from slurmgpu.wire import EVENT, REPORT, Envelope
from tests.agenthelpers import wait_until
from tests.test_collector import Agent, ctx, keys_dir, make_settings, running  # noqa: F401
from tests.test_collector_automation import ECC, stored, with_automation


def _msg(seq: int, mtype: str, verdict: str, epoch: str = "e1") -> tuple[str, Envelope]:
    body: dict[str, Any] = {"verdict": verdict, "findings": []}
    if mtype == EVENT:
        body.update(kind="xid", gpu=3, data=79)
    return "n1", Envelope(type=mtype, node="n1", seq=seq, body=body, epoch=epoch, ts=1000.0 + seq)


def _state(store: Store) -> tuple[Any, ...]:
    return tuple(store.db.execute("SELECT n.verdict, n.verdict_seq, r.seq, r.verdict FROM nodes n "
                                  "JOIN reports r ON r.node = n.node WHERE n.node = 'n1'").fetchone())


def test_an_older_report_arriving_later_is_history(store_url: str) -> None:
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_msg(1, REPORT, "OK")])
        assert store.store_batch([_msg(10, EVENT, "FAIL")]) == [("n1", 10)]
        # the reports spooled between 1 and 10, arriving after the event
        assert store.store_batch([_msg(s, REPORT, "OK") for s in range(2, 10)]) == [("n1", s) for s in range(2, 10)]
        assert store.stale == {("n1", s) for s in range(2, 10)}
        # the node is FAIL (the event, seq 10); its latest report is 9, the newest report
        assert _state(store) == ("FAIL", 10, 9, "OK")
        assert store.count("messages") == 10
        # a newer report takes over
        store.store_batch([_msg(11, REPORT, "OK")])
        assert store.stale == set() and _state(store) == ("OK", 11, 11, "OK")
        # a new spool epoch (a reinstalled agent) restarts at 1: newer all the same
        store.store_batch([_msg(1, REPORT, "WARN", epoch="e2")])
        assert _state(store) == ("WARN", 1, 1, "WARN")


def test_order_within_one_batch(store_url: str) -> None:
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_msg(5, EVENT, "FAIL"), _msg(3, REPORT, "OK"), _msg(4, REPORT, "WARN")])
        assert store.stale == {("n1", 3), ("n1", 4)}
        assert _state(store) == ("FAIL", 5, 4, "WARN")


def test_a_second_store_sees_the_stored_state(store_url: str) -> None:
    """What holds the node's state is read from the database (a restarted collector, or
    another collector on PostgreSQL), not only remembered."""
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_msg(10, EVENT, "FAIL")])
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_msg(9, REPORT, "OK")])
        assert store.stale == {("n1", 9)} and _state(store) == ("FAIL", 10, 9, "OK")


def test_stale_reports_do_not_reach_the_automation(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                                   ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    args, client = with_automation(tmp_path)
    with running(cfg, **args) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(EVENT, 10, {"kind": "ecc_dbe", "gpu": 0, "verdict": "FAIL", "findings": [ECC]})
        assert agent.acked() == [10]
        wait_until(lambda: collector.counters.decisions == 1)
        for seq in range(1, 10):  # spooled before the fault, arriving after it
            agent.report(seq)
        acked: list[int] = []
        while len(acked) < 9:
            got = agent.acked()
            assert got is not None
            acked += got
        agent.report(11)  # a fresh report: this one counts
        assert agent.acked() == [11]
        wait_until(lambda: "gpu-a" in stored(tmp_path).healthy)
    assert [c[:2] for c in client.calls if c[0] == "drain"] == [("drain", "gpu-a")]
    assert stored(tmp_path).healthy["gpu-a"][0] == 1  # one healthy report, not ten
