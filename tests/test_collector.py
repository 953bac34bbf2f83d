"""The collector over real sockets on loopback with real CURVE keys, and its store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zmq.utils.monitor import recv_monitor_message

from slurmgpu import keys
from slurmgpu.cli import fleet_cmd
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.collector.store import SCHEMA_VERSION, Store, StoreError, queries
from slurmgpu.collector.store.backend import dialect_of
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.wire import (
    ACK,
    COMMAND,
    EVENT,
    HEARTBEAT,
    HELLO,
    MAX_FRAME,
    REPORT,
    Envelope,
    decode,
    encode,
)
from tests.agenthelpers import wait_until

NODES = ("gpu-a", "gpu-b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    root = tmp_path / "keys"
    keys.init(root)
    for node in NODES:
        keys.add_node(root, node)
    return root


def make_settings(tmp_path: Path, keys_dir: Path, **kw: Any) -> CollectorSettings:
    """``db``: a file or a PostgreSQL URL (``store_url``); default: a file in ``tmp_path``."""
    port = kw.pop("port", None) or free_port()
    db = kw.pop("db", None) or str(tmp_path / "fleet.db")
    return CollectorSettings(address=f"tcp://127.0.0.1:{port}", bind=f"tcp://127.0.0.1:{port}",
                             db=db, keys_dir=str(keys_dir), **kw)


@contextlib.contextmanager
def running(cfg: CollectorSettings, **kw: Any) -> Iterator[Collector]:
    """A collector (``build_collector(cfg, **kw)``) serving in a thread."""
    collector = build_collector(cfg, **kw)
    stop = threading.Event()
    thread = threading.Thread(target=collector.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield collector
        assert thread.is_alive(), "the collector loop died"
    finally:
        stop.set()
        thread.join(10)


class Agent:
    """A minimal agent: DEALER, CURVE client, routing id = node name."""

    def __init__(self, ctx: zmq.Context[Any], cfg: CollectorSettings, keys_dir: Path, node: str, *,
                 key_of: str | None = None, routing_id: str | None = None,
                 keypair: tuple[bytes, bytes] | None = None, monitor: int = 0) -> None:
        if keypair is None:
            public, secret, server = keys.client_keys(keys_dir / "bundles" / (key_of or node))
        else:
            public, secret = keypair
            server = keys.public_key(keys_dir / "collector.key")
        self.node = node
        self.sock = ctx.socket(zmq.DEALER)
        if routing_id != "":  # "": none, ZeroMQ picks one (as agents do since issue 12)
            self.sock.setsockopt(zmq.ROUTING_ID, (routing_id or node).encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = public, secret, server
        # socket events (zmq.EVENT_*) to watch, attached before the connect so none is missed
        self.monitor = self.sock.get_monitor_socket(monitor) if monitor else None
        self.sock.connect(cfg.address)

    def send(self, mtype: str, seq: int, body: dict[str, Any], *, node: str | None = None) -> None:
        self.sock.send(encode(Envelope(type=mtype, node=node or self.node, seq=seq, body=body)))

    def report(self, seq: int, verdict: str = "OK", **kw: Any) -> None:
        findings = [{"check": "gpu.ecc", "severity": "OK", "gpu": 0, "message": "ok"}]
        if verdict != "OK":
            findings.append({"check": "gpu.thermal", "severity": verdict, "gpu": 3, "message": "hot"})
        self.send(REPORT, seq, {"verdict": verdict, "findings": findings, "facts": {}}, **kw)

    def recv(self, timeout_s: float = 3.0, *, skip: tuple[str, ...] = (HEARTBEAT,)) -> Envelope | None:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                return None
            env = decode(self.sock.recv())
            if env.type not in skip:
                return env
        return None

    def acked(self, timeout_s: float = 3.0) -> list[int] | None:
        env = self.recv(timeout_s)
        if env is None:
            return None
        assert env.type == ACK
        return list(env.body["seqs"])


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def db_rows(cfg: CollectorSettings, sql: str) -> list[tuple[Any, ...]]:
    """A query on the collector's database (another connection, read-only), either backend."""
    with queries.snapshot(cfg.db) as db:
        return [tuple(row) for row in db.execute(sql).fetchall()]


# --------------------------------------------------------------------------- over the wire


