"""Spool epochs (issue 12, item 3): a lost spool must not make the collector drop the
new spool's messages as duplicates of the old one's; a replay in the same epoch is still
deduplicated; a "duplicate" whose body differs is counted and logged.

The agent side is the real one (``Agent.submit`` stamps the spool's epoch, the real
``Link`` thread sends and handles acks) against a real collector over CURVE."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from slurmgpu import keys, wire
from slurmgpu.agent import Agent
from slurmgpu.agent.link import Link
from slurmgpu.agent.spool import FILENAME, Spool
from slurmgpu.collector.app import Collector
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources
from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource, make_facts
from tests.agenthelpers import node_keys, wait_until
from tests.test_collector import make_settings, running

NODE = "gpu-a"


def _event(n: int) -> dict[str, Any]:
    return {"kind": "xid", "gpu": n % 8, "data": 79, "verdict": "FAIL", "findings": [],
            "message": f"Xid 79 #{n}"}


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    return node_keys(tmp_path / "keys", NODE)


@pytest.fixture
def collector(tmp_path: Path, keys_dir: Path) -> Iterator[Collector]:
    with running(make_settings(tmp_path, keys_dir)) as server:
        yield server


@contextlib.contextmanager
def agent_run(spool_dir: Path, keys_dir: Path, address: str) -> Iterator[Agent]:
    """One agent 'run': the real Agent (for submit) with its spool and a real Link."""
    settings = Settings()
    settings.agent.spool_dir = str(spool_dir)
    facts = make_facts(NODE, gpus=8, ib_ports=1)
    clock = FakeClock()
    agent = Agent(settings, NODE, sources=Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                                                  FakeVersionSource(facts.versions), clock), clock=clock)
    spool = agent.open_spool()
    link = Link(addresses=[address], node=NODE, keys=keys.client_keys(keys_dir / "bundles" / NODE),
                spool=spool, heartbeat_s=0.5, on_command=lambda _m: None)
    agent.link = link
    link.start()
    try:
        yield agent
    finally:
        link.stop()
        link.join(10)
        spool.close()


def stored_events(db: str) -> list[tuple[int, str]]:
    """(seq, XID message) of every stored event, in storage order."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT seq, body FROM events ORDER BY rowid").fetchall()
    return [(int(seq), str(msgpack.unpackb(body, raw=False)["message"])) for seq, body in rows]


def _send_events(agent: Agent, numbers: range) -> None:
    for n in numbers:
        assert agent.submit(wire.EVENT, _event(n)) is not None


def _spool_empty(agent: Agent) -> bool:
    assert agent.spool is not None
    return agent.spool.count() == 0


# --------------------------------------------------------------------------- end to end

def test_deleted_spool_starts_a_new_epoch_and_nothing_is_dropped(
        tmp_path: Path, keys_dir: Path, collector: Collector) -> None:
    spool_dir = tmp_path / "spool"
    db = str(collector.store.path)
    with agent_run(spool_dir, keys_dir, collector.endpoint) as agent:
        first_epoch = agent.spool.epoch if agent.spool else ""
        _send_events(agent, range(10))
        wait_until(lambda: _spool_empty(agent), 10, "the first run's events acked")
    assert len(stored_events(db)) == 10
    (spool_dir / FILENAME).unlink()  # a reinstall / lost disk: the seqs restart at 1
    for extra in ("-wal", "-shm"):
        (spool_dir / (FILENAME + extra)).unlink(missing_ok=True)
    with agent_run(spool_dir, keys_dir, collector.endpoint) as agent:
        assert agent.spool is not None and agent.spool.epoch != first_epoch
        _send_events(agent, range(10, 20))
        wait_until(lambda: _spool_empty(agent), 10, "the second run's events acked")
    events = stored_events(db)
    # Every event of the new spool is stored (before: acked as duplicates, dropped).
    assert [m for _, m in events] == [f"Xid 79 #{n}" for n in range(20)]
    seqs = [s for s, _ in events]
    assert seqs[10:] == list(range(min(seqs[10:]), min(seqs[10:]) + 10))
    assert seqs[10] <= seqs[9]  # the new spool really reused the old seqs
    assert collector.counters.conflicts == 0


def test_replay_same_epoch_deduplicated_differing_body_counted(
        tmp_path: Path, keys_dir: Path, collector: Collector) -> None:
    spool_dir = tmp_path / "spool"
    db = str(collector.store.path)
    with agent_run(spool_dir, keys_dir, collector.endpoint) as agent:
        assert agent.spool is not None
        epoch = agent.spool.epoch
        _send_events(agent, range(3))
        wait_until(lambda: _spool_empty(agent), 10, "events acked")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(seq,)] = conn.execute("SELECT max(seq) FROM messages WHERE epoch = ?", (epoch,)).fetchall()
    # (stable now: the collector bumps its counters before it sends the acks we waited on)
    duplicates = collector.counters.duplicates
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, NODE.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = keys.client_keys(
            keys_dir / "bundles" / NODE)
        sock.connect(collector.endpoint)
        same = wire.encode(wire.Envelope(type=wire.EVENT, node=NODE, seq=seq, epoch=epoch, body=_event(2)))
        other = wire.encode(wire.Envelope(type=wire.EVENT, node=NODE, seq=seq, epoch=epoch,
                                          body=_event(99)))
        for frame in (same, other):
            sock.send(frame)
            ack = _recv_ack(sock)
            assert ack.body["seqs"] == [seq] and ack.epoch == epoch and not ack.body.get("rejected")
        sock.close(linger=0)
    finally:
        ctx.term()
    assert len(stored_events(db)) == 3  # neither stored again
    # The ack above is sent after the conflict was counted (same loop turn, before the send).
    assert collector.counters.conflicts == 1
    assert collector.counters.duplicates == duplicates + 2


