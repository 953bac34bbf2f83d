"""Numbers at the int64 edges, in every numeric field of every message type, through
the real decode and store path (issue 12, items 1 and 9): nothing escapes ingest but
the documented WireError, the collector keeps storing other nodes' messages, a message
the store cannot take is rejected (not fatal), and a broken store stops the acks.

Before the bounds, an int >= 2**63 in ``seq`` or in a summary's GPU index raised
OverflowError in the store and took the collector down, over and over (the agent
resends the frame from its spool after each restart)."""

from __future__ import annotations

import contextlib
import copy
import math
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu import keys, wire, wiresummary
from slurmgpu.collector import transport as transport_mod
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.collector.fleet import _message_fault
from slurmgpu.collector.store import Store
from slurmgpu.wire import ACK, EVENT, REPORT, WireError, decode, decode_received
from tests.test_collector import Agent, make_settings

NODES = ("gpu-a", "gpu-b")
BIG = 2**64  # msgpack's integers stop below this: such a frame cannot exist
EDGES: list[Any] = [-(2**63) - 1, -(2**63), -1, 0, 1, 1023, 1024, 2**31, 2**63 - 1, 2**63, 2**64 - 1,
                    BIG, 10**30, math.nan, math.inf, -math.inf, 1e308, -0.0, 0.5, True, False]

SUMMARY = {"gpus": [[0, "SN0", "H100", 1, 0, 0, 0, 0, 0], [1, "SN1", "H100", 0, 0, 0, 0, 0, 0]],
           "ib": [["mlx5_0/1", "ACTIVE", 400.0, 0, 0, 0, 0, 0, 0]],
           "versions": ["H100", "550.54", "12.4", "2.21", "96.00", "28.39", "24.04", "6.8"]}
FINDING = {"check": "gpu.thermal", "severity": "WARN", "gpu": 3, "subject": None, "message": "hot"}
BODIES: dict[str, dict[str, Any]] = {
    wire.HELLO: {"version": "1.0", "gpus": 8, "interval_s": 15.0},
    wire.REPORT: {"verdict": "WARN", "findings": [FINDING], "ok_checks": ["gpu.ecc"], "facts": {"n": 1},
                  "throttle": 1, "summary": SUMMARY},
    wire.EVENT: {"kind": "xid", "gpu": 2, "data": 79, "verdict": "FAIL", "findings": [FINDING],
                 "coalesced": 1, "message": "Xid 79"},
    wire.HEARTBEAT: {},
    wire.ACK: {"seqs": [1], "rejected": [1]},
    wire.COMMAND: {"command": "ping", "args": {"n": 1}},
    wire.COMMAND_RESULT: {"command_id": "c1", "ok": True, "result": {"n": 1}},
    wire.BUNDLE: {"frames": [b"\x80"]},
}
# Every numeric field: the envelope's in every type, then each body's (nested included).
ENVELOPE_FIELDS = [(t, (k,)) for t in sorted(wire.TYPES) for k in ("seq", "ts", "v")]
BODY_FIELDS: list[tuple[str, tuple[Any, ...]]] = [
    (wire.HELLO, ("gpus",)), (wire.HELLO, ("interval_s",)),
    (REPORT, ("throttle",)), (REPORT, ("findings", 0, "gpu")), (REPORT, ("facts", "n")),
    (REPORT, ("summary", "gpus", 0, 0)), (REPORT, ("summary", "gpus", 1, 3)),
    (REPORT, ("summary", "gpus", 0, 8)), (REPORT, ("summary", "ib", 0, 2)),
    (REPORT, ("summary", "ib", 0, 3)), (REPORT, ("summary", "versions", 1)),
    (EVENT, ("gpu",)), (EVENT, ("data",)), (EVENT, ("coalesced",)), (EVENT, ("findings", 0, "gpu")),
    (ACK, ("seqs", 0)), (ACK, ("rejected", 0)),
    (wire.COMMAND, ("args", "n")), (wire.COMMAND_RESULT, ("result", "n")),
]
FIELDS = ENVELOPE_FIELDS + [(t, ("body", *p)) for t, p in BODY_FIELDS]


