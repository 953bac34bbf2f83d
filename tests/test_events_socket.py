"""Issue 15, live events during a backlog drain: events and command results have a
socket of their own (``[collector] events_port``). The collector reads it before every
batch, so an event is stored and acked in a batch of its own however many reports the
fleet has queued on the main socket; the agent's link falls back to the main socket
when the events socket is not there, drops, or does not ack.

Real ZeroMQ, real CURVE keys, real collectors (``build_collector``) on SQLite files;
every wait polls for the effect itself (rows, the spool, a counter bumped before it).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from slurmgpu import keys, wire
from slurmgpu.agent.link import STALL_HEARTBEATS
from slurmgpu.agent.spool import Spool
from slurmgpu.collector import transport as transport_mod
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.config.load import load_config
from slurmgpu.config.schema import CollectorSettings, with_port
from slurmgpu.errors import ConfigError
from tests.agenthelpers import free_port, query_db, wait_until
from tests.test_agent_failover import (  # noqa: F401
    BOUND_S,
    LINK_HEARTBEAT_S,
    NODE,
    Serving,
    keys_dir,
    make_link,
    report,
    spool,
)
from tests.test_link_events_first import event

OTHER = "n2"  # a second node whose reports fill the main socket's queue


def _settings(tmp_path: Path, keys_dir: Path, *, events_port: int) -> CollectorSettings:  # noqa: F811
    port = free_port()
    return CollectorSettings(address=f"tcp://127.0.0.1:{port}", bind=f"tcp://127.0.0.1:{port}",
                             db=str(tmp_path / "fleet.db"), keys_dir=str(keys_dir), heartbeat_s=0.2,
                             events_port=events_port)


@pytest.fixture
def settings(tmp_path: Path, keys_dir: Path) -> CollectorSettings:  # noqa: F811
    return _settings(tmp_path, keys_dir, events_port=free_port())


@pytest.fixture
def links(make_link: Any) -> Any:  # noqa: F811
    return lambda address, events_port: make_link(address, events_port=events_port)


def stored(settings: CollectorSettings, node: str, epoch: str | None = None) -> dict[int, str]:
    """seq -> type of ``node``'s stored messages (hellos left out)."""
    if not Path(settings.db).exists():
        return {}
    rows = query_db(Path(settings.db), "SELECT seq, type, epoch FROM messages WHERE node = ? AND type != 'hello'",
                    node)
    return {int(seq): mtype for seq, mtype, ep in rows if epoch is None or ep == epoch}


def flood(keys_dir: Path, address: str, count: int) -> zmq.Socket[Any]:  # noqa: F811
    """Another node's DEALER (``OTHER``, allow-listed) with ``count`` reports queued for
    the collector's main socket."""
    public, secret, server = keys.client_keys(keys_dir / "bundles" / OTHER)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10 * count)
    sock.connect(address)
    body = {"verdict": "OK", "findings": [], "facts": {}}
    for seq in range(1, count + 1):
        sock.send(wire.message_frame(wire.REPORT, OTHER, seq, body, epoch="flood"))
    return sock


def event_served_alone(collector: Collector, settings: CollectorSettings, spool: Spool,  # noqa: F811
                       links: Any) -> Any:
    """An event sent on the events socket by NODE's link; the collector's next loop turn
    stores it alone. Returns the link."""
    link = links(settings.addresses[0], settings.events_port)
    fault = event(spool)
    link.wake()
    wait_until(lambda: link.events_sent == 1, timeout=BOUND_S, what="the event sent on the events socket")
    wait_until(lambda: collector.transport.events_sock.poll(0), timeout=BOUND_S,  # type: ignore[union-attr]
               what="the event queued at the collector")
    assert collector.serve_once(0) == 1  # the event alone
    assert stored(settings, NODE, spool.epoch) == {fault: "event"}
    return link


def test_the_event_is_acked_in_a_batch_of_its_own_ahead_of_the_queue(
        settings: CollectorSettings, keys_dir: Path, spool: Spool, links: Any) -> None:  # noqa: F811
    """Reports queued on the main socket, an event on the events socket: the collector's
    next batch is the event alone, stored and acked before any of the reports."""
    keys.add_node(keys_dir, OTHER)
    collector = build_collector(settings)
    backlog = flood(keys_dir, settings.addresses[0], 300)
    try:
        assert collector.transport.events_sock is not None
        wait_until(lambda: collector.transport.sock.poll(0), timeout=BOUND_S, what="reports queued")
        link = event_served_alone(collector, settings, spool, links)
        assert stored(settings, OTHER) == {}
        wait_until(lambda: spool.pending() == [] and spool.count() == 0, timeout=BOUND_S,
                   what="the event's ack, on the events socket")
        deadline = time.monotonic() + BOUND_S
        while len(stored(settings, OTHER)) < 300 and time.monotonic() < deadline:
            collector.serve_once(50)
        assert len(stored(settings, OTHER)) == 300  # then the reports, every one
        assert link.events_fallbacks == 0
    finally:
        backlog.close(linger=0)
        collector.close()


