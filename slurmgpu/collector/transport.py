"""The collector's transport: ZeroMQ ROUTERs (CURVE servers; ZAP checks every handshake
against the allow-list, ``<keys_dir>/nodes/*.key``) that receive what agents send, ack it
once the ``Handler`` (``fleet.Fleet``) has stored it, heartbeat the nodes heard from, and
send them commands. A node's key speaks only for that node.

A loop turn reads a batch from the main socket (waiting up to ``max_batch_read_s`` for
more), then the events socket (``[collector] events_port``). Each batch is one
``Handler.commit`` (the events' first), then its acks, then ``Handler.acked``; nothing is
acked when the store fails. Why: docs/architecture.md ("The collector's transport").
Single-threaded: every method runs on the collector loop's thread.
"""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from slurmgpu import keys, wire
from slurmgpu.collector.counters import Counters, LimitedLog
from slurmgpu.collector.liveness import Liveness
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.errors import SlurmGpuError
from slurmgpu.log import get_logger
from slurmgpu.wire import MAX_FRAME, Envelope

MAX_BATCH = 256  # messages a batch (one transaction, then its acks)
MAX_BATCH_POSTGRES = 128
MAX_BATCH_READ_S = 0.05  # a batch reads, and waits for more, at most this long
MAX_BATCH_BYTES = 2 * MAX_FRAME  # and ends past this many bytes (a few large frames)
MAX_EVENTS_PER_BATCH = 256  # events socket frames read a loop turn
EVENTS_PEEK_EVERY = 16  # main socket frames between looks at whether events wait
URGENT = frozenset({wire.EVENT, wire.COMMAND_RESULT})  # what the events socket takes
ALLOW_LIST_RELOAD_S = 30.0
TRANSPORT_MAX_FRAME = 4 * MAX_FRAME  # libzmq drops a peer sending more; above MAX_FRAME: "oversized"
RCVHWM = 64  # frames queued per connection before TCP backpressure
SNDHWM = 100_000  # acks and commands; a ROUTER drops at the limit
TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_CNT = 60, 10, 6  # dead peers, by the kernel
MAIN_IO, EVENTS_IO = 1, 2  # zmq I/O threads of the main and the events socket

# An acked-type message to acknowledge: (socket, routing id, node, epoch, seq, rejected).
AckItem = tuple["zmq.Socket[Any]", bytes, str, str, int, bool]
# The accepted messages of one batch: (authenticated node, envelope, frame bytes).
Batch = list[tuple[str, Envelope, bytes]]


class CollectorError(SlurmGpuError):
    """The collector could not start or could not deliver a command."""


class Stored(NamedTuple):
    """A committed batch: the (node, seq) newly stored, the (node, epoch, seq) refused."""

    new: list[tuple[str, int]]
    refused: set[tuple[str, str, int]]


class Handler(Protocol):
    """What the transport hands decoded messages to (``fleet.Fleet``)."""

    def commit(self, batch: Batch, now: float) -> Stored | None:
        """Store the batch (one transaction); None: the store itself failed, ack nothing."""

    def acked(self, batch: Batch, new: list[tuple[str, int]], now: float) -> None:
        """After the acks: act on the newly stored messages (``new``: (node, seq))."""

    def allow_list_changed(self, allowed: Mapping[bytes, str]) -> None:
        """The allow-list was (re)loaded: key -> node."""

    def heard(self, nodes: set[str], now: float) -> bool:
        """Nodes heard by heartbeat (once per ``heartbeat_s``); False: not recorded."""


def _routing_id_ok(routing_id: bytes, node: str) -> bool:
    """One ZeroMQ generated (first byte 0), or the node's own name (older agents set it);
    any other (another node's name, claimed by this key) is squatting: refused."""
    return routing_id[:1] == b"\x00" or routing_id == node.encode()


