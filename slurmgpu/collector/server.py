"""The collector: a ZeroMQ ROUTER (CURVE server) that stores what agents send.

Security: every connection is a CURVE handshake checked by ZAP against the allow-list
(``<keys_dir>/nodes/*.key``); the authenticated public key travels with each frame as
its "User-Id" and is mapped to the node name the key file is named after. A frame whose
envelope ``node`` or routing id differs from the key's node is rejected, so a node's key
can only speak for that node. A key revoked while its connection is up is refused from
the next allow-list reload (SIGHUP, or within 30 s).

Delivery: for each acked type (hello, report, event, command-result) the collector
stores the message and, only after the batch COMMITs, acks its seq; a duplicate
(node, epoch, seq) is not stored again but is acked again (and counted as a conflict,
and logged, when its body differs from the stored one). An ack names the epoch it
acknowledges.

Bad messages never stop ingestion. A frame whose envelope is valid but whose body is
not (``BodyError``), or a message the store cannot take although the store works, is
rejected, counted and acked as ``rejected``: it would fail the same way on every resend,
so the agent drops it (and logs it) instead of resending it forever. When the store
itself fails (disk full, I/O error, locked, corrupt) nothing is acked, so agents keep
their messages spooled and resend them later.

Automation (optional): after a batch's acks are sent, every newly stored report and
event is passed to ``Automation.on_report`` and its decisions are stored in the
``decisions`` table. A failing automation call is logged and counted; it never stops
the loop and never delays an ack. Drains an operator released from the circuit breaker
(`slurmgpu breaker release` writes the automation's state in the store) are carried out at
the next loop turn (``Automation.run_released``).

The loop is single-threaded (plus libzmq's I/O thread and the ZAP thread). All methods,
``send_command`` included, must be called from the thread that runs the loop.
"""

from __future__ import annotations

import gc
import itertools
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import zmq
from zmq.auth.thread import ThreadAuthenticator

from slurmgpu import keys
from slurmgpu.collector.checkpoint import Checkpoints
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.errors import SlurmGpuError
from slurmgpu.log import get_logger
from slurmgpu.slurm import NodeState, SlurmClient
from slurmgpu.wire import (
    ACK,
    ACKED,
    COMMAND,
    COMMAND_RESULT,
    EVENT,
    HEARTBEAT,
    MAX_FRAME,
    PROTOCOL_VERSION,
    REPORT,
    BodyError,
    Envelope,
    WireError,
    decode,
    decode_severity,
    encode,
)

if TYPE_CHECKING:
    from slurmgpu.collector.metrics import MetricsServer
    from slurmgpu.collector.policy import Automation, Decision

MAX_BATCH = 1000
ALLOW_LIST_RELOAD_S = 30.0
PRUNE_EVERY_S = 3600.0
STATS_EVERY_S = 60.0
REJECT_LOG_EVERY_S = 10.0
# libzmq drops (and disconnects) a peer sending a frame above this before Python sees it;
# frames between MAX_FRAME and this are read and counted as "oversized".
TRANSPORT_MAX_FRAME = 4 * MAX_FRAME
# Per peer: a ROUTER queues at most this many frames from one connection, then stops
# reading it (TCP backpressure; the agent's send waits, its spool keeps the rest). With
# MAX_FRAME that bounds what one node can make the collector hold to ~64 MiB; agents
# send far fewer between acks.
RCVHWM = 64
SNDHWM = 100_000  # acks and commands: small frames, and a ROUTER drops at the limit
# A batch (one transaction, then its acks) ends after MAX_BATCH frames, after
# MAX_BATCH_BYTES, or as soon as one peer has sent MAX_PEER_BATCH_BYTES of it: a node
# sending frames at the size limit delays other nodes' acks by two frames' work, not a
# thousand, while normal reports (~16 KB, a few per node) still batch by the thousand.
MAX_BATCH_BYTES = 32 * MAX_FRAME
MAX_PEER_BATCH_BYTES = 2 * MAX_FRAME

