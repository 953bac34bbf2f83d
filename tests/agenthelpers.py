"""A minimal CURVE ROUTER standing in for the collector, and helpers to run a real agent."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

from slurmgpu import keys, wire
from slurmgpu.agent.link import Link
from slurmgpu.agent.spool import Spool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_keys(root: Path, node: str) -> Path:
    """A keys directory with the collector's keypair and one node's (its bundle under
    ``bundles/<node>``)."""
    keys.init(root)
    keys.add_node(root, node)
    return root


class Links:
    """Agent links (``Link`` threads) a test starts with ``make``, all stopped by ``stop``."""

    def __init__(self, keys_dir: Path, spool: Spool, node: str, heartbeat_s: float,
                 log: Callable[[], Any] | None = None) -> None:
        self.keys_dir, self.spool, self.node, self.heartbeat_s, self.log = keys_dir, spool, node, heartbeat_s, log
        self.made: list[Link] = []

    def make(self, *addresses: str, events_port: int = 0) -> Link:
        link = Link(addresses=addresses, node=self.node, keys=keys.client_keys(self.keys_dir / "bundles" / self.node),
                    spool=self.spool, heartbeat_s=self.heartbeat_s, on_command=lambda _m: None,
                    events_port=events_port)
        if self.log is not None:
            link.log = self.log()
        self.made.append(link)
        link.start()
        return link

    def stop(self) -> None:
        for link in self.made:
            link.stop()
            link.join(5)


def make_bundle(root: Path) -> tuple[Path, Path]:
    """(node bundle dir, collector secret file): zmq certificates as slurmgpu.keys lays them out."""
    work = root / "certs"
    work.mkdir(parents=True, exist_ok=True)
    node_pub, node_sec = zmq.auth.create_certificates(str(work), "node")
    coll_pub, coll_sec = zmq.auth.create_certificates(str(work), "collector")
    bundle = root / "bundle"
    bundle.mkdir(exist_ok=True)
    for src, dst in ((node_pub, "node.key"), (node_sec, "node.key_secret"), (coll_pub, "collector.key")):
        (bundle / dst).write_bytes(Path(src).read_bytes())
        if dst.endswith("_secret"):
            (bundle / dst).chmod(0o600)
    Path(coll_sec).chmod(0o600)
    return bundle, Path(coll_sec)


class Received:
    def __init__(self, envelope: wire.Envelope, at: float) -> None:
        self.envelope = envelope
        self.at = at  # time.monotonic() on arrival


class FakeCollector:
    """ROUTER + CURVE server in a thread: acks (after 'commit'), dedupes by seq, heartbeats."""

    def __init__(self, port: int, server_secret: Path, *, ack: bool = True) -> None:
        self.port = port
        self.public, self.secret = zmq.auth.load_certificate(str(server_secret))
        self.ack = ack
        self.messages: list[Received] = []  # every frame, duplicates included
        self.stored: dict[int, wire.Envelope] = {}  # deduped by seq
        self.peers: set[bytes] = set()
        self.routes: dict[str, bytes] = {}  # node -> the routing id it last spoke from
        self._outbox: list[tuple[bytes, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bound = threading.Event()

    def start(self) -> FakeCollector:
        self._stop.clear()
        self._bound.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._bound.wait(5)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def send_command(self, node: str, command: str, **args: Any) -> str:
        command_id = uuid.uuid4().hex
        with self._lock:
            self._outbox.append((self.routes.get(node, node.encode()),
                                 wire.command_frame(node, command, args, id=command_id)))
        return command_id

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.curve_server = True
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        for _ in range(50):
            try:
                sock.bind(f"tcp://127.0.0.1:{self.port}")
                break
            except zmq.ZMQError:
                time.sleep(0.1)
        self._bound.set()
        next_hb = 0.0
        try:
            while not self._stop.is_set():
                if sock.poll(20):
                    ident, frame = sock.recv_multipart()
                    self._handle(sock, ident, frame)
                now = time.monotonic()
                with self._lock:
                    outbox, self._outbox = self._outbox, []
                for ident, frame in outbox:
                    sock.send_multipart([ident, frame])
                if now >= next_hb:
                    next_hb = now + 0.5
                    for node, peer in list(self.routes.items()):
                        sock.send_multipart([peer, wire.reply_heartbeat_frame(node)])
        finally:
            sock.close(linger=0)

    def _handle(self, sock: zmq.Socket[Any], ident: bytes, frame: bytes) -> None:
        env = wire.decode(frame)
        self.peers.add(ident)
        self.routes[env.node] = ident  # agents let ZeroMQ pick their routing id
        with self._lock:
            self.messages.append(Received(env, time.monotonic()))
        if env.type in wire.ACKED:
            self.stored.setdefault(env.seq, env)
            if self.ack:
                sock.send_multipart([ident, wire.ack_frame(env.node, [env.seq])])

    def of_type(self, mtype: str) -> list[wire.Envelope]:
        with self._lock:
            return [r.envelope for r in self.messages if r.envelope.type == mtype]

    def wait_for(self, pred: Callable[[wire.Envelope], bool], timeout: float = 10.0,
                 after: float = 0.0) -> Received:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for r in self.messages:
                    if r.at >= after and pred(r.envelope):
                        return r
            time.sleep(0.01)
        raise AssertionError(f"no matching message within {timeout} s; got "
                             f"{[(r.envelope.type, r.envelope.seq) for r in self.messages]}")


def agent_command() -> list[str]:
    from slurmgpu.cli import cli

    if "agent" in cli.commands:
        return [sys.executable, "-m", "slurmgpu", "agent"]
    return [sys.executable, "-m", "slurmgpu.cli.agent_cmd", "agent"]


def write_config(path: Path, *, port: int, spool: Path, interval: float = 1.0, heartbeat: float = 0.5,
                 extra: str = "") -> Path:
    path.write_text(
        f"""
