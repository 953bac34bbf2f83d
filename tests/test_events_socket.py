"""Issue 15, live events during a backlog drain: events and command results have a
socket of their own (``[collector] events_port``). The collector reads it once every loop
turn and stores and acks what it holds in a batch of its own, before the turn's reports,
however many the fleet has queued on the main socket; the agent's link falls back to the
main socket when the events socket is not there, drops, or does not ack.

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
    stores it, in a batch of its own. Returns the link."""
    link = links(settings.addresses[0], settings.events_port)
    fault = event(spool)
    link.wake()
    wait_until(lambda: link.events_sent == 1, timeout=BOUND_S, what="the event sent on the events socket")
    wait_until(lambda: collector.transport.events_sock.poll(0), timeout=BOUND_S,  # type: ignore[union-attr]
               what="the event queued at the collector")
    batches = collector.counters.batches
    collector.serve_once(0)
    assert stored(settings, NODE, spool.epoch) == {fault: "event"}
    assert collector.counters.batches - batches in (1, 2)  # the event's, then the reports'
    return link


def test_the_event_is_acked_in_a_batch_of_its_own_ahead_of_the_queue(
        settings: CollectorSettings, keys_dir: Path, spool: Spool, links: Any) -> None:  # noqa: F811
    """Reports queued on the main socket, an event on the events socket: the collector's
    next turn stores and acks the event, and at most a batch of the reports."""
    keys.add_node(keys_dir, OTHER)
    collector = build_collector(settings)
    backlog = flood(keys_dir, settings.addresses[0], 300)
    try:
        assert collector.transport.events_sock is not None
        wait_until(lambda: collector.transport.sock.poll(0), timeout=BOUND_S, what="reports queued")
        link = event_served_alone(collector, settings, spool, links)
        assert len(stored(settings, OTHER)) <= transport_mod.MAX_BATCH
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


def test_batches_are_smaller_on_postgresql(tmp_path: Path, keys_dir: Path, store_url: str) -> None:  # noqa: F811
    """A PostgreSQL batch's commit takes longer (two collectors, a dozen round trips): its
    batches hold MAX_BATCH_POSTGRES messages, so a live event waits less behind one."""
    settings = dataclasses.replace(_settings(tmp_path, keys_dir, events_port=0), db=store_url)
    collector = build_collector(settings)
    try:
        expected = transport_mod.MAX_BATCH_POSTGRES if store_url.startswith("postgresql") \
            else transport_mod.MAX_BATCH
        assert collector.transport.max_batch == expected < 1000
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

    def poll(self, timeout_ms: int = 0) -> int:
        return zmq.POLLIN if self.frames else 0


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
    """A node sending nothing but events on the events socket: every loop turn reads at
    most MAX_EVENTS_PER_BATCH of them and some of the reports queued on the main socket,
    so the reports are read every turn however long the flood lasts."""
    transport = transport_mod.Transport(settings, transport_mod.Counters(), max_batch=50, max_batch_read_s=0)
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
        turns = 0
        while reports and turns < 20:
            transport._turn(handler)  # type: ignore[arg-type]
            turns += 1
        assert not reports, "the reports are starved"
        assert flood_frames, "the reports waited for the whole flood"
        # events, then reports (EVENTS_PEEK_EVERY of them: more events wait)
        assert [set(b) for b in handler.batches] == [{"event"}, {"report"}] * turns
        assert {len(b) for b in handler.batches[::2]} == {transport_mod.MAX_EVENTS_PER_BATCH}
    finally:
        transport.sock, transport.events_sock = sockets
        transport.close()


def test_a_turns_events_are_stored_and_acked_before_its_reports(
        settings: CollectorSettings, keys_dir: Path) -> None:  # noqa: F811
    """Reports queued on the main socket, an event on the events socket: the loop turn
    commits and acks the event alone, and only then the reports it read."""
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
        transport.events_sock = _Queue([[_Frame(b"\x00ev", user), _Frame(fault, user)]])  # type: ignore[assignment]
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
        transport._turn(handler)  # type: ignore[arg-type]
        assert steps == ["commit event", "ack live", "commit report", "ack backlog"]
        assert handler.batches[0] == ["event"] and len(handler.batches[1]) == transport_mod.EVENTS_PEEK_EVERY
    finally:
        transport.sock, transport.events_sock = sockets
        transport.close()


class _Trickle(_Queue):
    """A main socket whose frames come one at a time: empty between two of them."""

    def __init__(self, frames: list[list[_Frame]]) -> None:
        super().__init__(frames)
        self.dry = False

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[_Frame]:
        self.dry = not self.dry
        if self.dry:
            return super().recv_multipart(flags, copy)
        raise zmq.Again()


def test_a_turn_waits_for_more_reports_before_its_one_commit(
        settings: CollectorSettings, keys_dir: Path) -> None:  # noqa: F811
    """Reports arriving one by one (a fleet in steady state): a loop turn reads one, waits
    out ``max_batch_read_s`` for more, and commits (and acks) what came in one batch,
    instead of one commit per report."""
    transport = transport_mod.Transport(settings, transport_mod.Counters(), max_batch_read_s=0.001)
    sockets = transport.sock, transport.events_sock
    try:
        user = keys.client_keys(keys_dir / "bundles" / NODE)[0].decode()
        reports = [[_Frame(b"\x00rp", user),
                    _Frame(wire.message_frame(wire.REPORT, NODE, seq, {"verdict": "OK", "findings": []},
                                              epoch="steady"), user)]
                   for seq in (1, 2)]
        transport.sock = _Trickle(reports)  # type: ignore[assignment]
        transport.events_sock = _Queue([])  # type: ignore[assignment]
        transport._send = lambda *_args: True  # type: ignore[method-assign]
        handler = _Batches()
        assert transport._turn(handler) == 2  # type: ignore[arg-type]
        assert handler.batches == [["report", "report"]]
    finally:
        transport.sock, transport.events_sock = sockets
        transport.close()
