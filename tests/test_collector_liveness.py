"""Liveness at the application level (issue 15, part 1): the collector's ROUTER sets no
ZMTP heartbeats (libzmq scans its timers on every message: at 10,000 connections that
was 39 % of the collector's CPU), and an agent's heartbeat is an update in memory,
written to the store once per heartbeat interval for all the nodes heard, not once per
heartbeat."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from slurmgpu.collector import transport as transport_mod
from slurmgpu.collector.counters import Counters
from slurmgpu.collector.liveness import HEARD_PER_TURN, HEARTBEATS_PER_TURN, Liveness
from slurmgpu.collector.transport import Transport
from slurmgpu.wire import HEARTBEAT
from tests.agenthelpers import wait_until
from tests.test_collector import Agent, ctx, db_rows, keys_dir, make_settings, running  # noqa: F401


def test_the_router_sets_no_zmtp_heartbeats_but_tcp_keepalive(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    transport = Transport(make_settings(tmp_path, keys_dir, heartbeat_s=5.0), Counters())
    try:
        sock = transport.sock
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 0 and sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) in (0, -1)
        assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
        assert sock.getsockopt(zmq.TCP_KEEPALIVE_IDLE) == transport_mod.TCP_KEEPALIVE_IDLE
    finally:
        transport.close()


def test_heartbeats_are_stored_once_per_interval_not_once_each(
        tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir, heartbeat_s=0.3, unreachable_after=1000)
    with running(cfg) as collector:
        store = collector.fleet.store
        calls: list[set[str]] = []
        lock = threading.Lock()
        touch = store.touch

        def counting_touch(nodes: Any, now: float | None = None) -> None:
            with lock:
                calls.append(set(nodes))
            touch(nodes, now)

        store.touch = counting_touch  # type: ignore[method-assign]
        a, b = Agent(ctx, cfg, keys_dir, "gpu-a"), Agent(ctx, cfg, keys_dir, "gpu-b")
        started = time.monotonic()
        for _ in range(50):
            a.send(HEARTBEAT, 0, {})
            b.send(HEARTBEAT, 0, {})
        wait_until(lambda: collector.counters.heartbeats_received == 100, 10.0, "100 heartbeats received")
        def flushed() -> set[str]:
            with lock:
                return set().union(*calls) if calls else set()

        wait_until(lambda: flushed() == {"gpu-a", "gpu-b"}, 10.0, "heartbeats flushed")
        elapsed = time.monotonic() - started
        with lock:
            flushes = len(calls)
        # One write per interval at most (plus the one under way), for 100 heartbeats.
        assert 1 <= flushes <= elapsed / cfg.heartbeat_s + 2
        wait_until(lambda: len(db_rows(cfg, "SELECT node FROM nodes WHERE last_seen > 0")) == 2, 10.0,
                   "both nodes stored as seen")
        assert db_rows(cfg, "SELECT count(*) FROM messages") == [(0,)]  # no heartbeat rows


class _Handler:
    """A Handler whose store fails the first ``failures`` times it records heartbeats."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.recorded: list[set[str]] = []

    def holding(self) -> bool:
        return False

    def heard(self, nodes: set[str], now: float) -> bool:
        if self.failures:
            self.failures -= 1
            return False
        self.recorded.append(set(nodes))
        return True