def build(mtype: str, path: tuple[Any, ...], value: Any, seq: int, node: str = "gpu-a") -> bytes | None:
    """A frame of ``mtype`` with ``value`` at ``path`` (the summary packed, as agents
    send it); None when msgpack cannot represent the value (so no frame can carry it)."""
    tree: dict[str, Any] = {"v": 1, "id": f"{seq:032x}", "node": node, "seq": seq, "ts": 1.79e9,
                            "type": mtype, "epoch": "e0", "body": copy.deepcopy(BODIES[mtype])}
    target: Any = tree
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    body = tree["body"]
    try:
        if isinstance(body, dict) and "summary" in body:
            body["summary"] = msgpack.packb(body["summary"], use_bin_type=True)
        frame: bytes = msgpack.packb(tree, use_bin_type=True)
    except OverflowError:
        assert isinstance(value, int) and not -(2**63) <= value < 2**64
        return None
    return frame


# --------------------------------------------------------------------------- the store path

def ingest(store: Store, frame: bytes) -> bool:
    """The collector's per-frame path without the sockets: decode, then store. Returns
    whether the frame was accepted; only WireError may come out of decode."""
    try:
        env, body = decode_received(frame)
    except WireError:
        return False
    if env.type in wire.ACKED or env.type == wire.HEARTBEAT:
        store.store_batch([(env.node, env, body)])
    return True


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    db = Store(tmp_path_factory.mktemp("fuzz") / "fleet.db")
    yield db
    db.close()


_seqs = iter(range(1, 10**9))


@pytest.mark.parametrize(("mtype", "path"), FIELDS, ids=lambda x: "/".join(map(str, x))
                         if isinstance(x, tuple) else x)
def test_every_numeric_field_at_the_edges_through_decode_and_store(
        store: Store, mtype: str, path: tuple[Any, ...]) -> None:
    for value in EDGES:
        frame = build(mtype, path, value, next(_seqs))
        if frame is not None:
            ingest(store, frame)  # raises only on a bug: the test fails with it


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(FIELDS),
       value=st.one_of(st.sampled_from(EDGES), st.integers(-(2**64), 2**64 + 1),
                       st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none()))
def test_random_numbers_never_escape_ingest(store: Store, field: tuple[str, tuple[Any, ...]],
                                            value: Any) -> None:
    frame = build(field[0], field[1], value, next(_seqs))
    if frame is not None:
        ingest(store, frame)


def test_accepted_numbers_are_storable() -> None:
    """What the wire lets through for the fields the store binds as integers."""
    for mtype, path in [(REPORT, ("body", "summary", "gpus", 0, 0)), (EVENT, ("body", "gpu")),
                        (EVENT, ("body", "findings", 0, "gpu")), (REPORT, ("seq",))]:
        for value in EDGES:
            frame = build(mtype, path, value, 1)
            if frame is None:
                continue
            try:
                decode(frame)
            except WireError:
                continue
            assert type(value) is int and 0 <= value < 2**63, (mtype, path, value)


# --------------------------------------------------------------------------- item 9 bounds

def test_twenty_thousand_gpu_indices_rejected_at_the_wire() -> None:
    many = {**SUMMARY, "gpus": [[i, None, None, 0, 0, 0, 0, 0, 0] for i in range(20_000)]}
    body = {**BODIES[REPORT], "summary": msgpack.packb(many, use_bin_type=True)}
    frame = wire.encode_unchecked(wire.Envelope(type=REPORT, node="gpu-a", seq=1, body=body))
    with pytest.raises(wire.BodyError, match="gpus"):
        decode(frame)
    findings = [{"check": "c", "severity": "WARN", "gpu": i} for i in range(20_000)]
    frame = wire.encode_unchecked(wire.Envelope(type=REPORT, node="gpu-a", seq=1,
                                                body={**BODIES[REPORT], "findings": findings}))
    with pytest.raises(wire.BodyError, match="findings"):
        decode(frame)