class Transport:
    def __init__(self, settings: CollectorSettings, counters: Counters, *,
                 max_batch: int = MAX_BATCH, max_batch_read_s: float = MAX_BATCH_READ_S) -> None:
        self.settings, self.counters = settings, counters
        self.max_batch, self.max_batch_read_s = max_batch, max_batch_read_s
        self.log = get_logger(component="collector")
        self._rejects = LimitedLog(self.log)
        self.keys_dir = Path(settings.keys_dir)
        self._keys = keys.server_keys(self.keys_dir)
        self.allowed: dict[bytes, str] = keys.allowed_nodes(self.keys_dir)
        self._allow_stamp = self._nodes_dir_stamp()
        self.ctx = zmq.Context(io_threads=2)
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=str(self.keys_dir / keys.NODES_DIR))
        self.sock = self._socket(MAIN_IO)
        self.endpoint = ""  # once ``listen`` has bound it
        self.events_sock: zmq.Socket[Any] | None = None  # once bound (None: off, or not bindable)
        self.events_endpoint = ""
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self.liveness = Liveness(settings.heartbeat_s, settings.unreachable_after)
        # node -> routing id its authenticated key (not a claimed id) last spoke from: its route
        self.routes: dict[str, bytes] = {}
        self._next_reload = time.monotonic() + ALLOW_LIST_RELOAD_S
        self._reload_requested = self._closed = False

    def _socket(self, io_thread: int) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.curve_server, (sock.curve_publickey, sock.curve_secretkey) = True, self._keys
        # No ZMTP heartbeats: the kernel's TCP keepalive finds dead peers.
        for option, value in ((zmq.AFFINITY, io_thread), (zmq.ROUTER_MANDATORY, 1),
                              (zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME), (zmq.RCVHWM, RCVHWM),
                              (zmq.SNDHWM, SNDHWM), (zmq.LINGER, 0), (zmq.TCP_KEEPALIVE, 1),
                              (zmq.TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_IDLE),
                              (zmq.TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_INTVL),
                              (zmq.TCP_KEEPALIVE_CNT, TCP_KEEPALIVE_CNT)):
            sock.setsockopt(option, value)
        return sock

    def listen(self) -> str:
        """Bind ``settings.bind`` (and the events socket) once the handler is ready; returns
        the endpoint. CollectorError (and closed) when it cannot bind."""
        try:
            self.sock.bind(self.settings.bind)
        except zmq.ZMQError as exc:
            self.close()
            raise CollectorError(f"cannot bind {self.settings.bind}: {exc}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._listen_events()
        return self.endpoint

    def _listen_events(self) -> None:
        """Bind the events socket; a failure is logged: events then come with the reports."""
        bind = self.settings.events_endpoint(self.settings.bind)
        if bind is None:
            return
        sock = self._socket(EVENTS_IO)
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self.log.warning("events_port_unavailable", bind=bind, error=str(exc),
                             hint="events and command results go with the reports (slower "
                                  "during a backlog); free the port or set [collector] events_port")
            return
        self.events_sock = sock
        self.events_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller.register(sock, zmq.POLLIN)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in (self.sock, self.events_sock):
            if sock is not None:
                sock.close(linger=0)
        self.auth.stop()
        self.ctx.term()

    def request_reload(self) -> None:
        """Reload the allow-list at the next ``tick`` (signal-safe)."""
        self._reload_requested = True

    # ------------------------------------------------------------------ receiving

    def receive(self, handler: Handler, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for frames, then handle a loop turn; returns frames read."""
        if not self._poller.poll(timeout_ms):
            return 0
        # A batch is many short-lived, acyclic objects (decoded msgpack): reference
        # counting frees them, the cyclic GC would only traverse them over and over.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._turn(handler)
        finally:
            if was_enabled:
                gc.enable()

    def _turn(self, handler: Handler) -> int:
        now = time.time()
        batch: Batch = []
        to_ack: list[AckItem] = []
        handled = self._read_batch(batch, to_ack, now)
        events: Batch = []
        event_acks: list[AckItem] = []
        handled += self._take_events(events, event_acks, now)
        if (events or event_acks) and not self._commit(handler, events, event_acks, now):
            return handled  # the store failed: nothing is acked, the agents resend
        self._commit(handler, batch, to_ack, now)
        return handled

    def _read_batch(self, batch: Batch, to_ack: list[AckItem], now: float) -> int:
        """Read the main socket into ``batch``; when that leaves room, wait out
        ``max_batch_read_s`` (unless events come) and read it again."""
        until = time.monotonic() + self.max_batch_read_s
        handled = self._read(self.sock, batch, to_ack, now, 0)
        if handled < self.max_batch and len(batch) < self.max_batch and not self._events_waiting(until):
            handled = self._read(self.sock, batch, to_ack, now, handled)
        return handled

    def _read(self, sock: zmq.Socket[Any], batch: Batch, to_ack: list[AckItem], now: float, handled: int) -> int:
        """Read what ``sock`` has into ``batch`` until it is full (from the main socket: or
        until events wait); returns the frames read, ``handled`` included."""
        main, size = sock is self.sock, sum(len(body) for _, _, body in batch)
        limit = self.max_batch if main else MAX_EVENTS_PER_BATCH
        while handled < limit and len(batch) < limit and size < MAX_BATCH_BYTES:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            handled += 1
            self._accept(parts, batch, to_ack, now, None if main else sock)
            size += len(parts[-1])
            if main and handled % EVENTS_PEEK_EVERY == 0 and self._events_waiting():
                break
        return handled

    def _events_waiting(self, until: float = 0.0) -> bool:
        """Whether events wait, waiting for them until ``until`` (monotonic)."""
        left_ms = max(0, int((until - time.monotonic()) * 1000))
        if self.events_sock is None:
            time.sleep(left_ms / 1000)
            return False
        return bool(self.events_sock.poll(left_ms))

    def _commit(self, handler: Handler, batch: Batch, to_ack: list[AckItem], now: float) -> bool:
        """Store, ack, hand to ``handler.acked``; False: the store failed (nothing acked)."""
        if not batch:
            self._send_acks(to_ack)  # rejected messages only
            return True
        self.counters.batches += 1
        stored = handler.commit(batch, now)
        if stored is None:
            return False
        new, refused = stored
        if refused:
            to_ack[:] = [(s, r, n, e, q, rej or (n, e, q) in refused) for s, r, n, e, q, rej in to_ack]
        self.counters.stored += len(new)
        self.counters.duplicates += sum(1 for item in to_ack if not item[5]) - len(new)
        self.liveness.stored(new)
        self._send_acks(to_ack)
        if new:
            handler.acked(batch, new, now)
        return True

    def _take_events(self, batch: Batch, to_ack: list[AckItem], now: float) -> int:
        return 0 if self.events_sock is None else self._read(self.events_sock, batch, to_ack, now, 0)

    def _accept(self, parts: list[Any], batch: Batch, to_ack: list[AckItem], now: float,
                sock: zmq.Socket[Any] | None = None) -> None:
        """Check and decode a message into ``batch``; ``sock``: the events socket, or None."""
        self.counters.received += 1
        sender = self._sender(parts)
        if sender is None:
            return
        routing_id, node = sender
        decoded = self._decode(parts[1].bytes, node, routing_id, to_ack, sock or self.sock)
        if decoded is None:
            return
        env, body = decoded
        if not _routing_id_ok(routing_id, node):
            self._reject("routing_mismatch", node=node, routing_id=routing_id.decode("utf-8", "replace")[:64])
        elif sock is not None and env.type not in URGENT:  # (unacked: it comes again on the main socket)
            self._reject("unexpected_type", node=node, type=env.type, socket="events")
        elif sock is not None:
            self.liveness.seen[node] = now
            batch.append((node, env, body))
            to_ack.append((sock, routing_id, node, env.epoch, env.seq, False))
        elif env.type == wire.HEARTBEAT:
            self._heartbeat_from(node, routing_id, env, now)
        elif env.type not in wire.ACKED and env.type != wire.BUNDLE:
            self.routes[node] = routing_id
            self._reject("unexpected_type", node=node, type=env.type)
        else:
            self.routes[node] = routing_id  # commands follow the authenticated key, not a claimed id
            self.liveness.seen[node] = now
            if env.type == wire.BUNDLE:
                self._unbundle(env.body["frames"], node, routing_id, batch, to_ack)
            else:
                self._take(batch, to_ack, routing_id, node, env, body)

    def _sender(self, parts: list[Any]) -> tuple[bytes, str] | None:
        """(routing id, node) of a two-frame message from an allow-listed key; None: refused."""
        if len(parts) != 2:
            self._reject("frames", frames=len(parts))
            return None
        try:
            user = parts[1].get("User-Id")
        except (zmq.ZMQError, KeyError):
            user = None
        node = self.allowed.get(user.encode("ascii", "replace")) if isinstance(user, str) else None
        if node is None:
            self._reject("unknown_key", key=keys.fingerprint(user.encode()) if user else None)
            return None
        if len(parts[1]) > MAX_FRAME:
            self._reject("oversized", node=node, size=len(parts[1]))
            return None
        return parts[0].bytes, node

    def _heartbeat_from(self, node: str, routing_id: bytes, env: Envelope, now: float) -> None:
        """Noted in memory (stored by ``tick``). A probe (`slurmgpu doctor`, another
        socket) is answered at once and leaves the node's route to its agent."""
        if env.body.get("probe") is True:
            self.counters.probes_answered += 1
            self._send(routing_id, wire.reply_heartbeat_frame(node))
            return
        self.routes[node] = routing_id
        self.counters.heartbeats_received += 1
        self.liveness.heartbeat_from(node, now)

    def _take(self, batch: Batch, to_ack: list[AckItem], routing_id: bytes, node: str, env: Envelope,
              body: bytes) -> None:
        batch.append((node, env, body))
        to_ack.append((self.sock, routing_id, node, env.epoch, env.seq, False))

    def _decode(self, data: bytes, node: str, routing_id: bytes, to_ack: list[AckItem],
                sock: zmq.Socket[Any]) -> tuple[Envelope, bytes] | None:
        """``data`` decoded (``wire.decode_received``) if it is ``node``'s valid frame; None:
        refused (a bad body of an acked type is acked as rejected)."""
        try:
            decoded = wire.decode_received(data)
        except wire.BodyError as exc:
            self._reject("malformed", node=node, error=str(exc))
            self._ack_rejected(exc.envelope, node, routing_id, to_ack, sock)
            return None
        except wire.WireError as exc:
            self._reject("version" if "protocol version" in str(exc) else "malformed", node=node, error=str(exc))
            return None
        if decoded[0].node != node:
            self._reject("node_mismatch", node=node, claimed=decoded[0].node)
            return None
        return decoded

    def _unbundle(self, frames: list[bytes], node: str, routing_id: bytes, batch: Batch,
                  to_ack: list[AckItem]) -> None:
        """A bundle's frames, each checked as if it came alone; acked types only."""
        self.counters.bundles += 1
        self.counters.bundled += len(frames)
        for data in frames:
            decoded = self._decode(data, node, routing_id, to_ack, self.sock)
            if decoded is not None and decoded[0].type not in wire.ACKED:
                self._reject("unexpected_type", node=node, type=decoded[0].type, bundled=True)
            elif decoded is not None:
                self._take(batch, to_ack, routing_id, node, *decoded)

    def _ack_rejected(self, env: Envelope, node: str, routing_id: bytes, to_ack: list[AckItem],
                      sock: zmq.Socket[Any]) -> None:
        """Ack the node's own acked-type message refused: the agent drops it."""
        if env.node == node and _routing_id_ok(routing_id, node) and env.type in wire.ACKED:
            to_ack.append((sock, routing_id, node, env.epoch, env.seq, True))

    def _reject(self, reason: str, **detail: Any) -> None:
        self.counters.rejected[reason] += 1
        self._rejects.warning("message_rejected", reason=reason, **detail)

    # ------------------------------------------------------------------ sending

    def _send_acks(self, to_ack: list[AckItem]) -> None:
        """One ack per peer and epoch; a seq both rejected and stored is acked as stored."""
        per_peer: dict[tuple[zmq.Socket[Any], bytes, str], tuple[str, dict[int, bool]]] = {}
        for sock, routing_id, node, epoch, seq, rejected in to_ack:
            seqs = per_peer.setdefault((sock, routing_id, epoch), (node, {}))[1]
            seqs[seq] = seqs.get(seq, True) and rejected
        bundle = self.settings.bundle  # (the acks built first, then sent back to back)
        acks = [(sock, routing_id, node, wire.ack_frame(node, list(seqs), epoch=epoch, bundle=bundle,
                                                        rejected=[q for q, rej in seqs.items() if rej] or None))
                for (sock, routing_id, epoch), (node, seqs) in per_peer.items()]
        mono, sent = time.monotonic(), 0
        for sock, routing_id, node, frame in acks:
            if self._send(routing_id, frame, sock):
                sent += 1
                if sock is self.sock:  # a sign of life on the agent's main connection
                    self.liveness.answered[node] = mono
        self.counters.acks_sent += sent
        self.counters.acks_failed += len(per_peer) - sent

    def _send(self, routing_id: bytes, frame: bytes, sock: zmq.Socket[Any] | None = None) -> bool:
        """Send a frame to a peer without blocking; False when it is gone (EHOSTUNREACH) or
        its queue is full (EAGAIN): a ROUTER refuses the routing id then."""
        sock = sock or self.sock
        try:
            sock.send(routing_id, zmq.SNDMORE | zmq.NOBLOCK)
            sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def send_command(self, node: str, command: str, args: dict[str, Any] | None = None, *,
                     command_id: str | None = None) -> str:
        """Send a command to a connected node; returns its id (the result's ``command_id``)."""
        command_id = command_id or uuid.uuid4().hex
        route = self.routes.get(node)
        if route is None or not self._send(route, wire.command_frame(node, command, args, id=command_id)):
            raise CollectorError(f"node {node} is not connected (or its queue is full)")
        self.log.info("command_sent", node=node, command=command, command_id=command_id)
        return command_id

    # ------------------------------------------------------------------ periodic

    def tick(self, handler: Handler) -> None:
        """Periodic work: the allow-list reload and the heartbeats."""
        mono = time.monotonic()
        if self._reload_requested or mono >= self._next_reload:
            force, self._reload_requested = self._reload_requested, False
            self._next_reload = mono + ALLOW_LIST_RELOAD_S
            self.reload_allow_list(handler, force=force)
        self.liveness.start_interval(mono)
        if self.liveness.handing:
            self.liveness.hand_over(handler.heard)
        self._heartbeat(mono)

    def _heartbeat(self, mono: float) -> None:
        for node in self.liveness.to_heartbeat(mono):
            route = self.routes.get(node)
            if route is not None and self._send(route, wire.reply_heartbeat_frame(node)):
                self.counters.heartbeats_sent += 1
                self.liveness.answered[node] = mono

    def _nodes_dir_stamp(self) -> int | None:
        try:
            return os.stat(self.keys_dir / keys.NODES_DIR).st_mtime_ns
        except OSError:
            return None

    def reload_allow_list(self, handler: Handler, *, force: bool = True) -> bool:
        """Re-read the allow-list (and ZAP) if it changed or ``force``; a broken one keeps
        the previous (logged). Returns True if reloaded."""
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
        added, removed = len(set(allowed) - set(self.allowed)), len(set(self.allowed) - set(allowed))
        self.allowed = allowed
        handler.allow_list_changed(allowed)
        self.log.info("allow_list_loaded", nodes=len(allowed), added=added, removed=removed)
        return True
