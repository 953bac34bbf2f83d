"""Issue 15, drain throughput: an agent draining a backlog sends its spooled frames in
bundles (``wire.BUNDLE``), once the collector's acks say it takes them. The collector
checks each bundled frame as if it came alone (same authenticated node, acked types
only), stores and acks them as one batch's messages.

Real ZeroMQ, real CURVE keys, real collectors (``build_collector``) on SQLite files;
every wait polls for the effect itself (rows, the spool, a counter bumped before it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from slurmgpu import keys, wire
from slurmgpu.agent import link as link_mod
from slurmgpu.agent.spool import Spool
from slurmgpu.collector import transport as transport_mod
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.sim import fleet as simfleet
from slurmgpu.wire import WireError
from tests.agenthelpers import free_port, query_db, wait_until
from tests.test_agent_failover import (  # noqa: F401
    BOUND_S,
    NODE,
    Serving,
    keys_dir,
    make_link,
    report,
    spool,
)
from tests.test_link_events_first import event

OTHER = "n2"
BODY = {"verdict": "OK", "findings": [], "facts": {}}


@pytest.fixture
def settings(tmp_path: Path, keys_dir: Path) -> CollectorSettings:  # noqa: F811
    port = free_port()
    return CollectorSettings(address=f"tcp://127.0.0.1:{port}", bind=f"tcp://127.0.0.1:{port}",
                             db=str(tmp_path / "fleet.db"), keys_dir=str(keys_dir), heartbeat_s=0.2,
                             events_port=free_port())


def stored(settings: CollectorSettings, node: str = NODE) -> dict[int, str]:
    """seq -> type of ``node``'s stored messages."""
    if not Path(settings.db).exists():
        return {}
    rows = query_db(Path(settings.db), "SELECT seq, type FROM messages WHERE node = ?", node)
    return {int(seq): mtype for seq, mtype in rows}


def frame(seq: int, mtype: str = wire.REPORT, node: str = NODE, body: dict[str, Any] | None = None) -> bytes:
    return wire.message_frame(mtype, node, seq, BODY if body is None else body, epoch="e1")


@pytest.fixture
def dealer(settings: CollectorSettings, keys_dir: Path) -> Iterator[Any]:  # noqa: F811
    """A node's raw DEALER (NODE's key) connected to the collector's main socket, or to
    its events socket with ``events=True``."""
    socks: list[zmq.Socket[Any]] = []

    def make(*, events: bool = False) -> zmq.Socket[Any]:
        public, secret, server = keys.client_keys(keys_dir / "bundles" / NODE)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
        sock.setsockopt(zmq.LINGER, 0)
        endpoint = settings.events_endpoint(settings.addresses[0]) if events else settings.addresses[0]
        assert endpoint is not None
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    yield make
    for sock in socks:
        sock.close(linger=0)