def _recv_ack(sock: zmq.Socket[Any]) -> wire.Envelope:
    while sock.poll(5000):
        env = wire.decode(sock.recv())
        if env.type == wire.ACK:
            return env
    raise AssertionError("no ack")


# --------------------------------------------------------------------------- units

def test_spool_epoch_persists_and_a_new_file_gets_a_new_one(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    epoch = spool.epoch
    spool.close()
    again = Spool(tmp_path)
    assert again.epoch == epoch
    again.close()
    (tmp_path / FILENAME).unlink()
    assert Spool(tmp_path).epoch != epoch


def test_unopenable_spool_has_its_own_epoch_then_adopts_the_files(tmp_path: Path) -> None:
    good = Spool(tmp_path / "spool")
    for _ in range(5):
        good.append("event", lambda seq: b"x")
    file_epoch = good.epoch
    good.close()
    spool = Spool(tmp_path / "spool")
    spool.close()  # as if the file could not be opened at start:
    spool._conn, spool.epoch, spool._last_seq = None, "memory-epoch", 0
    item = spool.append("event", lambda seq: b"x")
    assert not item.stored and item.seq == 1 and spool.epoch == "memory-epoch"
    spool._next_open = 0.0  # the periodic reopen succeeds
    stamped: list[str] = []

    def encode(seq: int) -> bytes:
        stamped.append(spool.epoch)  # what Agent.submit stamps the frame with
        return b"x"

    item = spool.append("event", encode)
    assert item.stored and spool.epoch == file_epoch and stamped == [file_epoch]
    assert item.seq == 6  # above both the file's seqs and the in-memory ones


def test_legacy_spool_file_gets_an_epoch_and_keeps_its_seqs(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, "
                     "created REAL NOT NULL, frame BLOB NOT NULL)")
        conn.execute("INSERT INTO messages (seq, type, created, frame) VALUES (41, 'event', 0, x'00')")
        conn.commit()
    spool = Spool(tmp_path)
    assert spool.epoch and spool.append("event", lambda seq: b"x").seq == 42
    assert Spool(tmp_path).epoch == spool.epoch


def test_ack_for_another_epoch_deletes_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    seq = spool.append("event", lambda s: b"x").seq
    link = Link(addresses=["tcp://127.0.0.1:1"], node=NODE, keys=(b"", b"", b""), spool=spool,
                heartbeat_s=1.0, on_command=lambda _m: None)
    link._ack(wire.Envelope(type=wire.ACK, node=NODE, seq=0, epoch="old-spool", body={"seqs": [seq]}))
    assert spool.count() == 1 and link.stale_acks == 1
    link._ack(wire.Envelope(type=wire.ACK, node=NODE, seq=0, epoch=spool.epoch,
                            body={"seqs": [seq], "rejected": [seq]}))
    assert spool.count() == 0 and link.rejected == 1


def test_store_dedupes_per_epoch_and_reports_conflicts(tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")

    def ev(epoch: str, seq: int, n: int) -> tuple[str, wire.Envelope]:
        return NODE, wire.Envelope(type=wire.EVENT, node=NODE, seq=seq, epoch=epoch, body=_event(n))

    assert store.store_batch([ev("a", 1, 1), ev("a", 2, 2)]) == [(NODE, 1), (NODE, 2)]
    assert store.store_batch([ev("b", 1, 3)]) == [(NODE, 1)]  # a new epoch: new sequence
    assert store.store_batch([ev("a", 1, 1)]) == [] and store.conflicts == []  # a replay
    assert store.store_batch([ev("a", 2, 9), ev("b", 2, 4), ev("b", 2, 5)]) == [(NODE, 2)]
    assert [(c.epoch, c.seq) for c in store.conflicts] == [("b", 2), ("a", 2)]
    store.close()
    reopened = Store(tmp_path / "fleet.db")  # high-water marks come back from the file
    assert reopened.store_batch([ev("a", 2, 2), ev("b", 3, 6)]) == [(NODE, 3)]


def test_migration_keeps_old_messages_as_epoch_less(tmp_path: Path) -> None:
    from slurmgpu.collector.store.schema import MIGRATIONS, SCHEMA_VERSION

    path = tmp_path / "fleet.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (4)")
        db.execute("BEGIN")
        for migration in MIGRATIONS[:4]:
            migration(db)
        db.execute("INSERT INTO messages (node, seq, type, ts, received_at) VALUES (?, 7, 'event', 1, 1)",
                   (NODE,))
        db.execute("COMMIT")
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION
    old = wire.Envelope(type=wire.EVENT, node=NODE, seq=7, body=_event(1))
    assert store.store_batch([(NODE, old)]) == []  # an epoch-less resend: still a duplicate
    assert store.conflicts == []  # (no digest kept for rows from before: not comparable)
    new = wire.Envelope(type=wire.EVENT, node=NODE, seq=7, epoch="e1", body=_event(1))
    assert store.store_batch([(NODE, new)]) == [(NODE, 7)]