def test_report_stored_then_acked(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],
                                  store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(HELLO, 1, {"version": "1.2.3", "gpus": 8, "interval_s": 15.0})
        assert agent.acked() == [1]
        agent.report(2, "WARN")
        assert agent.acked() == [2]
        # The ack comes after the COMMIT: the row is visible to another connection now.
        assert db_rows(cfg, "SELECT node, seq, verdict FROM reports") == [("gpu-a", 2, "WARN")]
        assert db_rows(cfg, "SELECT check_id, severity, gpu FROM findings") == [("gpu.thermal", "WARN", 3)]
        # (acks_sent is bumped just after the send the agent already saw: wait for it)
        wait_until(lambda: collector.counters.acks_sent == 2, 5.0, "acks_sent == 2")
        assert collector.counters.stored == 2
    [row] = Store(cfg.db).fleet()
    assert row["node"] == "gpu-a" and row["verdict"] == "WARN" and row["reachable"]
    assert row["worst_check"] == "gpu.thermal" and row["agent_version"] == "1.2.3"


def test_duplicate_stored_once_acked_twice(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],
                                           store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.report(7)
        assert agent.acked() == [7]
        agent.report(7)
        assert agent.acked() == [7]
        assert collector.counters.duplicates == 1
    assert db_rows(cfg, "SELECT count(*) FROM report_history") == [(1,)]
    assert db_rows(cfg, "SELECT count(*) FROM messages") == [(1,)]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"key_of": "gpu-a", "node": "gpu-b"}, "node_mismatch"),  # A's key claiming to be B
    ({"key_of": "gpu-a", "node": "gpu-a", "routing_id": "gpu-b"}, "routing_mismatch"),
])
def test_key_bound_to_node(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],
                           kw: dict[str, Any], reason: str) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, kw["node"], key_of=kw["key_of"],
                      routing_id=kw.get("routing_id"))
        agent.report(1)
        # (wait for the refusal itself: on a loaded machine the frame may not even have
        # been handled within the 0.5 s below)
        wait_until(lambda: collector.counters.rejected[reason] == 1, 10.0, f"rejected[{reason!r}] == 1")
        assert agent.acked(0.5) is None  # refused, never acked
        assert collector.counters.rejected == {reason: 1}
    assert db_rows(cfg, "SELECT count(*) FROM messages") == [(0,)]
    assert db_rows(cfg, "SELECT count(*) FROM nodes") == [(0,)]