def test_while_the_wal_is_started_over_events_are_stored_and_reports_wait(
        settings: CollectorSettings, keys_dir: Path, spool: Spool, links: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store holding bulk batches (its WAL being started over, ``Store.wal_holding``):
    the loop reads the events socket alone, so a live node's event is stored and acked
    meanwhile; the reports queued on the main socket are stored once the hold ends."""
    keys.add_node(keys_dir, OTHER)
    collector = build_collector(settings)
    backlog = flood(keys_dir, settings.addresses[0], 50)
    holding = [True]
    monkeypatch.setattr(collector.fleet.store, "wal_holding", lambda: holding[0])
    try:
        assert collector.transport.events_sock is not None
        wait_until(lambda: collector.transport.sock.poll(0), timeout=BOUND_S, what="reports queued")
        assert collector.serve_once(0) == 0  # (held: the main socket is not read)
        event_served_alone(collector, settings, spool, links)
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="the event's ack")
        for _ in range(5):
            collector.serve_once(10)
        assert stored(settings, OTHER) == {}  # still held
        holding[0] = False
        deadline = time.monotonic() + BOUND_S
        while len(stored(settings, OTHER)) < 50 and time.monotonic() < deadline:
            collector.serve_once(50)
        assert len(stored(settings, OTHER)) == 50
    finally:
        backlog.close(linger=0)
        collector.close()


def test_reports_on_the_events_socket_are_refused_not_acked(
        settings: CollectorSettings, keys_dir: Path) -> None:  # noqa: F811
    """Only events and command results belong there: anything else is counted as
    ``unexpected_type`` and not acked, so the agent still has it for the main socket."""
    collector = build_collector(settings)
    public, secret, server = keys.client_keys(keys_dir / "bundles" / NODE)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.setsockopt(zmq.LINGER, 0)
    try:
        endpoint = settings.events_endpoint(settings.addresses[0])
        assert endpoint is not None
        sock.connect(endpoint)
        body = {"verdict": "OK", "findings": [], "facts": {}}
        sock.send(wire.message_frame(wire.REPORT, NODE, 1, body, epoch="e"))
        deadline = time.monotonic() + BOUND_S
        while collector.counters.rejected["unexpected_type"] == 0 and time.monotonic() < deadline:
            collector.serve_once(50)
        assert collector.counters.rejected["unexpected_type"] == 1
        assert stored(settings, NODE) == {}
        assert collector.counters.acks_sent == 0 and not sock.poll(200)
    finally:
        sock.close(linger=0)
        collector.close()


def test_no_events_port_at_the_collector_events_go_with_the_reports(
        tmp_path: Path, keys_dir: Path, spool: Spool, links: Any) -> None:  # noqa: F811
    """An older collector, or events_port = 0 there: the link's events socket never
    connects, and events are sent and acked on the main socket."""
    settings = _settings(tmp_path, keys_dir, events_port=0)
    serving = Serving(settings).start()
    try:
        assert serving.collector is not None and serving.collector.transport.events_sock is None
        link = links(settings.addresses[0], free_port())  # nothing listens there
        seqs = {report(spool, link), event(spool), report(spool, link)}
        link.wake()
        wait_until(lambda: set(stored(settings, NODE, spool.epoch)) == seqs, timeout=BOUND_S,
                   what="all stored through the main socket")
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="every ack back")
        assert link.events_sent == 0 and not link.events_up
    finally:
        serving.close()


def test_events_unacked_on_the_events_socket_go_on_the_main_one(
        settings: CollectorSettings, spool: Spool, links: Any) -> None:  # noqa: F811
    """The events socket connects but its messages are never acked (a collector that does
    not read it): after STALL_HEARTBEATS heartbeats the link sends them on the main
    socket, where they are stored and acked."""
    serving = Serving(settings)
    collector = serving.start().collector
    assert collector is not None
    collector.transport._take_events = lambda *_args: 0  # type: ignore[method-assign]
    try:
        link = links(settings.addresses[0], settings.events_port)
        wait_until(lambda: link.connected and link.events_up, timeout=BOUND_S, what="both sockets up")
        fault = event(spool)
        link.wake()
        wait_until(lambda: link.events_sent == 1, timeout=BOUND_S, what="sent on the events socket")
        sent_at = time.monotonic()
        wait_until(lambda: fault in stored(settings, NODE, spool.epoch), timeout=BOUND_S + STALL_HEARTBEATS,
                   what="the event stored through the main socket")
        assert time.monotonic() - sent_at >= STALL_HEARTBEATS * LINK_HEARTBEAT_S * 0.9
        assert link.events_fallbacks == 1
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="its ack")
    finally:
        serving.close()


def test_a_collector_without_its_events_port_runs(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                                   spool: Spool, links: Any) -> None:  # noqa: F811
    """The events port taken by another process: logged, and the collector serves (events
    come with the reports)."""
    taken = zmq.Context.instance().socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    settings = _settings(tmp_path, keys_dir, events_port=port)
    serving = Serving(settings).start()
    try:
        assert serving.collector is not None and serving.collector.transport.events_sock is None
        link = links(settings.addresses[0], port)
        fault = event(spool)
        link.wake()
        wait_until(lambda: fault in stored(settings, NODE, spool.epoch), timeout=BOUND_S, what="stored")
    finally:
        serving.close()
        taken.close(linger=0)


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("tcp://head:7150", "tcp://head:7151"),
    ("tcp://*:7150", "tcp://*:7151"),
    ("tcp://[fd00::2]:7150", "tcp://[fd00::2]:7151"),
    ("tcp://127.0.0.1:*", "tcp://127.0.0.1:7151"),
    ("ipc:///run/slurmgpu/collector.sock", None),
])
def test_the_events_endpoint_is_the_address_with_events_port(endpoint: str, expected: str | None) -> None:
    assert with_port(endpoint, 7151) == expected
    assert dataclasses.replace(CollectorSettings(), events_port=0).events_endpoint(endpoint) is None


def test_events_port_in_the_config(tmp_path: Path) -> None:
    path = tmp_path / "slurmgpu.toml"
    path.write_text("[collector]\nevents_port = 0\n", encoding="utf-8")
    assert load_config(str(path), environ={}).settings_for("gpu-001").collector.events_port == 0
    assert CollectorSettings().events_port == 7151
    path.write_text("[collector]\nevents_port = 70000\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"slurmgpu\.toml:.*events_port") as info:
        load_config(str(path), environ={})
    assert "\n" not in str(info.value)


def test_batches_read_longer_on_postgresql(tmp_path: Path, keys_dir: Path, store_url: str) -> None:  # noqa: F811
    """A batch's fixed cost on PostgreSQL is a dozen round trips: its batches read for up
    to 50 ms, SQLite's for 10 (an event waits for at most about twice that)."""
    settings = dataclasses.replace(_settings(tmp_path, keys_dir, events_port=0), db=store_url)
    collector = build_collector(settings)
    try:
        expected = transport_mod.MAX_BATCH_READ_S_POSTGRES if store_url.startswith("postgresql") \
            else transport_mod.MAX_BATCH_READ_S
        assert collector.transport.max_batch_read_s == expected
    finally:
        collector.close()


class _Frame:
    """A received zmq frame as ``Transport._accept`` reads it: its bytes, and the CURVE
    key it came with (``User-Id``)."""

    def __init__(self, data: bytes, user: str) -> None:
        self.bytes, self._user = data, user

    def __len__(self) -> int:
        return len(self.bytes)

    def get(self, name: str) -> str:
        assert name == "User-Id"
        return self._user


class _Queue:
    """Stands in for a ROUTER socket: the frames queued on it, read in order."""

    def __init__(self, frames: list[list[_Frame]]) -> None:
        self.frames = frames

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[_Frame]:
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


class _Batches:
    """A Handler that stores everything and records each batch's message types."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def commit(self, batch: Any, now: float) -> Any:
        from slurmgpu.collector.transport import Stored

        self.batches.append([env.type for _, env, _ in batch])
        return Stored([(node, env.seq) for node, env, _ in batch], set())

    def acked(self, batch: Any, new: Any, now: float) -> None:
        pass


def test_a_flood_of_events_does_not_starve_the_reports(
        settings: CollectorSettings, keys_dir: Path) -> None:  # noqa: F811
    """A node sending nothing but events on the events socket: a batch of events alone is
    never followed by another, and the batch after it reads only reports, so the reports
    queued on the main socket are read every other batch however long the flood lasts."""
    transport = transport_mod.Transport(settings, transport_mod.Counters())
    sockets = transport.sock, transport.events_sock
    try:
        user = keys.client_keys(keys_dir / "bundles" / NODE)[0].decode()
        body = {"kind": "xid", "gpu": 3, "data": 13, "verdict": "WARN", "findings": []}
        flood_frames = [[_Frame(b"\x00ev", user),
                         _Frame(wire.message_frame(wire.EVENT, NODE, seq, body, epoch="storm"), user)]
                        for seq in range(1, 20_001)]
        reports = [[_Frame(b"\x00rp", user),
                    _Frame(wire.message_frame(wire.REPORT, NODE, seq, {"verdict": "OK", "findings": [],
                                                                       "facts": {}}, epoch="main"), user)]
                   for seq in range(1, 201)]
        transport.events_sock = _Queue(flood_frames)  # type: ignore[assignment]
        transport.sock = _Queue(reports)  # type: ignore[assignment]
        transport._send = lambda *_args: True  # type: ignore[method-assign]
        handler = _Batches()
        while reports:
            transport._drain_batch(handler)  # type: ignore[arg-type]
            assert len(handler.batches) < 40, "the reports are starved"
        assert flood_frames, "the reports waited for the whole flood"
        for first, second in zip(handler.batches[::2], handler.batches[1::2], strict=False):
            assert set(first) == {"event"} and set(second) == {"report"}  # events, then reports
        transport._drain_batch(handler)  # type: ignore[arg-type]
        assert set(handler.batches[-1]) == {"event"}  # and the flood goes on
    finally:
        transport.sock, transport.events_sock = sockets
        transport.close()


class _Late(_Queue):
    """An events socket whose frames arrive once the batch has begun: empty when the
    batch starts (its first read), then the frames."""

    def __init__(self, frames: list[list[_Frame]]) -> None:
        super().__init__(frames)
        self.reads = 0

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[_Frame]:
        self.reads += 1
        if self.reads == 1:
            raise zmq.Again()
        return super().recv_multipart(flags, copy)


def test_an_event_taken_while_a_batch_reads_is_stored_and_acked_before_it(
        settings: CollectorSettings, keys_dir: Path) -> None:  # noqa: F811
    """Reports queued on the main socket; an event reaches the events socket after the
    batch began: the batch stops reading, the event is committed alone and acked, and only
    then are the reports read before it committed (and acked)."""
    transport = transport_mod.Transport(settings, transport_mod.Counters())
    sockets = transport.sock, transport.events_sock
    try:
        user = keys.client_keys(keys_dir / "bundles" / NODE)[0].decode()
        fault = wire.message_frame(wire.EVENT, NODE, 1, {"kind": "xid", "gpu": 3, "data": 79, "verdict": "FAIL",
                                                         "findings": []}, epoch="live")
        reports = [[_Frame(b"\x00rp", user),
                    _Frame(wire.message_frame(wire.REPORT, NODE, seq, {"verdict": "OK", "findings": []},
                                              epoch="backlog"), user)]
                   for seq in range(1, 201)]
        transport.events_sock = _Late([[_Frame(b"\x00ev", user), _Frame(fault, user)]])  # type: ignore[assignment]
        transport.sock = _Queue(reports)  # type: ignore[assignment]
        steps: list[str] = []

        def send(_route: bytes, frame: bytes, _sock: Any = None) -> bool:
            sent = wire.decode(frame)
            steps.append(f"ack {sent.epoch}" if sent.type == wire.ACK else sent.type)
            return True

        transport._send = send  # type: ignore[method-assign]
        handler = _Batches()
        commit = handler.commit

        def record(batch: Any, now: float) -> Any:
            steps.append("commit " + ",".join(sorted({env.type for _, env, _ in batch})))
            return commit(batch, now)

        handler.commit = record  # type: ignore[method-assign]
        transport._drain_batch(handler)  # type: ignore[arg-type]
        assert steps[:2] == ["commit event", "ack live"]
        assert steps[2] == "commit report" and set(steps[3:]) == {"ack backlog"}
        assert transport_mod.EVENTS_POLL_EVERY <= len(handler.batches[1]) < 200  # read before the event, no more
        assert handler.batches[0] == ["event"]
    finally:
        transport.sock, transport.events_sock = sockets
        transport.close()
