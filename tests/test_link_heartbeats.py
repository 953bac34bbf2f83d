"""The agent's heartbeats (issue 15): one ``heartbeat_s`` after anything last went out on
the main socket (issue 30), none while frames it sent within ``BUSY_HEARTBEATS``
intervals are unacked (the collector reads them first, and they are the same sign of
life), back once those go unanswered longer. Real ZeroMQ and CURVE, against a collector
that never acks or one that acks at once (``FakeCollector``); every wait polls for the
effect itself."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import keys, wire
from slurmgpu.agent.link import BUSY_HEARTBEATS, Link
from slurmgpu.agent.spool import Spool
from tests.agenthelpers import FakeCollector, Links, free_port, wait_until
from tests.test_agent_failover import NODE, keys_dir, spool  # noqa: F401  (fixtures)

HEARTBEAT_S = 1.0  # silent after 3 s (the fake collector heartbeats every 0.5 s), acks stalled after 6


@pytest.fixture
def mute(keys_dir: Path) -> Iterator[FakeCollector]:  # noqa: F811
    """A collector that takes every message and acks none."""
    collector = FakeCollector(free_port(), keys_dir / f"{keys.COLLECTOR}{keys.SECRET_SUFFIX}", ack=False).start()
    yield collector
    collector.stop()


@pytest.fixture
def acking(keys_dir: Path) -> Iterator[FakeCollector]:  # noqa: F811
    collector = FakeCollector(free_port(), keys_dir / f"{keys.COLLECTOR}{keys.SECRET_SUFFIX}").start()
    yield collector
    collector.stop()


@pytest.fixture
def make_link(keys_dir: Path, spool: Spool) -> Iterator[Any]:  # noqa: F811
    links = Links(keys_dir, spool, NODE, HEARTBEAT_S)
    yield links.make
    links.stop()


def spool_report(spool: Spool) -> int:  # noqa: F811
    body = {"verdict": "OK", "findings": []}
    item = spool.append(wire.REPORT, lambda seq: wire.message_frame(wire.REPORT, NODE, seq, body,
                                                                        epoch=spool.epoch))
    assert item.stored
    return item.seq


def test_busy_is_frames_in_flight_sent_within_the_busy_intervals(spool: Spool, keys_dir: Path) -> None:  # noqa: F811
    link = Link(addresses=["tcp://127.0.0.1:1"], node=NODE, keys=keys.client_keys(keys_dir / "bundles" / NODE),
                spool=spool, heartbeat_s=1.0, on_command=lambda _m: None)
    assert not link._busy(100.0)  # nothing in flight
    link._inflight.add(1)
    link._last_send = 100.0
    assert link._busy(100.0) and link._busy(100.0 + BUSY_HEARTBEATS - 0.01)
    assert not link._busy(100.0 + BUSY_HEARTBEATS)  # unanswered that long: heartbeats again
    link._inflight.clear()
    assert not link._busy(100.5)


def test_an_idle_link_heartbeats_every_interval(mute: FakeCollector, make_link: Any) -> None:
    link = make_link(f"tcp://127.0.0.1:{mute.port}")
    wait_until(lambda: len(mute.of_type(wire.HEARTBEAT)) >= 3, timeout=20, what="three heartbeats")
    assert link.heartbeats_skipped == 0


def test_no_heartbeat_behind_an_unacked_frame_until_it_goes_unanswered(
        mute: FakeCollector, make_link: Any, spool: Spool) -> None:  # noqa: F811
    """The report waits for its ack (a window of one frame before any ack): the heartbeats
    due meanwhile are skipped, none reaches the collector until the report was unanswered
    for BUSY_HEARTBEATS intervals, and then they come back."""
    seq = spool_report(spool)
    link = make_link(f"tcp://127.0.0.1:{mute.port}")
    wait_until(lambda: seq in mute.stored, timeout=20, what="the report")
    wait_until(lambda: link._last_send > 0, timeout=5, what="the link to note its send")
    sent = link._last_send  # (monotonic, the clock of the collector's arrival times)
    wait_until(lambda: len(heartbeats_after(mute, seq)) >= 2, timeout=30, what="heartbeats back")
    assert link.heartbeats_skipped >= 1
    # A heartbeat arrives after it was sent, at least BUSY_HEARTBEATS intervals after the report.
    assert heartbeats_after(mute, seq)[0] >= sent + BUSY_HEARTBEATS * HEARTBEAT_S
    assert link._inflight == {seq}  # still unacked throughout


def report_arrival(mute: FakeCollector, seq: int) -> float:
    return next(r.at for r in list(mute.messages) if r.envelope.type == wire.REPORT and r.envelope.seq == seq)


def heartbeats_after(mute: FakeCollector, seq: int) -> list[float]:
    """Arrival times of the heartbeats the collector read after report ``seq``."""
    arrived = report_arrival(mute, seq)
    return [r.at for r in list(mute.messages) if r.envelope.type == wire.HEARTBEAT and r.at >= arrived]


def test_a_heartbeat_waits_an_interval_after_anything_sent(
        acking: FakeCollector, make_link: Any, spool: Spool) -> None:  # noqa: F811
    """Reports every quarter interval, each acked at once: any frame is the same sign of
    life, so no heartbeat comes within an interval of the frame before it (every one the
    collector read came at least ~an interval after the message before it), and once the
    reports stop the heartbeats come back."""
    link = make_link(f"tcp://127.0.0.1:{acking.port}")
    seqs = []
    for _ in range(12):
        seqs.append(spool_report(spool))
        link.wake()
        time.sleep(HEARTBEAT_S / 4)
    wait_until(lambda: len(heartbeats_after(acking, seqs[-1])) >= 1, timeout=30, what="a heartbeat after the reports")
    arrivals = [(r.at, r.envelope.type) for r in list(acking.messages)]
    gaps = [at - before for (before, _), (at, kind) in itertools.pairwise(arrivals) if kind == wire.HEARTBEAT]
    assert min(gaps) >= 0.7 * HEARTBEAT_S, gaps
    assert all(seq in acking.stored for seq in seqs)