def test_unknown_key_gets_nothing(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a", keypair=zmq.curve_keypair(),
                      monitor=zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        agent.report(1)
        # Wait for the refusal (ZAP, in the CURVE handshake): without it, on a loaded machine
        # the checks below could pass only because the frame was still on its way.
        assert agent.monitor is not None and agent.monitor.poll(10_000), "the key was not refused"
        assert recv_monitor_message(agent.monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert agent.recv(0.7, skip=()) is None
        assert collector.counters.received == 0
    assert db_rows(cfg, "SELECT count(*) FROM messages") == [(0,)]


def test_revoked_key_refused_after_reload(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.report(1)
        assert agent.acked() == [1]
        keys.revoke(keys_dir, "gpu-a")
        collector.request_reload()
        # The reload happens at the loop's next turn: wait for it, not a fixed time.
        wait_until(lambda: "gpu-a" not in collector.allowed.values(), 10.0, "the allow-list reload")
        agent.report(2)  # same (already authenticated) connection
        wait_until(lambda: collector.counters.rejected["unknown_key"] == 1, 10.0,
                   "rejected['unknown_key'] == 1")
        assert agent.acked(0.5) is None  # refused, never acked
        assert collector.counters.rejected == {"unknown_key": 1}


BAD_FRAMES = [
    b"",
    b"\xc1\xc1\xc1",  # never-used msgpack byte
    msgpack.packb([1, 2, 3]),
    msgpack.packb({"v": 99, "id": "x", "node": "gpu-a", "seq": 1, "ts": 1.0, "type": "report", "body": {}}),
    msgpack.packb({"v": 1, "id": "x", "node": "gpu-a", "seq": -1, "ts": 1.0, "type": "report", "body": {}}),
    msgpack.packb({"v": 1, "id": "x", "node": "gpu-a", "seq": 1, "ts": 1.0, "type": "report",
                   "body": {"verdict": "OK", "findings": ["nope"]}}),
    b"\x00" * (MAX_FRAME + 1),
]


def test_bad_frames_rejected_loop_survives(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        for frame in BAD_FRAMES:
            agent.sock.send(frame)
        agent.sock.send_multipart([b"two", b"frames"])
        agent.send(ACK, 0, {"seqs": [1]})  # a collector-only type from an agent
        # The bad report seq 1 (valid envelope, malformed body) is acked as rejected, so
        # its agent drops it instead of resending it forever.
        refused = agent.recv()
        assert refused is not None and refused.type == ACK
        assert (refused.body["seqs"], refused.body["rejected"]) == ([1], [1])
        agent.report(1)  # (only now: in the same batch, the good copy's ack would win)
        assert agent.acked() == [1]  # every frame sent before it was handled by now
        rejected = collector.counters.rejected
        assert rejected == {"malformed": 5, "version": 1, "oversized": 1, "frames": 1,
                            "unexpected_type": 1}


def test_random_frames_never_crash(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        sent = 0

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.one_of(st.binary(max_size=512),
                         st.dictionaries(st.sampled_from(["v", "id", "node", "seq", "ts", "type", "body"]),
                                         st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.none(),
                                                   st.dictionaries(st.text(max_size=4), st.integers(0, 9))),
                                         ).map(lambda d: msgpack.packb(d))))
        def send(frame: bytes) -> None:
            nonlocal sent
            agent.sock.send(frame)
            sent += 1

        send()
        agent.report(10**6)
        assert agent.acked(5.0) == [10**6]
        assert collector.counters.received == sent + 1


def test_heartbeats_and_unreachable(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],
                                    store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, heartbeat_s=0.1, unreachable_after=3, db=store_url)
    with running(cfg) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(HEARTBEAT, 0, {})
        beat = agent.recv(2.0, skip=())  # the collector heartbeats nodes it has heard from
        assert beat is not None and beat.type == HEARTBEAT
        [row] = Store(cfg.db).fleet()
        # Stored reachable. This agent stays silent, so the collector marks it unreachable
        # 0.3 s after the heartbeat: on a loaded machine that may have happened already.
        assert row["reachable"] or row["unreachable_since"] - row["last_seen"] > 0.3
        deadline = time.monotonic() + 5
        while Store(cfg.db).fleet()[0]["reachable"] and time.monotonic() < deadline:
            time.sleep(0.05)
        [row] = Store(cfg.db).fleet()
        assert not row["reachable"] and row["unreachable_since"] > row["last_seen"]

        def transitions() -> list[str]:
            return [k for (k,) in db_rows(cfg, "SELECT kind FROM node_states WHERE node = 'gpu-a' "
                                               "ORDER BY id")]

        assert transitions() == ["unreachable"]
        agent.send(HEARTBEAT, 0, {})  # back again
        # (reachable only until the next 0.3 s of silence: wait for the recorded transition,
        # which stays, rather than sleep and read the flag, which flips back)
        wait_until(lambda: transitions()[:2] == ["unreachable", "reachable"], 10.0,
                   "gpu-a marked reachable again")
        assert collector.counters.heartbeats_received == 2


def test_command_and_result(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],
                            store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    collector = build_collector(cfg)
    try:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(HELLO, 1, {"version": "1", "gpus": 8, "interval_s": 15.0})
        while collector.serve_once(50) == 0:
            pass
        assert agent.acked() == [1]
        command_id = collector.send_command("gpu-a", "recheck", {"gpus": [0]})
        env = agent.recv()
        assert env is not None and env.type == COMMAND and env.id == command_id
        agent.send("command-result", 2, {"command_id": command_id, "ok": True, "result": {"x": 1}})
        while collector.serve_once(50) == 0:
            pass
        assert agent.acked() == [2]
    finally:
        collector.close()
    assert db_rows(cfg, "SELECT command_id, ok FROM command_results") == [(command_id, 1)]


# --------------------------------------------------------------------------- crash safety


SENDER_EVENTS = 400


def test_kill_9_loses_nothing_duplicates_nothing(tmp_path: Path, keys_dir: Path,
                                                 ctx: zmq.Context[Any], store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    argv = [sys.executable, "-c", "from slurmgpu.cli.fleet_cmd import collector; collector()",
            "--bind", cfg.bind, "--db", cfg.db, "--keys-dir", cfg.keys_dir, "--log-level", "error"]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    proc = start()
    agent = Agent(ctx, cfg, keys_dir, "gpu-a")
    unacked: dict[int, float] = {}  # seq -> last send time: resend until acked
    next_seq, killed, window = 1, False, 25
    deadline = time.monotonic() + 25
    try:
        while (next_seq <= SENDER_EVENTS or unacked) and time.monotonic() < deadline:
            now = time.monotonic()
            while len(unacked) < window and next_seq <= SENDER_EVENTS:
                unacked[next_seq] = 0.0
                next_seq += 1
            for seq, last in list(unacked.items()):
                if now - last > 0.5:
                    agent.send(EVENT, seq, {"kind": "xid", "gpu": seq % 8, "data": 79,
                                            "verdict": "FAIL", "findings": []})
                    unacked[seq] = now
            env = agent.recv(0.05)
            if env is not None and env.type == ACK:
                for seq in env.body["seqs"]:
                    unacked.pop(seq, None)
            if not killed and next_seq > SENDER_EVENTS // 2:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed = True
                proc = start()
        assert killed and not unacked and next_seq > SENDER_EVENTS
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    rows = db_rows(cfg, "SELECT seq, count(*) FROM events GROUP BY seq")
    assert len(rows) == SENDER_EVENTS and all(n == 1 for _, n in rows)
    assert {seq for seq, _ in rows} == set(range(1, SENDER_EVENTS + 1))


# --------------------------------------------------------------------------- store


def test_schema_migrates_and_reopens(store_url: str) -> None:
    path = store_url  # (a 0-byte file is refused: tests/test_store_integrity.py)
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION
    tables = dialect_of(store.db).tables(store.db)
    assert {"nodes", "messages", "reports", "report_history", "findings", "events",
            "command_results", "schema_version"} <= tables
    if dialect_of(store.db).name == "sqlite":
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    again = Store(path)
    assert again.schema_version() == SCHEMA_VERSION
    assert again.db.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 1
    again.db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    again.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_store_batch_dedup_prune_events(store_url: str) -> None:
    store = Store(store_url)
    old = time.time() - 100 * 86400
    ev = Envelope(type=EVENT, node="n1", seq=1, ts=old,
                  body={"kind": "xid", "gpu": 2, "data": 48, "verdict": "FAIL",
                        "findings": [{"check": "xid", "severity": "FAIL", "gpu": 2, "message": "DBE"}]})
    rep = Envelope(type=REPORT, node="n1", seq=2, body={"verdict": "OK", "findings": []})
    assert store.store_batch([("n1", ev), ("n1", ev), ("n1", rep)]) == [("n1", 1), ("n1", 2)]
    assert store.store_batch([("n1", ev)]) == []
    [e] = store.events(node="n1")
    assert e["kind"] == "xid" and e["gpu"] == 2 and e["body"]["data"] == 48
    assert store.events(since=time.time() - 60) == []
    [node] = store.fleet()
    assert node["verdict"] == "OK" and node["last_seq"] == 2 and node["worst_check"] is None
    # The old event and its finding go; its dedup row stays (kept by received_at, not ts).
    assert store.prune(90) == 2
    assert store.count("events") == 0 and store.count("reports") == 1
    assert store.mark_unreachable(time.time() + 60, 30) == ["n1"]
    assert store.mark_unreachable(time.time() + 60, 30) == []


def test_touch_records_that_nodes_were_heard_and_nothing_else(store_url: str) -> None:
    """A heartbeat's write: last_seen (never moved back) and reachability, a node heard
    for the first time gets its row; its verdict, last seq and history stay."""
    store = Store(store_url)
    t0 = time.time()
    report = Envelope(type=REPORT, node="n1", seq=7, body={
        "verdict": "WARN", "findings": [{"check": "gpu.temp", "severity": "WARN", "gpu": 0, "message": "hot"}]})
    store.store_batch([("n1", report)], received_at=t0)
    assert store.mark_unreachable(t0 + 60, 30) == ["n1"]
    history = store.count("report_history")

    store.touch({"n1", "n2"}, t0 + 61)
    store.touch({"n1"}, t0 + 50)  # an older time: last_seen stays
    store.touch(set(), t0 + 70)  # nothing to write

    rows = {row["node"]: row for row in store.fleet()}
    assert set(rows) == {"n1", "n2"}
    n1, n2 = rows["n1"], rows["n2"]
    assert (n1["verdict"], n1["last_seq"], n1["worst_check"]) == ("WARN", 7, "gpu.temp")
    assert n1["last_seen"] == pytest.approx(t0 + 61) and n1["reachable"]
    assert n2["verdict"] is None and n2["last_seq"] == 0 and n2["reachable"]
    assert store.count("report_history") == history
    kinds = [kind for (kind,) in store.db.execute(
        "SELECT kind FROM node_states WHERE node = ? ORDER BY ts", ("n1",))]
    assert kinds == ["unreachable", "reachable"]
    assert store.mark_unreachable(t0 + 80, 30) == []  # heard at t0 + 61
    store.close()


# --------------------------------------------------------------------------- CLI


def test_fleet_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str) -> None:
    store = Store(store_url)
    store.store_batch([("gpu-a", Envelope(type=REPORT, node="gpu-a", seq=1, body={
        "verdict": "FAIL", "findings": [{"check": "gpu.ecc", "severity": "FAIL", "gpu": 1,
                                         "message": "uncorrected ECC"}]})),
        ("gpu-b", Envelope(type=REPORT, node="gpu-b", seq=1, body={"verdict": "OK", "findings": []}))])
    store.close()
    config = tmp_path / "slurmgpu.toml"
    config.write_text("")

    class FakeSlurm:
        def nodes(self) -> list[Any]:
            from slurmgpu.slurm import NodeState

            return [NodeState("gpu-a", "idle", frozenset({"DRAIN"})), NodeState("gpu-b", "idle")]

    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurm())
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", store_url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["automation"] is None and doc["pending_checkpoints"] == []
    rows = {r["node"]: r for r in doc["nodes"]}
    assert rows["gpu-a"]["verdict"] == "FAIL" and rows["gpu-a"]["drained"] is True
    assert rows["gpu-a"]["worst_check"] == "gpu.ecc" and rows["gpu-b"]["drained"] is False

    def unreachable(*a: Any, **k: Any) -> Any:
        raise OSError("no slurmctld")

    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", unreachable)
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", store_url])
    assert result.exit_code == 0, result.output
    assert "DRAINED?" in result.output and "gpu.ecc" in result.output
    assert all(line.split()[5] == "?" for line in result.output.splitlines()[1:])


def test_sd_notify(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        assert fleet_cmd.sd_notify("READY=1", {"NOTIFY_SOCKET": path})
        assert server.recv(100) == b"READY=1"
    assert not fleet_cmd.sd_notify("READY=1", {})
    assert os.path.exists(path)


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_the_nodes_clock_never_decides_which_report_counts(store_url: str, step_s: float) -> None:
    """Issue 12 item 7: after the node's clock stepped back 1 h a new FAIL was hidden in
    `fleet` and the metrics; after a step forward a stale verdict stayed frozen. The last
    report to arrive is the node's word; its ts is kept as data only."""
    store = Store(store_url)
    now = time.time()
    ok = Envelope(type=REPORT, node="n1", seq=1, ts=now, body={"verdict": "OK", "findings": []})
    fail = Envelope(type=REPORT, node="n1", seq=2, ts=now + step_s, body={
        "verdict": "FAIL", "findings": [{"check": "gpu.lost", "severity": "FAIL", "gpu": 3, "message": "lost"}]})
    later_ok = Envelope(type=REPORT, node="n1", seq=3, ts=now, body={"verdict": "OK", "findings": []})
    store.store_batch([("n1", ok)])
    store.store_batch([("n1", fail)])
    [node] = store.fleet()
    assert (node["verdict"], node["worst_check"]) == ("FAIL", "gpu.lost")
    assert store.db.execute("SELECT verdict, ts FROM reports WHERE node = 'n1'").fetchone() == ("FAIL", now + step_s)
    store.store_batch([("n1", later_ok)])
    assert store.fleet()[0]["verdict"] == "OK"
    store.close()


def test_a_routing_id_squatter_neither_locks_a_node_out_nor_gets_its_commands(
        tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:
    """Issue 12 item 6: gpu-b's valid key connected under the routing id "gpu-a"; the real
    gpu-a then stored nothing and its drain-now checkpoint command went to the squatter.
    Agents now let ZeroMQ pick their routing id, and the collector routes by the
    authenticated key."""
    cfg = make_settings(tmp_path, keys_dir)
    collector = build_collector(cfg)
    try:
        squatter = Agent(ctx, cfg, keys_dir, "gpu-b", routing_id="gpu-a")
        squatter.send(HELLO, 1, {"version": "1", "gpus": 8, "interval_s": 15.0})
        real = Agent(ctx, cfg, keys_dir, "gpu-a", routing_id="")
        real.send(HELLO, 1, {"version": "1", "gpus": 8, "interval_s": 15.0})
        deadline = time.monotonic() + 10
        while collector.counters.stored < 1 and time.monotonic() < deadline:
            collector.serve_once(50)
        assert real.acked() == [1]  # the real node is heard
        while collector.counters.rejected["routing_mismatch"] < 1 and time.monotonic() < deadline:
            collector.serve_once(50)
        assert collector.counters.rejected["routing_mismatch"] == 1  # the squatter is refused, counted
        command_id = collector.send_command("gpu-a", "checkpoint", {"job_id": "7"})
        env = real.recv()
        assert env is not None and env.type == COMMAND and env.id == command_id
        assert squatter.recv(0.5) is None  # nothing for the squatter
    finally:
        collector.close()