@pytest.mark.parametrize(("mtype", "path", "value", "match"), [
    (REPORT, ("summary", "gpus"), [[i, None] for i in range(wire.MAX_GPUS + 1)], "gpus"),
    (REPORT, ("summary", "gpus"), [[1, None], [1, None]], "repeated"),
    (REPORT, ("summary", "ib"), [[f"p{i}", None] for i in range(wire.MAX_IB_PORTS + 1)], "ib"),
    (REPORT, ("summary", "ib"), [["x" * 300, None]], "ib"),
    (REPORT, ("ok_checks",), ["c"] * (wire.MAX_CHECKS + 1), "ok_checks"),
    (REPORT, ("ok_checks",), ["c" * 200], "ok_checks"),
    (REPORT, ("findings",), [FINDING] * (wire.MAX_FINDINGS + 1), "findings"),
    (REPORT, ("findings",), [{**FINDING, "check": "c" * 200}], "malformed finding"),
    (REPORT, ("findings",), [{**FINDING, "severity": "S" * 17}], "malformed finding"),
    (REPORT, ("findings",), [{**FINDING, "gpu": 1024}], "GPU index"),
    (REPORT, ("verdict",), "V" * 17, "verdict"),
    (EVENT, ("kind",), "k" * 65, "kind"),
    (EVENT, ("gpu",), 1024, "gpu"),
    (wire.HELLO, ("gpus",), 10**6, "gpus"),
    (wire.HELLO, ("version",), "1" * 300, "version"),
    (wire.COMMAND, ("command",), "c" * 65, "command"),
    (ACK, ("seqs",), list(range(wire.MAX_ACK_SEQS + 1)), "seqs"),
])
def test_per_message_bounds(mtype: str, path: tuple[Any, ...], value: Any, match: str) -> None:
    frame = build(mtype, ("body", *path), value, 1)
    assert frame is not None
    with pytest.raises(wire.BodyError, match=match):
        decode(frame)


def test_bounds_leave_a_real_report_alone() -> None:
    from slurmgpu.summary import report_fields
    from slurmgpu.testing import make_facts

    body = {"verdict": "OK", "findings": [], "ok_checks": ["gpu.ecc"], **report_fields(make_facts(
        "gpu-a", gpus=8, ib_ports=8))}
    assert decode(wire.encode(wire.Envelope(type=REPORT, node="gpu-a", seq=1, body=body))).body == body


# --------------------------------------------------------------------------- the collector

@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Collector, Agent, Agent]]:
    """An in-process collector (its store on ``store_url`` where the test takes it) and
    two agents, gpu-a and gpu-b."""
    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    for node in NODES:
        keys.add_node(keys_dir, node)
    db = request.getfixturevalue("store_url") if "store_url" in request.fixturenames else None
    cfg = make_settings(tmp_path, keys_dir, db=db)
    collector = build_collector(cfg)
    ctx = zmq.Context()
    try:
        yield collector, Agent(ctx, cfg, keys_dir, "gpu-a"), Agent(ctx, cfg, keys_dir, "gpu-b")
    finally:
        collector.close()
        ctx.destroy(linger=0)


def acked_all(agent: Agent, seqs: set[int], timeout_s: float = 10.0) -> None:
    """Read acks (however batched) until every seq in ``seqs`` was acked as stored."""
    deadline = time.monotonic() + timeout_s
    while seqs:
        env = agent.recv(max(0.0, deadline - time.monotonic()))
        assert env is not None, f"seqs {sorted(seqs)} not acked"
        if env.type == ACK:
            seqs -= set(env.body["seqs"]) - set(env.body.get("rejected") or ())


def serve_until(collector: Collector, received: int) -> None:
    """Run the loop in this thread (an exception out of it fails the test) until it has
    taken ``received`` frames; each is fully handled when serve_once returns."""
    deadline = time.monotonic() + 10
    while collector.counters.received < received:
        assert time.monotonic() < deadline, "frames not received"
        collector.serve_once(50)


def test_in_process_collector_survives_every_edge(rig: tuple[Collector, Agent, Agent]) -> None:
    collector, bad, good = rig
    sent, probes = 0, 0
    for mtype, path in FIELDS:
        for value in EDGES:
            frame = build(mtype, path, value, 1000 + sent)
            if frame is not None:
                bad.sock.send(frame)
                sent += 1
        probes += 1
        good.report(probes)  # another node's report after each field's frames
        serve_until(collector, sent + probes)
        assert good.acked() == [probes]
    stored = Store(collector.store.path)
    assert stored.count("reports") == 2  # gpu-b's latest, and gpu-a's valid ones
    assert stored.latest_report("gpu-b")["seq"] == probes  # type: ignore[index]
    assert collector.counters.store_errors == 0
    assert collector.counters.rejected.get("store", 0) == 0  # the wire caught them all
    assert collector.counters.rejected["malformed"] > 0