# An acked-type message to acknowledge: (routing id, node, epoch, seq, rejected).
AckItem = tuple[bytes, str, str, int, bool]
Batch = list[tuple[str, Envelope, bytes]]


def _message_fault(exc: BaseException) -> bool:
    """Whether a failed ``store_batch`` points at a message (a value SQLite cannot bind,
    a constraint, a bug on odd input: retry message by message and reject the culprit)
    rather than at the store itself (disk full, I/O error, locked, corrupt, closed:
    stop acking, agents keep spooling)."""
    if isinstance(exc, (sqlite3.InterfaceError, sqlite3.IntegrityError, sqlite3.DataError)):
        return True
    if isinstance(exc, sqlite3.ProgrammingError):  # a value of a type SQLite cannot bind,
        return "binding parameter" in str(exc)  # else a closed or misused connection
    return not isinstance(exc, (sqlite3.Error, OSError, MemoryError))


class SlurmPoller(threading.Thread):
    """Asks Slurm for every node's state every ``interval_s`` in its own thread (an
    unresponsive slurmctld must never stall the collector loop); the loop takes the
    latest answer with ``take``."""

    def __init__(self, client: SlurmClient, interval_s: float) -> None:
        super().__init__(name="slurmgpu-slurm-poll", daemon=True)
        self.client = client
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._latest: tuple[float, list[NodeState]] | None = None
        self._failing = False
        self.log = get_logger(component="slurm_poll")

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                states = self.client.nodes()
            except Exception as exc:  # slurmctld down, no Slurm here: say so once per streak
                if not self._failing:
                    self.log.warning("slurm_poll_failed", error=f"{type(exc).__name__}: {exc}")
                self._failing = True
            else:
                if self._failing:
                    self.log.info("slurm_poll_recovered")
                self._failing = False
                with self._lock:
                    self._latest = (time.time(), states)
            self._stop_event.wait(self.interval_s)

    def take(self) -> tuple[float, list[NodeState]] | None:
        with self._lock:
            latest, self._latest = self._latest, None
        return latest

    def stop(self) -> None:
        self._stop_event.set()


class CollectorError(SlurmGpuError):
    """The collector could not start or could not deliver a command."""


@dataclass
class Counters:
    received: int = 0
    stored: int = 0
    duplicates: int = 0
    acks_sent: int = 0
    acks_failed: int = 0
    heartbeats_received: int = 0
    heartbeats_sent: int = 0
    probes_answered: int = 0  # `slurmgpu doctor`'s heartbeats with {"probe": true}
    batches: int = 0
    store_errors: int = 0
    # Consecutive store batches that failed (0 after one that succeeded): while it is not
    # 0 nothing is acked, agents keep spooling, and /metrics says the store is down.
    store_failing: int = 0
    conflicts: int = 0  # duplicates whose body differs from the stored message
    decisions: int = 0
    automation_errors: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        return {"received": self.received, "stored": self.stored, "duplicates": self.duplicates,
                "acks_sent": self.acks_sent, "acks_failed": self.acks_failed,
                "heartbeats_received": self.heartbeats_received,
                "heartbeats_sent": self.heartbeats_sent, "probes_answered": self.probes_answered,
                "batches": self.batches,
                "store_errors": self.store_errors, "conflicts": self.conflicts,
                "decisions": self.decisions,
                "automation_errors": self.automation_errors, "rejected": dict(self.rejected)}