def serve_until(collector: Collector, done: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while not done() and time.monotonic() < deadline:
        collector.serve_once(50)
    assert done()


def acks(sock: zmq.Socket[Any]) -> list[wire.Envelope]:
    """The acks waiting on ``sock`` (heartbeats left out)."""
    out = []
    while sock.poll(500):
        env = wire.decode(sock.recv())
        if env.type == wire.ACK:
            out.append(env)
    return out


# --------------------------------------------------------------------------- the wire


def test_a_bundle_round_trips_and_its_frames_stay_bytes() -> None:
    frames = [frame(1), frame(2, wire.HELLO, body={"version": "1", "gpus": 8, "interval_s": 15.0})]
    env = wire.decode(wire.bundle_frame(NODE, frames))
    assert env.type == wire.BUNDLE and env.seq == 0 and env.body == {"frames": frames}
    assert [wire.decode(f).seq for f in env.body["frames"]] == [1, 2]


@pytest.mark.parametrize("frames, error", [
    ([], "1 to 256 frames"),
    ([b"x"] * (wire.MAX_BUNDLE + 1), "1 to 256 frames"),
    ([b"x", "a string"], "frames must be msgpack frames"),
    ([b"x", 7], "frames must be msgpack frames"),
    ("not a list", "1 to 256 frames"),
])
def test_a_malformed_bundle_is_a_wire_error(frames: Any, error: str) -> None:
    raw = msgpack.packb({"v": 1, "id": "a" * 32, "node": NODE, "seq": 0, "ts": 1.0e9, "type": wire.BUNDLE,
                         "body": {"frames": frames}}, use_bin_type=True)
    with pytest.raises(WireError, match=error):
        wire.decode(raw)


def test_a_bundle_that_does_not_fit_a_frame_is_refused_by_its_sender() -> None:
    with pytest.raises(WireError, match="bytes"):
        wire.bundle_frame(NODE, [b"\x80" * (wire.MAX_FRAME // 4)] * 5)


# --------------------------------------------------------------------------- the collector


def test_a_bundle_is_stored_and_acked_as_its_messages(settings: CollectorSettings, dealer: Any) -> None:
    collector = build_collector(settings)
    try:
        sock = dealer()
        hello = wire.message_frame(wire.HELLO, NODE, 1, {"version": "1", "gpus": 8, "interval_s": 15.0},
                                   epoch="e1")
        sock.send(wire.bundle_frame(NODE, [hello, *(frame(seq) for seq in range(2, 42))]))
        serve_until(collector, lambda: len(stored(settings)) == 41)
        assert stored(settings) == {1: "hello", **{seq: "report" for seq in range(2, 42)}}
        got = acks(sock)
        assert len(got) == 1, "one ack for the bundle's 41 messages"
        assert sorted(got[0].body["seqs"]) == list(range(1, 42)) and got[0].epoch == "e1"
        assert got[0].body["bundle"] == CollectorSettings.bundle  # (the default)
        counters = collector.counters
        assert (counters.received, counters.bundles, counters.bundled, counters.stored) == (1, 1, 41, 41)
        sock.send(wire.bundle_frame(NODE, [frame(seq) for seq in range(2, 42)]))  # resent: duplicates
        serve_until(collector, lambda: collector.counters.duplicates == 40)
        assert sorted(acks(sock)[0].body["seqs"]) == list(range(2, 42))
        assert collector.counters.stored == 41
    finally:
        collector.close()


def test_each_bundled_frame_is_checked_as_if_it_came_alone(settings: CollectorSettings, keys_dir: Path,  # noqa: F811
                                                           dealer: Any) -> None:
    """Another node's frame, a heartbeat, a bundle in the bundle, garbage: refused and not
    acked; a report whose body is malformed: acked as rejected; the good ones stored."""
    keys.add_node(keys_dir, OTHER)
    collector = build_collector(settings)
    try:
        sock = dealer()
        inner = wire.bundle_frame(NODE, [frame(90)])
        malformed = msgpack.packb({"v": 1, "id": "b" * 32, "node": NODE, "seq": 5, "ts": 1.0e9,
                                   "type": wire.REPORT, "epoch": "e1", "body": {"verdict": 7}},
                                  use_bin_type=True)
        sock.send(wire.bundle_frame(NODE, [frame(1), frame(2, node=OTHER), wire.heartbeat_frame(NODE), inner,
                                           b"\xc1garbage", malformed, frame(6)]))
        serve_until(collector, lambda: len(stored(settings)) == 2)
        got = acks(sock)
        assert [sorted(a.body["seqs"]) for a in got] == [[1, 5, 6]]
        assert got[0].body["rejected"] == [5]
        assert stored(settings) == {1: "report", 6: "report"} and stored(settings, OTHER) == {}
        rejected = collector.counters.rejected
        assert (rejected["node_mismatch"], rejected["unexpected_type"], rejected["malformed"]) == (1, 2, 2)
    finally:
        collector.close()


def test_a_bundle_on_the_events_socket_is_refused(settings: CollectorSettings, dealer: Any) -> None:
    """Events come one by one there: a bundle is not acked, the agent sends it again on
    the main socket."""
    collector = build_collector(settings)
    try:
        sock = dealer(events=True)
        sock.send(wire.bundle_frame(NODE, [frame(1, wire.EVENT, body={"kind": "xid", "verdict": "FAIL",
                                                                    "findings": []})]))
        serve_until(collector, lambda: collector.counters.rejected["unexpected_type"] == 1)
        assert stored(settings) == {} and acks(sock) == []
    finally:
        collector.close()


@pytest.mark.parametrize("offer", [1, 16, 64])
def test_every_ack_offers_the_configured_bundle(settings: CollectorSettings, dealer: Any, offer: int) -> None:
    """``[collector] bundle``: the bundle size every ack offers, whatever the rate or the
    number of nodes heard."""
    collector = build_collector(dataclasses.replace(settings, bundle=offer))
    try:
        sock = dealer()
        sock.send(frame(1))
        serve_until(collector, lambda: bool(stored(settings)))
        sock.send(wire.bundle_frame(NODE, [frame(2), frame(3)]))
        serve_until(collector, lambda: len(stored(settings)) == 3)
        assert [env.body["bundle"] for env in acks(sock)] == [offer, offer]
    finally:
        collector.close()


def test_the_bundle_setting_is_bounded(tmp_path: Path) -> None:
    """A bundle of 0 or past a frame's MAX_BUNDLE frames: a one-line error at load."""
    from slurmgpu.config.load import load_config
    from slurmgpu.errors import ConfigError

    path = tmp_path / "slurmgpu.toml"
    for bad in (0, wire.MAX_BUNDLE + 1):
        path.write_text(f"[collector]\nbundle = {bad}\n")
        with pytest.raises(ConfigError, match=r"bundle") as info:
            load_config(str(path), environ={})
        assert "\n" not in str(info.value)


def test_the_link_follows_the_offer(spool: Spool, keys_dir: Path) -> None:  # noqa: F811
    """Every ack on the main socket sets the bundle size (at most BUNDLE_FRAMES), and with
    it the window: one bundle in flight; WINDOW frames one by one for a collector whose
    acks say nothing of bundles; one frame before the first ack."""
    link = link_mod.Link(addresses=["tcp://127.0.0.1:1"], node=NODE,
                         keys=keys.client_keys(keys_dir / "bundles" / NODE), spool=spool,
                         heartbeat_s=1.0, on_command=lambda _m: None)

    def ack(offer: int | None, main: bool = True) -> None:
        body: dict[str, Any] = {"seqs": [], **({} if offer is None else {"bundle": offer})}
        link._ack(wire.Envelope(type=wire.ACK, node=NODE, seq=0, body=body), main=main)

    rows = [(seq, b"x" * 100) for seq in range(1, 101)]
    assert link._window() == 1 and len(link._groups(rows)) == 100  # nothing said yet
    ack(8)
    assert link._window() == 8 and [len(g) for g in link._groups(rows)] == [8] * 12 + [4]
    ack(1000)
    assert link._window() == link_mod.BUNDLE_FRAMES
    ack(1, main=False)  # the events socket's acks say nothing of the main connection
    assert link._window() == link_mod.BUNDLE_FRAMES
    ack(1)  # no bundles now, one frame in flight
    assert link._window() == 1 and len(link._groups(rows)) == 100
    ack(None)  # a collector older than bundles
    assert link._window() == link_mod.WINDOW and len(link._groups(rows)) == 100
    ack(32)
    big = [(1, b"x" * (link_mod.BUNDLE_BYTES - 10)), (2, b"y" * 20), (3, b"z" * 20)]
    assert [[seq for seq, _ in g] for g in link._groups(big)] == [[1], [2, 3]]


# --------------------------------------------------------------------------- the agent


def drain(settings: CollectorSettings, spool: Spool, make_link: Any,  # noqa: F811
          count: int) -> tuple[Any, Any]:
    """``count`` reports spooled while no collector ran, then a collector and a link: once
    the spool is empty and every report stored, (the link, the collector's counters)."""
    backlog = {report(spool) for _ in range(count)}
    serving = Serving(settings).start()
    try:
        link = make_link(settings.addresses[0], events_port=settings.events_port)
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="the backlog drained")
        assert backlog <= set(stored(settings))
        assert serving.collector is not None
        return link, serving.collector.counters
    finally:
        serving.close()


def test_a_backlog_drains_in_bundles(settings: CollectorSettings, spool: Spool,  # noqa: F811
                                     make_link: Any) -> None:  # noqa: F811
    """A backlog spooled while the collector was down goes out in bundles once its acks
    say it takes them; every message is stored once and the spool empties."""
    link, counters = drain(settings, spool, make_link, 600)
    assert link.bundles_sent > 0 and counters.bundles == link.bundles_sent
    # the first frame goes before any ack (alone), the rest in bundles
    assert counters.bundled == 600 - 1
    assert counters.duplicates == 0 and counters.rejected == {}


def older(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectors built from now on are as before bundles: acks without ``bundle``, and a
    bundle refused (here as an unexpected type; there as an unknown one), unacked."""
    ack_frame = wire.ack_frame
    monkeypatch.setattr(wire, "ack_frame", lambda *args, bundle=0, **kwargs: ack_frame(*args, **kwargs))
    monkeypatch.setattr(transport_mod.Transport, "_unbundle", lambda self, _frames, node, *_rest:
                        self._reject("unexpected_type", node=node, type=wire.BUNDLE))


def test_no_bundles_to_a_collector_that_does_not_say_it_takes_them(
        settings: CollectorSettings, spool: Spool, make_link: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector older than bundles: its acks do not carry ``bundle``, and it would
    refuse one unacked (here: as an unexpected type). The backlog goes one by one."""
    older(monkeypatch)
    link, counters = drain(settings, spool, make_link, 400)
    assert link.bundles_sent == 0 and counters.rejected == {}


def test_a_restarted_collector_that_is_older_gets_no_bundles(
        settings: CollectorSettings, spool: Spool, make_link: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bundles are per connection: after a collector that took them is replaced by one
    that does not say so (a downgrade), the link sends one by one again."""
    serving = Serving(settings).start()
    link = make_link(settings.addresses[0], events_port=settings.events_port)
    try:
        first = {report(spool) for _ in range(400)}
        link.wake()
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="the first backlog drained")
        assert link.bundles_sent > 0 and first <= set(stored(settings))
        serving.close()
        older(monkeypatch)
        sent = link.bundles_sent
        second = {report(spool) for _ in range(400)}
        serving = Serving(settings).start()
        link.wake()
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S * 2, what="the second backlog drained")
        assert second <= set(stored(settings))
        assert link.bundles_sent == sent
        assert serving.collector is not None and serving.collector.counters.rejected == {}
    finally:
        serving.close()


def test_events_are_not_held_behind_a_bundled_backlog(settings: CollectorSettings, spool: Spool,  # noqa: F811
                                                      make_link: Any) -> None:  # noqa: F811
    """An event spooled behind a backlog goes first, on the events socket (or the main
    one, when the link's loop had its events turn just before it was spooled): stored,
    with every report."""
    serving = Serving(settings).start()
    try:
        link = make_link(settings.addresses[0], events_port=settings.events_port)
        wait_until(lambda: link.connected and link.events_up, timeout=BOUND_S, what="both sockets up")
        backlog = {report(spool) for _ in range(1000)}
        fault = event(spool)
        link.wake()
        wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="all drained")
        assert stored(settings)[fault] == "event" and backlog <= set(stored(settings))
    finally:
        serving.close()


# --------------------------------------------------------------------------- the simulator


@pytest.fixture
def simulated(settings: CollectorSettings, tmp_path: Path) -> Iterator[tuple[Serving, list[simfleet.SimNode],
                                                                            Any]]:
    """A serving collector, 3 simulated nodes it allows, and ``fleet(**kwargs)``: their SimFleet."""
    keys.init(tmp_path / "simkeys")
    settings = dataclasses.replace(settings, keys_dir=str(tmp_path / "simkeys"))
    nodes = simfleet.make_nodes(tmp_path / "simkeys", 3)
    server = simfleet.collector_public_key(tmp_path / "simkeys")
    serving = Serving(settings).start()
    try:
        yield serving, nodes, lambda **kwargs: simfleet.SimFleet(settings.addresses[0], server, nodes, **kwargs)
    finally:
        serving.close()


def test_the_simulator_bundles_only_when_the_collector_says_so(simulated: Any) -> None:
    serving, _, fleet = simulated
    with fleet(bundle=8) as sim:
        assert sim.hello(BOUND_S) == 3
        assert sim.collector_bundle == CollectorSettings.bundle
        stats = sim.run(1.0, None, window=16, drain_s=BOUND_S)
    assert stats.bundles_sent > 0 and stats.acked == stats.sent == 8 * stats.bundles_sent
    assert max(map(len, sim.inflight)) == 0
    assert serving.collector is not None
    wait_until(lambda: serving.collector is not None and serving.collector.counters.stored == 3 + stats.sent,
               timeout=BOUND_S, what="all stored")


def test_idle_simulated_nodes_heartbeat(simulated: Any) -> None:
    """Between a benchmark's phases the simulated nodes send heartbeats, as idle agents
    do: the collector keeps hearing them (none looks silent because the others warm up)."""
    serving, nodes, fleet = simulated
    with fleet() as sim:
        assert sim.hello(BOUND_S) == 3
        assert serving.collector is not None
        transport = serving.collector.transport
        wait_until(lambda: len(transport.liveness.seen) == 3, timeout=BOUND_S, what="the hellos heard")
        after_hello = dict(transport.liveness.seen)
        deadline = time.monotonic() + BOUND_S

        def heard_again() -> bool:
            return all(transport.liveness.seen.get(n.name, 0.0) > after_hello[n.name] for n in nodes)

        stats = sim.idle(lambda: heard_again() or time.monotonic() > deadline, heartbeat_s=0.05)
    assert heard_again() and stats.heartbeats_sent >= 3 and stats.sent == 0


def test_simulated_nodes_skip_heartbeats_as_agents_do(simulated: Any) -> None:
    """A simulated node heartbeats as an agent's link does: not while what it sent within
    BUSY_HEARTBEATS intervals is unacked (so the benchmark's collector reads no more
    heartbeats than agents would send it)."""
    _, _, fleet = simulated
    with fleet() as sim:
        assert sim.hello(BOUND_S) == 3
        stats = simfleet.FleetStats()
        now = time.perf_counter()
        sim.inflight[0][99], sim.last_sent[0] = now, now  # a report sent just now, unacked
        sim.inflight[1][99], sim.last_sent[1] = now, now - link_mod.BUSY_HEARTBEATS * 1.0  # unanswered that long
        for i in range(3):  # (node 2: nothing in flight)
            sim._heartbeat(i, stats, 1.0)
        sim.inflight[0].clear()
        sim.inflight[1].clear()
    assert (stats.heartbeat_turns, stats.heartbeats_skipped, stats.heartbeats_sent) == (3, 1, 2)


def test_simulated_nodes_heartbeat_an_interval_after_their_last_message(simulated: Any) -> None:
    """A simulated node's heartbeat is due ``heartbeat_s`` after anything it last sent, as
    an agent's link sends it: a node that just reported sends none."""
    _, _, fleet = simulated
    with fleet() as sim:
        assert sim.hello(BOUND_S) == 3
        stats = simfleet.FleetStats()
        now = time.perf_counter()
        sim._stagger_heartbeats(now - 10.0, 1.0)  # every node quiet for 9 s and more
        sim._quiet_from(0, time.perf_counter())  # node 0: a report just now
        sim._heartbeats_due(1.0, stats)
    assert (stats.heartbeat_turns, stats.heartbeats_sent) == (2, 2)