def test_unstorable_message_is_rejected_not_fatal(rig: tuple[Collector, Agent, Agent],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A message the wire let through but the store cannot take (here: a NaN timestamp,
    NOT NULL in SQLite) in a batch with good ones: the good ones are stored and acked,
    the bad one is rejected, counted and acked as rejected (its agent drops it)."""
    collector, bad, good = rig
    real_decode = decode_received

    def lax_decode(data: bytes) -> tuple[wire.Envelope, bytes]:  # a wire that missed a bound
        env, body = real_decode(data)
        return (replace(env, ts=math.nan) if env.body.get("kind") == "poison" else env), body

    monkeypatch.setattr(wire, "decode_received", lax_decode)
    bad.send(EVENT, 7, {"kind": "poison", "verdict": "FAIL", "findings": []})
    for seq in (1, 2, 3):
        good.report(seq)
    serve_until(collector, 4)
    acked_all(good, {1, 2, 3})
    refused = bad.recv()
    assert refused is not None and (refused.body["seqs"], refused.body["rejected"]) == ([7], [7])
    assert collector.counters.rejected["store"] == 1 and collector.counters.store_errors == 0
    assert Store(collector.store.path).count("messages") == 3


def test_broken_store_stops_acks(rig: tuple[Collector, Agent, Agent], monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full / I/O error: nothing is acked (the agents keep spooling), nothing is
    rejected, and the resend after recovery is stored."""
    collector, _bad, good = rig
    real = collector.store.store_batch

    def full(*_a: Any, **_k: Any) -> list[tuple[str, int]]:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(collector.store, "store_batch", full)
    good.report(1)
    serve_until(collector, 1)
    assert good.acked(0.3) is None
    assert collector.counters.store_errors == 1 and not collector.counters.rejected
    assert collector.counters.store_failing == 1  # /metrics: slurmgpu_store_writable 0
    monkeypatch.setattr(collector.store, "store_batch", real)
    good.report(1)  # the agent's resend
    serve_until(collector, 2)
    assert good.acked() == [1]
    assert collector.counters.store_failing == 0  # writable again


def test_a_database_locked_by_another_process_stops_acks_until_released(tmp_path: Path) -> None:
    """DB locked past the busy timeout (a backup or an admin's sqlite3 shell holding a write
    lock): a real lock, no monkeypatch. Nothing is acked or rejected while it is held, the
    store reads unwritable, and the agent's resend after the lock goes is stored once."""
    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    keys.add_node(keys_dir, "gpu-b")
    cfg = make_settings(tmp_path, keys_dir)
    store = Store(cfg.db, timeout_s=0.2)
    collector = build_collector(cfg, store=store)
    ctx = zmq.Context()
    locker = sqlite3.connect(cfg.db, isolation_level=None)
    try:
        good = Agent(ctx, cfg, keys_dir, "gpu-b")
        locker.execute("BEGIN EXCLUSIVE")
        good.report(1)
        serve_until(collector, 1)
        assert good.acked(0.3) is None
        assert collector.counters.store_errors == 1 and not collector.counters.rejected
        assert collector.counters.store_failing == 1
        locker.execute("COMMIT")
        good.report(1)  # the agent's resend
        serve_until(collector, 2)
        assert good.acked() == [1]
        assert collector.counters.store_failing == 0
        rows = locker.execute("SELECT count(*) FROM messages WHERE node = 'gpu-b'").fetchone()[0]
        assert rows == 1
    finally:
        locker.close()
        collector.close()
        store.close()
        ctx.destroy(linger=0)


def test_the_validated_summary_cache_is_bounded_in_bytes() -> None:
    """Issue 12 item 9 (found by bench/collector_memory_flood.py): the cache of summaries
    that passed validation was bounded by count (16,384) while a summary can be ~1 MiB;
    one node sending new large summaries grew the collector by 250 KB a report."""
    wiresummary._GOOD_SUMMARIES.items.clear()
    wiresummary._GOOD_SUMMARIES.size = 0
    for i in range(80):
        rows = [[g, f"{i:04d}" + "s" * 200, "H100", 0, 0, 0, 0, 0, 0] for g in range(1024)]
        wire.validate_summary(msgpack.packb({"gpus": rows}, use_bin_type=True))
    assert 0 < wiresummary._GOOD_SUMMARIES.size <= wiresummary._GOOD_SUMMARIES.max_bytes
    assert wiresummary._GOOD_SUMMARIES.size == sum(len(s) for s in wiresummary._GOOD_SUMMARIES.items)


def test_one_peers_large_frames_end_the_batch(rig: tuple[Collector, Agent, Agent]) -> None:
    """A node sending frames at the size limit gets at most MAX_BATCH_BYTES into one batch
    (one transaction before any ack), so the other nodes' acks wait for two such frames'
    work, not a thousand; the rest are read by the following batches."""
    collector, bad, good = rig
    filler = [{"check": "x.y", "severity": "WARN", "gpu": 0, "subject": None, "message": "m" * 60_000}
              for _ in range(15)]
    for seq in range(1, 9):  # ~900 KB each
        bad.send(REPORT, seq, {"verdict": "WARN", "findings": filler, "facts": {}})
    time.sleep(0.5)  # most likely all eight queued at the collector by now (fewer: still <= 3)
    handled = collector.serve_once(10_000)  # (on a loaded machine: waits for the first one)
    # frames are read until this peer's share reaches the bound: 3 x ~900 KB >= 2 MiB
    assert 1 <= handled <= 3 and transport_mod.MAX_BATCH_BYTES == 2 * wire.MAX_FRAME
    good.report(1)
    serve_until(collector, 9)
    assert good.acked(5) == [1]
    acked_all(bad, set(range(1, 9)))


@pytest.mark.parametrize(("exc", "message_fault"), [
    (OverflowError("Python int too large to convert to SQLite INTEGER"), True),
    (sqlite3.InterfaceError("Error binding parameter 1"), True),
    (sqlite3.IntegrityError("NOT NULL constraint failed: messages.ts"), True),
    (sqlite3.ProgrammingError("Error binding parameter 1: type 'dict' is not supported"), True),
    (ValueError("x"), True), (TypeError("x"), True), (RecursionError(), True),
    (sqlite3.OperationalError("database or disk is full"), False),
    (sqlite3.OperationalError("database is locked"), False),
    (sqlite3.DatabaseError("database disk image is malformed"), False),
    (sqlite3.ProgrammingError("Cannot operate on a closed database."), False),
    (OSError(5, "I/O error"), False), (MemoryError(), False),
])
def test_message_fault_or_store_fault(exc: BaseException, message_fault: bool) -> None:
    assert _message_fault(exc) is message_fault


# --------------------------------------------------------------------------- end to end

def poison_frames(seq: int) -> list[bytes]:
    """What an allow-listed node could send to stop the fleet's ingestion before."""
    frames = [
        build(REPORT, ("seq",), 2**63, seq),
        build(REPORT, ("body", "summary", "gpus", 0, 0), 2**63, seq + 1),
        build(REPORT, ("body", "summary", "gpus"),
              [[i, None, None, 0, 0, 0, 0, 0, 0] for i in range(20_000)], seq + 2),
        build(EVENT, ("body", "data"), 2**63, seq + 3),
        build(EVENT, ("body", "findings", 0, "gpu"), 2**64 - 1, seq + 4),
        build(wire.HELLO, ("body", "interval_s"), math.inf, seq + 5),
    ]
    return [f for f in frames if f is not None]


def test_real_collector_process_survives_poison_and_keeps_ingesting(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    for node in NODES:
        keys.add_node(keys_dir, node)
    cfg = make_settings(tmp_path, keys_dir)
    argv = [sys.executable, "-c", "from slurmgpu.cli.fleet_cmd import collector; collector()",
            "--bind", cfg.bind, "--db", cfg.db, "--keys-dir", cfg.keys_dir, "--log-level", "error"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = zmq.Context()
    reports = 60
    try:
        bad, good = Agent(ctx, cfg, keys_dir, "gpu-a"), Agent(ctx, cfg, keys_dir, "gpu-b")
        _wait_serving(good)
        for rnd in range(reports):
            for frame in poison_frames(100 + 10 * (rnd % 5)):  # resent, as from a spool
                bad.sock.send(frame)
            good.report(rnd + 2)
            acked_all(good, {rnd + 2})
        assert proc.poll() is None, "the collector died"
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        ctx.destroy(linger=0)
    assert rc == 0
    with contextlib.closing(sqlite3.connect(cfg.db)) as db:
        rows = dict(db.execute("SELECT node, count(*) FROM messages GROUP BY node").fetchall())
    assert rows == {"gpu-b": reports + 1}  # every good message stored, no poison


def _wait_serving(agent: Agent) -> None:
    """The collector process is up once it acks a hello (resent until it does)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        agent.send(wire.HELLO, 1, {"version": "1", "gpus": 8, "interval_s": 15.0})
        with contextlib.suppress(AssertionError):
            acked_all(agent, {1}, 0.5)
            return
    raise AssertionError("collector did not start")