def _packed(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


class _FrameBuilder:
    """The collector's own envelopes (acks, heartbeats), packed by hand: a msgpack map is
    its header followed by its packed keys and values, so the constant parts are packed
    once. Message ids are unique per process (a random prefix and a counter), cheaper
    than a uuid4 each. The result is exactly what ``wire.encode`` would produce for the
    same fields (tests check it decodes)."""

    def __init__(self) -> None:
        # (the map header, 0x87 = 7 keys, is prepended per frame: 8 with an epoch)
        self._head = _packed("v") + _packed(PROTOCOL_VERSION) + _packed("id")
        self._node_key = _packed("node")
        self._mid = _packed("seq") + _packed(0) + _packed("ts")
        self._ack_tail = _packed("type") + _packed(ACK) + _packed("body")
        self._seqs_key, self._rejected_key = _packed("seqs"), _packed("rejected")
        self._epoch_key = _packed("epoch")
        self._heartbeat_tail = _packed("type") + _packed(HEARTBEAT) + _packed("body") + _packed({})
        self._prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count(1)
        self._nodes: dict[str, bytes] = {}

    def _start(self, node: str, keys: int = 7) -> bytes:
        part = self._nodes.get(node)
        if part is None:
            if len(self._nodes) > 1_000_000:
                self._nodes.clear()
            part = self._nodes[node] = self._node_key + _packed(node) + self._mid
        return (bytes((0x80 | keys,)) + self._head
                + _packed(f"{self._prefix}{next(self._counter):016x}") + part + _packed(time.time()))

    def ack(self, node: str, seqs: list[int], epoch: str = "", rejected: list[int] | None = None) -> bytes:
        body = (b"\x82" + self._seqs_key + _packed(seqs) + self._rejected_key + _packed(rejected)
                if rejected else b"\x81" + self._seqs_key + _packed(seqs))
        frame = self._start(node, 8 if epoch else 7) + self._ack_tail + body
        return frame + self._epoch_key + _packed(epoch) if epoch else frame

    def heartbeat(self, node: str) -> bytes:
        return self._start(node) + self._heartbeat_tail


class Collector:
    def __init__(self, settings: CollectorSettings, *, store: Store | None = None,
                 automation: Automation | None = None, max_batch: int = MAX_BATCH,
                 slurm: SlurmClient | None = None) -> None:
        self.settings = settings
        self.automation = automation
        self.log = get_logger(component="collector")
        self.counters = Counters()
        self.max_batch = max_batch
        self.keys_dir = Path(settings.keys_dir)
        public, secret = keys.server_keys(self.keys_dir)
        self.allowed: dict[bytes, str] = keys.allowed_nodes(self.keys_dir)
        self._frames = _FrameBuilder()
        self._allow_stamp = self._nodes_dir_stamp()
        self.store = store if store is not None else Store(settings.db,
                                                           sample_interval_s=settings.sample_interval_s)
        self._own_store = store is None
        self.checkpoints: Checkpoints | None = None
        if automation is not None and hasattr(automation, "attach_checkpoints"):
            self.checkpoints = Checkpoints(self.store, automation.client, automation.settings,
                                           send=self.send_command)
            automation.attach_checkpoints(self.checkpoints)
        self.ctx = zmq.Context()
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=str(self.keys_dir / keys.NODES_DIR))
        sock = self.ctx.socket(zmq.ROUTER)
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.LINGER, 0)
        # ZMTP heartbeats drop dead connections, so a restarted agent (same routing id)
        # is not locked out by its own stale connection.
        ivl = max(100, int(settings.heartbeat_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl * max(2, settings.unreachable_after))
        try:
            sock.bind(settings.bind)
        except zmq.ZMQError as exc:
            self._teardown(sock)
            raise CollectorError(f"cannot bind {settings.bind}: {exc}") from None
        self.sock = sock
        self.endpoint: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        now = time.monotonic()
        self._seen: dict[str, float] = {}  # node -> wall time last heard (this process)
        # node -> routing id its authenticated key last spoke from: where its commands and
        # heartbeats go (a routing id is the client's claim; the key is not)
        self._routes: dict[str, bytes] = {}
        self._next_heartbeat = now + settings.heartbeat_s
        self._next_reload = now + ALLOW_LIST_RELOAD_S
        self._next_prune = now  # prune once at start, then hourly
        self._next_stats = now + STATS_EVERY_S
        self._reload_requested = False
        self._reject_logged: dict[str, float] = {}
        self._reject_suppressed: Counter[str] = Counter()
        self._closed = False
        self.slurm_poller: SlurmPoller | None = None
        if slurm is not None and settings.slurm_poll_s > 0:
            self.slurm_poller = SlurmPoller(slurm, settings.slurm_poll_s)
            self.slurm_poller.start()
        self._automation_fleet_size()
        self.log.info("collector_listening", endpoint=self.endpoint, nodes=len(self.allowed),
                      db=str(self.store.path), automation=automation is not None)
        # Prometheus /metrics (collector/metrics.py): computed at scrape time in its own thread.
        self.metrics_server: MetricsServer | None = None
        if settings.metrics_bind:
            from slurmgpu.collector.metrics import start_metrics_server

            try:
                self.metrics_server = start_metrics_server(
                    self, settings.metrics_bind, tls_cert=settings.metrics_tls_cert,
                    tls_key=settings.metrics_tls_key, client_ca=settings.metrics_client_ca)
            except (OSError, ValueError) as exc:
                self.close()
                detail = str(exc) if isinstance(exc, ValueError) else (
                    f"collector.metrics_bind = {settings.metrics_bind!r}: cannot serve metrics: {exc}")
                raise CollectorError(detail) from None
            self.log.info("metrics_listening", url=self.metrics_server.url)

    # ------------------------------------------------------------------ lifecycle

    def run(self, stop_event: threading.Event) -> None:
        """Serve until ``stop_event`` is set. Installs a SIGHUP handler (allow-list
        reload) when called from the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        try:
            while not stop_event.is_set():
                self.serve_once(200)
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        poller = getattr(self, "slurm_poller", None)
        if poller is not None:
            poller.stop()
        metrics_server = getattr(self, "metrics_server", None)  # None: not started (yet)
        if metrics_server is not None:
            metrics_server.shutdown()
        self.log.info("collector_stopped", **self.counters.snapshot())
        self._teardown(self.sock)
        if self._own_store:
            self.store.close()

    def _teardown(self, sock: zmq.Socket[Any]) -> None:
        sock.close(linger=0)
        self.auth.stop()
        self.ctx.term()

    def request_reload(self) -> None:
        """Reload the allow-list at the next loop turn (signal-safe)."""
        self._reload_requested = True

    # ------------------------------------------------------------------ the loop

    def serve_once(self, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for frames, handle up to ``max_batch`` of them (one
        transaction, then the acks), run the periodic tasks. Returns frames handled."""
        handled = 0
        if self.sock.poll(timeout_ms, zmq.POLLIN):
            handled = self._drain()
        self._periodic()
        return handled

    def _drain(self) -> int:
        # A batch is ~100k short-lived, acyclic objects (decoded msgpack): the cyclic GC
        # would traverse them over and over (it nearly halves throughput). Reference
        # counting frees them; the GC runs again between batches.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._drain_batch()
        finally:
            if was_enabled:
                gc.enable()

    def _drain_batch(self) -> int:
        batch: Batch = []
        to_ack: list[AckItem] = []
        handled = size = 0
        per_peer: dict[bytes, int] = {}
        sock = self.sock
        now = time.time()
        while handled < self.max_batch and size < MAX_BATCH_BYTES:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            handled += 1
            self._accept(parts, batch, to_ack, now)
            frame_size = len(parts[-1])
            size += frame_size
            peer = parts[0].bytes
            peer_size = per_peer[peer] = per_peer.get(peer, 0) + frame_size
            if peer_size >= MAX_PEER_BATCH_BYTES:
                break
        if not batch:
            self._send_acks(to_ack)  # rejected messages only
            return handled
        self.counters.batches += 1
        new = self._store(batch, to_ack, now)
        if new is None:
            return handled  # the store failed: nothing is acked, the agents resend
        self.counters.stored += len(new)
        self.counters.duplicates += sum(1 for item in to_ack if not item[4]) - len(new)
        self._send_acks(to_ack)
        if self.automation is not None and new:
            self._automate(batch, new, now)
        if self.checkpoints is not None and new:
            self._checkpoint_messages(batch, new, now)
        return handled

    def _store(self, batch: Batch, to_ack: list[AckItem], now: float) -> list[tuple[str, int]] | None:
        """Store the batch in one transaction; if a message in it is what failed, store
        it message by message and reject the ones that fail (marked in ``to_ack``).
        None: the store itself failed."""
        try:
            new = self.store.store_batch(batch, received_at=now)
        except Exception as exc:
            if not _message_fault(exc):
                self._store_failed(exc, len(batch))
                return None
            self.log.warning("store_batch_isolating", error=f"{type(exc).__name__}: {exc}",
                             messages=len(batch))
            return self._store_each(batch, to_ack, now)
        self.counters.store_failing = 0
        self._note_conflicts()
        return new

    def _store_each(self, batch: Batch, to_ack: list[AckItem], now: float) -> list[tuple[str, int]] | None:
        new: list[tuple[str, int]] = []
        bad: set[tuple[str, str, int]] = set()
        for item in batch:
            node, env = item[0], item[1]
            try:
                new += self.store.store_batch([item], received_at=now)
            except Exception as exc:
                if not _message_fault(exc):
                    self._store_failed(exc, len(batch))
                    return None
                bad.add((node, env.epoch, env.seq))
                self._reject("store", node=node, type=env.type, epoch=env.epoch, seq=env.seq,
                             error=f"{type(exc).__name__}: {exc}")
                continue
            self._note_conflicts()
        if bad:
            to_ack[:] = [(r, n, e, q, rej or (n, e, q) in bad) for r, n, e, q, rej in to_ack]
        self.counters.store_failing = 0
        return new

    def _store_failed(self, exc: BaseException, messages: int) -> None:
        self.counters.store_errors += 1
        self.counters.store_failing += 1
        self.log.error("store_failed", error=f"{type(exc).__name__}: {exc}", messages=messages)

    def _note_conflicts(self) -> None:
        """Count and log the duplicates the store found with a body different from the
        stored one (a seq reused within a spool epoch: that message was not stored)."""
        for c in self.store.conflicts:
            self.counters.conflicts += 1
            self._log_limited("duplicate_body_differs", node=c.node, epoch=c.epoch, seq=c.seq,
                              type=c.type)

    def _accept(self, parts: list[Any], batch: Batch, to_ack: list[AckItem], now: float) -> None:
        self.counters.received += 1
        if len(parts) != 2:
            self._reject("frames", frames=len(parts))
            return
        routing_id: bytes = parts[0].bytes
        frame = parts[1]
        try:
            user = frame.get("User-Id")
        except (zmq.ZMQError, KeyError):
            user = None
        node = self.allowed.get(user.encode("ascii", "replace")) if isinstance(user, str) else None
        if node is None:
            self._reject("unknown_key", key=keys.fingerprint(user.encode()) if user else None)
            return
        data: bytes = frame.bytes
        if len(data) > MAX_FRAME:
            self._reject("oversized", node=node, size=len(data))
            return
        try:
            env = decode(data)
        except BodyError as exc:
            self._reject("malformed", node=node, error=str(exc))
            self._ack_rejected(exc.envelope, node, routing_id, to_ack)
            return
        except WireError as exc:
            reason = "version" if "protocol version" in str(exc) else "malformed"
            self._reject(reason, node=node, error=str(exc))
            return
        if env.node != node:
            self._reject("node_mismatch", node=node, claimed=env.node)
            return
        if not _routing_id_ok(routing_id, node):
            self._reject("routing_mismatch", node=node,
                         routing_id=routing_id.decode("utf-8", "replace")[:64])
            return
        if env.type == HEARTBEAT and env.body.get("probe") is True:
            # `slurmgpu doctor` checking this node's key from another socket: answer at once,
            # and leave the node's route and last-seen time to its agent.
            self.counters.probes_answered += 1
            self._send(routing_id, self._frames.heartbeat(node))
            return
        self._routes[node] = routing_id  # commands follow the authenticated key, not a claimed id
        if env.type == HEARTBEAT:
            self.counters.heartbeats_received += 1
        elif env.type not in ACKED:
            self._reject("unexpected_type", node=node, type=env.type)
            return
        self._seen[node] = now
        batch.append((node, env, data))
        if env.type in ACKED:
            to_ack.append((routing_id, node, env.epoch, env.seq, False))

    def _ack_rejected(self, env: Envelope, node: str, routing_id: bytes, to_ack: list[AckItem]) -> None:
        """Ack a message whose body was refused, if it is the authenticated node's own
        acked-type message: the agent drops it instead of resending it forever."""
        if env.node == node and _routing_id_ok(routing_id, node) and env.type in ACKED:
            to_ack.append((routing_id, node, env.epoch, env.seq, True))

    # ------------------------------------------------------------------ automation

    def _automate(self, batch: Batch, new: list[tuple[str, int]],
                  now: float) -> None:
        """Feed the newly stored reports and events to the automation (after the acks)."""
        automation = self.automation
        if automation is None:
            return
        self._automation_sync()
        self._automation_released()  # before new reports: they may trip the breaker again
        fresh = set(new)
        decisions: list[Decision] = []
        for node, env, _data in batch:
            if env.type not in (REPORT, EVENT) or (node, env.seq) not in fresh:
                continue
            fresh.discard((node, env.seq))  # a seq repeated within the batch counts once
            try:
                verdict = decode_severity(env.body["verdict"])  # (a str: decode validated it)
                decisions.extend(automation.on_report(node, verdict, env.findings, now))
            except Exception as exc:  # a policy bug must not take the collector down
                self.counters.automation_errors += 1
                self.log.error("automation_failed", node=node, seq=env.seq,
                               error=f"{type(exc).__name__}: {exc}")
        self._record_decisions(decisions)

    def _checkpoint_messages(self, batch: Batch,
                             new: list[tuple[str, int]], now: float) -> None:
        """Acks of checkpoint requests (command results) and agents' local fallbacks."""
        checkpoints = self.checkpoints
        if checkpoints is None:
            return
        fresh = set(new)
        decisions: list[Decision] = []
        for node, env, _data in batch:
            body = env.body if isinstance(env.body, dict) else {}
            if (node, env.seq) not in fresh:
                continue
            try:
                if env.type == COMMAND_RESULT:
                    decisions += checkpoints.on_result(node, body, now)
                elif env.type == EVENT and body.get("kind") == "local_checkpoint":
                    checkpoints.on_local(node, body, now)
            except Exception as exc:
                self.counters.automation_errors += 1
                self.log.error("checkpoint_message_failed", node=node, seq=env.seq,
                               error=f"{type(exc).__name__}: {exc}")
        self._record_decisions(decisions)

    def _checkpoint_tick(self) -> None:
        if self.checkpoints is None:
            return
        self._automation_sync()
        try:
            decisions = self.checkpoints.tick(time.time())
        except Exception as exc:
            self.counters.automation_errors += 1
            self.log.error("checkpoint_tick_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self._record_decisions(decisions)

    def _record_decisions(self, decisions: list[Decision]) -> None:
        if not decisions:
            return
        for d in decisions:
            self.log.info("automation_decision", node=d.node, action=d.action, result=d.result,
                          held=d.held, dry_run=d.dry_run, trigger=d.trigger, reason=d.reason)
        try:
            self.counters.decisions += self.store.add_decisions(decisions)
        except sqlite3.Error as exc:
            self.counters.store_errors += 1
            self.log.error("decisions_store_failed", error=str(exc), decisions=len(decisions))

    def _automation_fleet_size(self) -> None:
        if self.automation is None:
            return
        self._automation_sync()
        try:
            self.automation.fleet_size(len(self.allowed))
        except Exception as exc:
            self.counters.automation_errors += 1
            self.log.error("automation_failed", error=f"{type(exc).__name__}: {exc}")

    def _automation_released(self) -> None:
        """Carry out the drains an operator released (``slurmgpu breaker release``)."""
        run = getattr(self.automation, "run_released", None)
        if run is None or not getattr(getattr(self.automation, "state", None), "released", None):
            return
        try:
            decisions = run(time.time())
        except Exception as exc:
            self.counters.automation_errors += 1
            self.log.error("automation_failed", error=f"{type(exc).__name__}: {exc}")
            return
        for d in decisions:
            self.log.info("breaker_release_carried_out", node=d.node, action=d.action, result=d.result,
                          released_by=d.released_by)
        self._record_decisions(decisions)

    def _automation_sync(self) -> None:
        """Read the automation's state back if another process changed it in the store
        (``slurmgpu breaker release``), so an operator's release is seen, and kept."""
        automation = self.automation
        if automation is None or not hasattr(automation, "refresh"):
            return
        try:
            if automation.refresh():
                self.log.info("automation_state_reloaded", db=str(self.store.path),
                              breaker_open=bool(automation.state.breaker.get("open")))
        except Exception as exc:  # unreadable for now: keep the state in memory
            self.counters.automation_errors += 1
            self.log.error("automation_state_unreadable", db=str(self.store.path), error=str(exc))

    def _send_acks(self, to_ack: list[AckItem]) -> None:
        """One ack per peer and epoch. A seq both rejected and stored in this batch (a
        bad copy and a good one) is acked as stored."""
        per_peer: dict[tuple[bytes, str], tuple[str, dict[int, bool]]] = {}
        for routing_id, node, epoch, seq, rejected in to_ack:
            seqs = per_peer.setdefault((routing_id, epoch), (node, {}))[1]
            seqs[seq] = seqs.get(seq, True) and rejected
        ack = self._frames.ack
        for (routing_id, epoch), (node, seqs) in per_peer.items():
            refused = [q for q, rejected in seqs.items() if rejected]
            if self._send(routing_id, ack(node, list(seqs), epoch, refused)):
                self.counters.acks_sent += 1
            else:
                self.counters.acks_failed += 1

    def _send(self, routing_id: bytes, frame: bytes) -> bool:
        try:
            self.sock.send_multipart([routing_id, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (gone) or EAGAIN (its queue is full)
            return False

    def _reject(self, reason: str, **detail: Any) -> None:
        self.counters.rejected[reason] += 1
        self._log_limited("message_rejected", reason=reason, **detail)

    def _log_limited(self, event: str, *, reason: str = "", **detail: Any) -> None:
        """A warning, at most one per event and reason every REJECT_LOG_EVERY_S (with how
        many were suppressed since), so a flood of bad frames cannot flood the log."""
        now = time.monotonic()
        key = f"{event}:{reason}"
        last = self._reject_logged.get(key)
        if last is not None and now - last < REJECT_LOG_EVERY_S:
            self._reject_suppressed[key] += 1
            return
        self._reject_logged[key] = now
        suppressed = self._reject_suppressed.pop(key, 0)
        extra = {"reason": reason} if reason else {}
        self.log.warning(event, suppressed=suppressed, **extra, **detail)

    # ------------------------------------------------------------------ commands

    def send_command(self, node: str, command: str, args: dict[str, Any] | None = None) -> str:
        """Send a command to a connected node; returns the command id (the envelope id,
        echoed as ``command_id`` in the command-result)."""
        command_id = uuid.uuid4().hex
        env = Envelope(type=COMMAND, node=node, seq=0, body={"command": command, "args": args or {}},
                       id=command_id)
        route = self._routes.get(node)
        if route is None or not self._send(route, encode(env)):
            raise CollectorError(f"node {node} is not connected (or its queue is full)")
        self.log.info("command_sent", node=node, command=command, command_id=command_id)
        return command_id

    # ------------------------------------------------------------------ periodic

    def _periodic(self) -> None:
        mono = time.monotonic()
        if self.metrics_server is not None:
            self.metrics_server.sample()  # at most once a second, cheap
        if self._reload_requested or mono >= self._next_reload:
            force = self._reload_requested
            self._reload_requested = False
            self._next_reload = mono + ALLOW_LIST_RELOAD_S
            self.reload_allow_list(force=force)
        if self.automation is not None:
            self._automation_sync()
            self._automation_released()
        self._checkpoint_tick()
        self._slurm_states()
        if mono >= self._next_heartbeat:
            self._next_heartbeat = mono + self.settings.heartbeat_s
            self._heartbeat()
        if mono >= self._next_prune:
            self._next_prune = mono + PRUNE_EVERY_S
            try:
                deleted = self.store.prune(self.settings.retention_days)
                if deleted:
                    self.log.info("pruned", rows=deleted, retention_days=self.settings.retention_days)
            except sqlite3.Error as exc:
                self.log.error("prune_failed", error=str(exc))
        if mono >= self._next_stats:
            self._next_stats = mono + STATS_EVERY_S
            self.log.info("collector_stats", **self.counters.snapshot())

    def _slurm_states(self) -> None:
        """Record drain/resume transitions from the poller's latest look at Slurm."""
        if self.slurm_poller is None:
            return
        polled = self.slurm_poller.take()
        if polled is None:
            return
        at, states = polled
        fleet = set(self.allowed.values())
        try:
            changes = self.store.record_slurm_states([s for s in states if s.name in fleet], at)
        except sqlite3.Error as exc:
            self.log.error("slurm_states_store_failed", error=str(exc))
            return
        for node, kind in changes:
            self.log.info("node_state", node=node, kind=kind)

    def _heartbeat(self) -> None:
        now = time.time()
        window = self.settings.unreachable_after * self.settings.heartbeat_s
        for node, seen in list(self._seen.items()):
            if now - seen > window:
                del self._seen[node]
                continue
            route = self._routes.get(node)
            if route is not None and self._send(route, self._frames.heartbeat(node)):
                self.counters.heartbeats_sent += 1
        try:
            gone = self.store.mark_unreachable(now, window)
        except sqlite3.Error as exc:
            self.log.error("mark_unreachable_failed", error=str(exc))
            return
        for node in gone:
            self.log.warning("node_unreachable", node=node, silent_s=window)

    def _nodes_dir_stamp(self) -> int | None:
        try:
            return os.stat(self.keys_dir / keys.NODES_DIR).st_mtime_ns
        except OSError:
            return None

    def reload_allow_list(self, *, force: bool = True) -> bool:
        """Re-read the allow-list (and re-configure ZAP) if it changed or ``force``.
        A broken allow-list keeps the previous one (logged). Returns True if reloaded."""
        stamp = self._nodes_dir_stamp()
        if not force and stamp == self._allow_stamp:
            return False
        try:
            allowed = keys.allowed_nodes(self.keys_dir)
        except SlurmGpuError as exc:
            self.log.error("allow_list_invalid", error=str(exc), kept=len(self.allowed))
            return False
        self.auth.configure_curve(domain="*", location=str(self.keys_dir / keys.NODES_DIR))
        self._allow_stamp = stamp
        added = len(set(allowed) - set(self.allowed))
        removed = len(set(self.allowed) - set(allowed))
        self.allowed = allowed
        self._automation_fleet_size()
        self.log.info("allow_list_loaded", nodes=len(allowed), added=added, removed=removed)
        return True


def _routing_id_ok(routing_id: bytes, node: str) -> bool:
    """A message's routing id is the node's own name (agents before issue 12 set it) or
    one ZeroMQ generated for the connection (first byte 0; current agents set none). Any
    other id, e.g. another node's name claimed by this key, is squatting: refused."""
    return routing_id == node.encode() or routing_id[:1] == b"\x00"