[agent]
interval_s = {interval}
heartbeat_s = {heartbeat}
spool_dir = "{spool}"
socket = "{spool}/agent.sock"

[collector]
address = "tcp://127.0.0.1:{port}"

{extra}
""", encoding="utf-8")
    return path


class AgentProcess:
    def __init__(self, config: Path, bundle: Path, env: dict[str, str], log: Path,
                 node: str = "n1") -> None:
        self.log = log
        env = dict(env)
        env.pop("NOTIFY_SOCKET", None)
        self.fh = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*agent_command(), "--config", str(config), "--node", node, "--keys-dir", str(bundle)],
            env=env, stdout=self.fh, stderr=subprocess.STDOUT)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)
        self.fh.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.fh.close()
        return int(self.proc.returncode)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def spool_rows(spool_dir: Path) -> list[tuple[int, str]]:
    import sqlite3

    path = spool_dir / "spool.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=5)
    try:
        return [(int(s), str(t)) for s, t in conn.execute("SELECT seq, type FROM messages ORDER BY seq")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def query_db(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """One read-only query on a collector database another process writes."""
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


__all__ = ["AgentProcess", "FakeCollector", "free_port", "make_bundle", "query_db", "spool_rows",
           "wait_until", "write_config"]


@functools.cache
def checkout_unreachable_by_nobody() -> bool:
    """As root: whether user ``nobody`` cannot run this checkout's hooks (a checkout under a
    0700 directory, as ``mktemp -d`` makes): a job of an ordinary user would fail there."""
    if os.geteuid() != 0:
        return False
    hook = Path(__file__).resolve().parent.parent / "prolog" / "slurmgpu-taskprolog"
    probe = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-x", str(hook)], check=False)
    return probe.returncode != 0


NEEDS_NOBODY = pytest.mark.skipif(checkout_unreachable_by_nobody(),
                                  reason="user nobody cannot reach this checkout (a parent directory is 0700): "
                                         "its hooks cannot run in an ordinary user's job")