def test_nodes_heard_while_the_store_fails_are_kept_for_the_next_interval(
        tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    transport = Transport(make_settings(tmp_path, keys_dir), Counters())
    try:
        handler = _Handler(failures=1)
        transport.liveness.heard.update({"gpu-a"})
        transport.liveness.hand_over(handler.heard)
        assert transport.liveness.heard == {"gpu-a"} and handler.recorded == []
        transport.liveness.heard.add("gpu-b")
        transport.liveness.hand_over(handler.heard)
        assert transport.liveness.heard == set() and handler.recorded == [{"gpu-a", "gpu-b"}]
    finally:
        transport.close()


def test_nodes_acked_within_the_interval_get_no_heartbeat(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """An ack is a sign of life to an agent (any frame is): a node that reports gets its
    acks, and only a node that merely heartbeats needs the collector's heartbeat."""
    transport = Transport(make_settings(tmp_path, keys_dir, heartbeat_s=5.0), Counters())
    sent: list[bytes] = []
    try:
        transport._send = lambda route, frame, sock=None: sent.append(route) or True  # type: ignore[method-assign]
        now = time.time()
        for node in ("gpu-a", "gpu-b"):
            transport.liveness.seen[node], transport.routes[node] = now, node.encode()
        transport._send_acks([(transport.sock, b"gpu-a", "gpu-a", "", 7, False)])  # gpu-a reported and was acked
        sent.clear()
        transport.liveness.due = transport.liveness.heartbeats_due()
        transport._heartbeat(time.monotonic())
        assert sent == [b"gpu-b"]
        transport.liveness.answered["gpu-a"] -= 7.5  # 1.5 intervals later, without a report
        transport.liveness.answered["gpu-b"] -= 7.5
        sent.clear()
        transport.liveness.due = transport.liveness.heartbeats_due()
        transport._heartbeat(time.monotonic())
        assert sorted(sent) == [b"gpu-a", b"gpu-b"]
    finally:
        transport.close()


def test_the_intervals_work_is_spread_over_loop_turns(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """At 10,000 nodes one interval's heartbeat bookkeeping at once held the loop (and an
    event's batch behind it) for ~180 ms: each turn records at most HEARD_PER_TURN heard
    nodes and sends at most HEARTBEATS_PER_TURN heartbeats, and the interval's work is
    done in as many turns as that takes, every node once."""
    transport = Transport(make_settings(tmp_path, keys_dir, heartbeat_s=60.0), Counters())
    sent: list[bytes] = []
    try:
        transport._send = lambda route, frame, sock=None: sent.append(route) or True  # type: ignore[method-assign]
        nodes = [f"gpu-{i:04d}" for i in range(2 * HEARTBEATS_PER_TURN + 10)]
        now = time.time()
        for node in nodes:
            transport.liveness.seen[node], transport.routes[node] = now, node.encode()
        transport.liveness.heard.update(nodes)
        handler = _Handler(failures=0)
        transport.liveness.next_interval = transport.liveness.next_look = 0.0  # the interval and a look are due
        turns = 0
        while transport.liveness.due or transport.liveness.handing or turns == 0:
            transport.tick(handler)  # type: ignore[arg-type]
            turns += 1
            assert len(handler.recorded[-1]) <= HEARD_PER_TURN
            assert len(sent) <= turns * HEARTBEATS_PER_TURN
        assert turns == -(-len(nodes) // HEARD_PER_TURN)  # ceil: the heard nodes took longest
        assert set().union(*handler.recorded) == set(nodes) and transport.liveness.heard == set()
        assert sorted(sent) == sorted(n.encode() for n in nodes)  # each heartbeated once
    finally:
        transport.close()


def test_a_node_whose_report_was_stored_needs_no_heartbeat_write(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """Its last-seen time was written with the report: only nodes heard by heartbeat alone
    are handed over."""
    transport = Transport(make_settings(tmp_path, keys_dir), Counters())
    try:
        transport.liveness.heard.update({"gpu-a", "gpu-b"})
        transport.liveness.stored([("gpu-a", 7), ("gpu-c", 3)])
        assert transport.liveness.heard == {"gpu-b"}
        handler = _Handler(failures=0)
        transport.liveness.hand_over(handler.heard)
        assert handler.recorded == [{"gpu-b"}]
    finally:
        transport.close()


def answers(acked_every: float | None, heartbeat_s: float = 5.0, turns_s: float = 0.05,
            until: float = 300.0) -> tuple[int, list[float]]:
    """A node seen all along, acked every ``acked_every`` s (None: never), the collector's
    loop turning every ``turns_s`` on a clock of its own: (heartbeats sent, the times
    the node was answered, acks and heartbeats)."""
    live = Liveness(heartbeat_s, unreachable_after=3)
    live.next_interval = live.next_look = 0.0
    sent, answered = 0, [0.0]
    live.answered["gpu-a"] = 0.0
    for turn in range(1, int(until / turns_s)):
        mono = turn * turns_s
        live.seen["gpu-a"] = time.time()
        if acked_every and turn % round(acked_every / turns_s) == 0:
            live.answered["gpu-a"] = mono
            answered.append(mono)
        live.start_interval(mono)
        for node in live.to_heartbeat(mono):
            live.answered[node] = mono
            sent, answered = sent + 1, [*answered, mono]
    return sent, answered


def test_a_node_reporting_every_3_intervals_gets_one_heartbeat_a_report_and_never_2_intervals_of_silence() -> None:
    """Its acks answer it every 15 s; the collector fills each gap once (it sent two a
    report when it heartbeated every node unacked for one interval)."""
    sent, answered = answers(acked_every=15.0)
    assert sent <= 300 / 15 + 1
    assert max(b - a for a, b in itertools.pairwise(answered)) < 2 * 5.0


def test_a_node_that_only_heartbeats_is_answered_within_2_intervals() -> None:
    sent, answered = answers(acked_every=None)
    assert max(b - a for a, b in itertools.pairwise(answered)) < 2 * 5.0
    assert sent >= 300 / (2 * 5.0)
