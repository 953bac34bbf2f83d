"""The collector's transport: a ZeroMQ ROUTER (a CURVE server; ZAP checks every
handshake against the allow-list, ``<keys_dir>/nodes/*.key``) that receives what agents
send, acks it once its ``Handler`` (``fleet.Fleet``) has stored it, heartbeats the nodes
it heard from, and sends them commands. A node's key speaks only for that node.

A batch is one ``Handler.commit``, then its acks, then ``Handler.acked``: a duplicate is
acked again, a bad body is acked as rejected, and nothing is acked when the store fails
(the agents resend). Events and command results go first: a second ROUTER on
``[collector] events_port`` is read before every batch and within it, and what comes
there is stored and acked ahead of the batch. Bundles (``wire.BUNDLE``) carry a
backlog; every ack offers a bundle size that keeps a round over the connections within
half the unreachable window. While the store holds bulk batches (``Handler.holding``)
only the events socket is read. Why each of these, and what it measured:
docs/architecture.md ("The collector's transport").

Single-threaded: every method, ``send_command`` too, runs on the collector loop's thread.
"""

from __future__ import annotations

import gc
import itertools
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from slurmgpu import keys
from slurmgpu.collector.bundles import BUNDLE_ROUND_SHARE, BundleOffer
from slurmgpu.collector.counters import Counters, LimitedLog
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.errors import SlurmGpuError
from slurmgpu.log import get_logger
from slurmgpu.wire import (
    ACKED,
    BUNDLE,
    COMMAND_RESULT,
    EVENT,
    HEARTBEAT,
    MAX_FRAME,
    BodyError,
    Envelope,
    WireError,
    ack_frame,
    command_frame,
    decode_received,
    reply_heartbeat_frame,
)

# Constants: their reasons and measurements are in docs/architecture.md.
MAX_BATCH = 256  # messages a batch (one transaction, then its acks)
MAX_BATCH_POSTGRES = 1000
ALLOW_LIST_RELOAD_S = 30.0
TRANSPORT_MAX_FRAME = 4 * MAX_FRAME  # libzmq drops a peer sending more; above MAX_FRAME: "oversized"
RCVHWM = 64  # frames queued per connection before TCP backpressure
SNDHWM = 100_000  # acks and commands; a ROUTER drops at the limit
TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_CNT = 60, 10, 6  # dead peers, by the kernel
MAX_BATCH_BYTES = 32 * MAX_FRAME  # a batch ends past this, or past this from one peer:
MAX_PEER_BATCH_BYTES = 2 * MAX_FRAME
URGENT = frozenset({EVENT, COMMAND_RESULT})  # a batch ends right after one (once per URGENT_EVERY_S)
URGENT_EVERY_S = 0.02
MAX_BATCH_READ_S = 0.01  # a batch stops reading after this long
MAX_BATCH_READ_S_POSTGRES = 0.05
EVENTS_POLL_EVERY = 16  # frames between looks at the events socket within a batch
MAX_EVENTS_PER_BATCH = 256
HELD_POLL_MS = 2  # while the store holds bulk batches: the events socket, this long at a time
MAIN_IO, EVENTS_IO = 1, 2  # zmq I/O threads of the main and the events socket
HEARD_PER_TURN = 256  # per loop turn: heard nodes recorded,
HEARTBEATS_PER_TURN = 1000  # and heartbeats sent

# An acked-type message to acknowledge: (socket, routing id, node, epoch, seq, rejected).
AckItem = tuple["zmq.Socket[Any]", bytes, str, str, int, bool]
# The accepted messages of one batch: (authenticated node, envelope, frame bytes).
Batch = list[tuple[str, Envelope, bytes]]


class CollectorError(SlurmGpuError):
    """The collector could not start or could not deliver a command."""


class Stored(NamedTuple):
    """What ``Handler.commit`` made of a batch: the (node, seq) newly stored, and the
    (node, epoch, seq) of messages refused for good (acked as rejected)."""

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
        """Nodes heard from by heartbeat since the last call (at most once per
        ``heartbeat_s``); False: not recorded, hand them over again next time."""

    def holding(self) -> bool:
        """Whether bulk batches wait now (``Store.wal_holding``): only the events socket
        is read meanwhile."""


def _routing_id_ok(routing_id: bytes, node: str) -> bool:
    """A message's routing id is the node's own name (agents before issue 12 set it) or
    one ZeroMQ generated for the connection (first byte 0; current agents set none). Any
    other id, e.g. another node's name claimed by this key, is squatting: refused."""
    return routing_id == node.encode() or routing_id[:1] == b"\x00"


class Transport:
    def __init__(self, settings: CollectorSettings, counters: Counters, *,
                 max_batch: int = MAX_BATCH, max_batch_read_s: float = MAX_BATCH_READ_S) -> None:
        self.settings = settings
        self.counters = counters
        self.max_batch = max_batch
        self.max_batch_read_s = max_batch_read_s
        self.log = get_logger(component="collector")
        self._rejects = LimitedLog(self.log)
        self.keys_dir = Path(settings.keys_dir)
        public, secret = keys.server_keys(self.keys_dir)
        self.allowed: dict[bytes, str] = keys.allowed_nodes(self.keys_dir)
        self.bundles = BundleOffer(settings.unreachable_after * settings.heartbeat_s / BUNDLE_ROUND_SHARE,
                                   time.monotonic())
        self._allow_stamp = self._nodes_dir_stamp()
        self.ctx = zmq.Context(io_threads=2)
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=str(self.keys_dir / keys.NODES_DIR))
        self.sock = self._socket(public, secret, MAIN_IO)
        self.endpoint = ""  # once ``listen`` has bound it
        # The events socket, once ``listen`` has bound it (None: off, or not bindable).
        self.events_sock: zmq.Socket[Any] | None = None
        self.events_endpoint = ""
        self._keys = (public, secret)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        now = time.monotonic()
        self.seen: dict[str, float] = {}  # node -> wall time last heard (this process)
        self.heard: set[str] = set()  # heard by heartbeat since the last Handler.heard
        self.answered: dict[str, float] = {}  # node -> monotonic time of its last ack
        # node -> routing id its authenticated key last spoke from: where its commands and
        # heartbeats go (a routing id is the client's claim; the key is not)
        self.routes: dict[str, bytes] = {}
        self._next_urgent = 0.0  # (monotonic) when a batch may end early for an event again
        self._handing = False  # heard nodes are being handed over, HEARD_PER_TURN a turn
        self._events_only = False  # the last batch was the events socket's alone
        self._due: list[str] = []  # nodes still to heartbeat this interval
        self._next_heartbeat = now + settings.heartbeat_s
        self._next_reload = now + ALLOW_LIST_RELOAD_S
        self._reload_requested = False
        self._closed = False
        self._offer_bundles(now)

    def _socket(self, public: bytes, secret: bytes, io_thread: int) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.AFFINITY, io_thread)
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.LINGER, 0)
        # No ZMTP heartbeats (see the module's docstring): the kernel finds dead peers.
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_IDLE)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_INTVL)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, TCP_KEEPALIVE_CNT)
        return sock

    def listen(self) -> str:
        """Bind ``settings.bind``: agents connect from now on, so call it once what handles
        their messages is ready (they take a silent collector for an unreachable one).
        Returns the endpoint. CollectorError (and closed) when it cannot bind."""
        try:
            self.sock.bind(self.settings.bind)
        except zmq.ZMQError as exc:
            self.close()
            raise CollectorError(f"cannot bind {self.settings.bind}: {exc}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._listen_events()
        return self.endpoint

    def _listen_events(self) -> None:
        """Bind the events socket, if there is one to bind; a failure is logged, not fatal:
        events then come with the reports, later but not lost."""
        bind = self.settings.events_endpoint(self.settings.bind)
        if bind is None:
            return
        sock = self._socket(*self._keys, EVENTS_IO)
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
        self.sock.close(linger=0)
        if self.events_sock is not None:
            self.events_sock.close(linger=0)
        self.auth.stop()
        self.ctx.term()

    def request_reload(self) -> None:
        """Reload the allow-list at the next ``tick`` (signal-safe)."""
        self._reload_requested = True

    # ------------------------------------------------------------------ receiving

    def receive(self, handler: Handler, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for frames, handle up to ``max_batch`` of them (one
        ``handler.commit``, then the acks, then ``handler.acked``). Returns frames handled."""
        if handler.holding():
            return self._events_while_held(handler, timeout_ms)
        if not self._poller.poll(timeout_ms):
            return 0
        # A batch is ~100k short-lived, acyclic objects (decoded msgpack): the cyclic GC
        # would traverse them over and over (it nearly halves throughput). Reference
        # counting frees them; the GC runs again between batches.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._drain_batch(handler)
        finally:
            if was_enabled:
                gc.enable()

    def _drain_batch(self, handler: Handler) -> int:
        batch: Batch = []
        to_ack: list[AckItem] = []
        size = 0
        per_peer: dict[bytes, int] = {}
        sock = self.sock
        now = time.time()
        # Events waiting: this batch is them alone, committed and acked at once. Not twice in
        # a row, so a flood there (a node sending nothing but events) cannot starve the
        # reports: the batch after one of events alone reads the main socket only (it ends
        # within MAX_BATCH_READ_S); the others look at the events every EVENTS_POLL_EVERY frames.
        after_events = self._events_only
        events = handled = 0 if after_events else self._take_events(batch, to_ack, now)
        self._events_only = bool(events)
        read_until = time.monotonic() + self.max_batch_read_s
        work, next_poll = 0, EVENTS_POLL_EVERY  # messages and other frames read, for the events socket
        urgent: Batch = []  # events taken while reading: committed and acked first
        urgent_acks: list[AckItem] = []
        while not events and handled < self.max_batch and len(batch) < self.max_batch and size < MAX_BATCH_BYTES:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            handled += 1
            accepted = len(batch)
            self._accept(parts, batch, to_ack, now)
            frame_size = len(parts[-1])
            size += frame_size
            peer = parts[0].bytes
            peer_size = per_peer[peer] = per_peer.get(peer, 0) + frame_size
            if peer_size >= MAX_PEER_BATCH_BYTES or (len(batch) > accepted and self._urgent(batch, accepted)):
                break
            work += max(1, len(batch) - accepted)  # (a bundle: its messages)
            if not after_events and work >= next_poll:
                next_poll = work + EVENTS_POLL_EVERY
                events = self._take_events(urgent, urgent_acks, now)
                handled += events
                if events or time.monotonic() >= read_until:
                    break
        if urgent and not self._commit(handler, urgent, urgent_acks, now):
            return handled  # the store failed: nothing is acked, the agents resend
        self._commit(handler, batch, to_ack, now)
        return handled

    def _commit(self, handler: Handler, batch: Batch, to_ack: list[AckItem], now: float) -> bool:
        """Store ``batch`` (one ``handler.commit``), then send ``to_ack``'s acks and hand
        the batch to ``handler.acked``. False: the store failed (nothing acked)."""
        if not batch:
            self._send_acks(to_ack)  # rejected messages only
            return True
        self.bundles.busy += len(batch)
        self.counters.batches += 1
        stored = handler.commit(batch, now)
        if stored is None:
            return False  # the store failed: nothing is acked, the agents resend
        new, refused = stored
        if refused:
            to_ack[:] = [(s, r, n, e, q, rej or (n, e, q) in refused) for s, r, n, e, q, rej in to_ack]
        self.counters.stored += len(new)
        self.counters.duplicates += sum(1 for item in to_ack if not item[5]) - len(new)
        self._no_longer_heard(new)
        self._send_acks(to_ack)
        if new:
            handler.acked(batch, new, now)
        return True

    def _events_while_held(self, handler: Handler, timeout_ms: int) -> int:
        """While the store holds bulk batches: the events socket alone (waited on for up
        to HELD_POLL_MS), its messages stored and acked at once; returns frames handled."""
        wait_ms = min(timeout_ms, HELD_POLL_MS)
        sock = self.events_sock
        if sock is None:  # (no events port: events come with the reports, and wait)
            time.sleep(wait_ms / 1000)
            return 0
        if not sock.poll(wait_ms):
            return 0
        batch: Batch = []
        to_ack: list[AckItem] = []
        now = time.time()
        taken = self._take_events(batch, to_ack, now)
        self._commit(handler, batch, to_ack, now)
        return taken

    def _take_events(self, batch: Batch, to_ack: list[AckItem], now: float) -> int:
        """Read what the events socket has (at most MAX_EVENTS_PER_BATCH frames) into the
        batch; returns the number of frames read."""
        sock = self.events_sock
        if sock is None:
            return 0
        taken = 0
        while taken < MAX_EVENTS_PER_BATCH:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            taken += 1
            self._accept(parts, batch, to_ack, now, sock)
        return taken

    def _no_longer_heard(self, new: list[tuple[str, int]]) -> None:
        """Nodes whose messages a batch stored have their last-seen time written by it: a
        heartbeat heard from them before needs no write of its own (at 10,000 nodes
        draining a backlog, 2,000 heartbeats a second, ~20 us each)."""
        if self.heard and new:
            self.heard.difference_update([node for node, _ in new])

    def _urgent(self, batch: Batch, start: int) -> bool:
        """Whether the batch ends after the frame that brought ``batch[start:]`` (one
        message, or a bundle's): it had an ``URGENT`` one."""
        if not any(env.type in URGENT for _, env, _ in batch[start:]):
            return False
        mono = time.monotonic()
        if mono < self._next_urgent:
            return False
        self._next_urgent = mono + URGENT_EVERY_S
        return True

    def _accept(self, parts: list[Any], batch: Batch, to_ack: list[AckItem], now: float,
                sock: zmq.Socket[Any] | None = None) -> None:
        """Check and decode one received message into ``batch`` (and ``to_ack``); ``sock``:
        the events socket it came from (None: the main socket)."""
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
        decoded = self._decode(data, node, routing_id, to_ack, sock or self.sock)
        if decoded is None:
            return
        env, body = decoded
        # (_routing_id_ok, the common case first: an id ZeroMQ generated)
        if routing_id[:1] != b"\x00" and routing_id != node.encode():
            self._reject("routing_mismatch", node=node,
                         routing_id=routing_id.decode("utf-8", "replace")[:64])
            return
        if sock is not None:
            if env.type not in URGENT:  # not acked: the agent sends it again on the main socket
                self._reject("unexpected_type", node=node, type=env.type, socket="events")
                return
            self.seen[node] = now
            batch.append((node, env, body))
            to_ack.append((sock, routing_id, node, env.epoch, env.seq, False))
            return
        mtype = env.type
        if mtype == HEARTBEAT:
            if env.body.get("probe") is True:
                # `slurmgpu doctor` checking this node's key from another socket: answer at
                # once, and leave the node's route and last-seen time to its agent.
                self.counters.probes_answered += 1
                self._send(routing_id, reply_heartbeat_frame(node))
                return
            self.routes[node] = routing_id  # commands follow the authenticated key, not a claimed id
            # in memory only: stored once per interval (tick)
            self.counters.heartbeats_received += 1
            self.seen[node] = now
            self.heard.add(node)
            return
        self.routes[node] = routing_id
        if mtype == BUNDLE:
            self.seen[node] = now
            self._unbundle(env.body["frames"], node, routing_id, batch, to_ack)
            return
        if mtype not in ACKED:
            self._reject("unexpected_type", node=node, type=mtype)
            return
        self.seen[node] = now
        batch.append((node, env, body))
        to_ack.append((self.sock, routing_id, node, env.epoch, env.seq, False))

    def _decode(self, data: bytes, node: str, routing_id: bytes, to_ack: list[AckItem],
                sock: zmq.Socket[Any]) -> tuple[Envelope, bytes] | None:
        """``data`` decoded, with its body's bytes as received (``wire.decode_received``), if it is a
        valid frame of the authenticated ``node``'s (None: refused, counted and logged; a
        bad body of an acked type is acked as rejected)."""
        try:
            decoded = decode_received(data)
        except BodyError as exc:
            self._reject("malformed", node=node, error=str(exc))
            self._ack_rejected(exc.envelope, node, routing_id, to_ack, sock)
            return None
        except WireError as exc:
            reason = "version" if "protocol version" in str(exc) else "malformed"
            self._reject(reason, node=node, error=str(exc))
            return None
        if decoded[0].node != node:
            self._reject("node_mismatch", node=node, claimed=decoded[0].node)
            return None
        return decoded

    def _unbundle(self, frames: list[bytes], node: str, routing_id: bytes, batch: Batch,
                  to_ack: list[AckItem]) -> None:
        """A bundle's frames (``wire.BUNDLE``: a backlog), each checked as if it came
        alone from the same connection; only acked types (no heartbeat, no bundle in a
        bundle)."""
        self.counters.bundles += 1
        self.counters.bundled += len(frames)
        for data in frames:
            decoded = self._decode(data, node, routing_id, to_ack, self.sock)
            if decoded is None:
                continue
            env = decoded[0]
            if env.type not in ACKED:
                self._reject("unexpected_type", node=node, type=env.type, bundled=True)
                continue
            batch.append((node, env, decoded[1]))
            to_ack.append((self.sock, routing_id, node, env.epoch, env.seq, False))

    def _ack_rejected(self, env: Envelope, node: str, routing_id: bytes, to_ack: list[AckItem],
                      sock: zmq.Socket[Any]) -> None:
        """Ack a message whose body was refused, if it is the authenticated node's own
        acked-type message: the agent drops it instead of resending it forever."""
        if env.node == node and _routing_id_ok(routing_id, node) and env.type in ACKED:
            to_ack.append((sock, routing_id, node, env.epoch, env.seq, True))

    def _reject(self, reason: str, **detail: Any) -> None:
        self.counters.rejected[reason] += 1
        self._rejects.warning("message_rejected", reason=reason, **detail)

    # ------------------------------------------------------------------ sending

    def _send_acks(self, to_ack: list[AckItem]) -> None:
        """One ack per peer and epoch. A seq both rejected and stored in this batch (a
        bad copy and a good one) is acked as stored."""
        per_peer: dict[tuple[zmq.Socket[Any], bytes, str], tuple[str, dict[int, bool]]] = {}
        for sock, routing_id, node, epoch, seq, rejected in to_ack:
            peer = per_peer.get((sock, routing_id, epoch))
            if peer is None:
                per_peer[(sock, routing_id, epoch)] = (node, {seq: rejected})
            else:
                seqs = peer[1]
                seqs[seq] = seqs.get(seq, True) and rejected
        answered, send, main, bundle = self.answered, self._send, self.sock, self.bundles.offer
        mono = time.monotonic()
        sent = failed = 0
        for (sock, routing_id, epoch), (node, seqs) in per_peer.items():
            refused = [q for q, rejected in seqs.items() if rejected] if True in seqs.values() else None
            if send(routing_id, ack_frame(node, list(seqs), epoch=epoch, rejected=refused, bundle=bundle), sock):
                sent += 1
                if sock is main:  # a sign of life on the agent's main connection
                    answered[node] = mono
            else:
                failed += 1
        self.counters.acks_sent += sent
        self.counters.acks_failed += failed

    def _send(self, routing_id: bytes, frame: bytes, sock: zmq.Socket[Any] | None = None) -> bool:
        """Send a frame to a peer without blocking; False when it is gone or its queue is full."""
        try:
            (sock or self.sock).send_multipart((routing_id, frame), zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (gone) or EAGAIN (its queue is full)
            return False

    def send_command(self, node: str, command: str, args: dict[str, Any] | None = None, *,
                     command_id: str | None = None) -> str:
        """Send a command to a connected node; returns the command id (the envelope id,
        echoed as ``command_id`` in the command-result; a new one unless given)."""
        command_id = command_id or uuid.uuid4().hex
        route = self.routes.get(node)
        if route is None or not self._send(route, command_frame(node, command, args, id=command_id)):
            raise CollectorError(f"node {node} is not connected (or its queue is full)")
        self.log.info("command_sent", node=node, command=command, command_id=command_id)
        return command_id

    # ------------------------------------------------------------------ periodic

    def tick(self, handler: Handler) -> None:
        """The transport's periodic work: the allow-list reload (every ALLOW_LIST_RELOAD_S,
        or when requested) and the heartbeats to the nodes heard from recently."""
        mono = time.monotonic()
        if self._reload_requested or mono >= self._next_reload:
            force = self._reload_requested
            self._reload_requested = False
            self._next_reload = mono + ALLOW_LIST_RELOAD_S
            self.reload_allow_list(handler, force=force)
        if mono >= self._next_heartbeat:
            self._next_heartbeat = mono + self.settings.heartbeat_s
            self._handing = True
            self._due = self._heartbeats_due()
        if self._handing:
            self._hand_over_heard(handler)
        if self._due:
            self._heartbeat()
        if mono >= self.bundles.next_at:
            self._offer_bundles(mono)

    def _offer_bundles(self, mono: float) -> None:
        """The bundle size the acks offer from now on (``BundleOffer``), for the nodes
        heard within the unreachable window (the allow-list before any)."""
        self.bundles.update(mono, len(self.seen) or len(self.allowed))

    def _hand_over_heard(self, handler: Handler) -> None:
        """Up to HEARD_PER_TURN of the nodes heard by heartbeat since the last time, to the
        handler; the rest at the next turns. When it could not record them they are kept
        for the next interval."""
        if len(self.heard) <= HEARD_PER_TURN:
            chunk = self.heard
        else:
            chunk = set(itertools.islice(self.heard, HEARD_PER_TURN))
        if not chunk or not handler.heard(chunk, time.time()):
            self._handing = False
            return
        if chunk is self.heard:
            self.heard = set()
            self._handing = False
        else:
            self.heard -= chunk

    def _heartbeats_due(self) -> list[str]:
        """The nodes heard from within ``unreachable_after`` intervals (the others are
        forgotten), for ``_heartbeat``."""
        now = time.time()
        window = self.settings.unreachable_after * self.settings.heartbeat_s
        gone = [node for node, seen in self.seen.items() if now - seen > window]
        for node in gone:
            del self.seen[node]
            self.answered.pop(node, None)
        return list(self.seen)

    def _heartbeat(self) -> None:
        """Heartbeat the next HEARTBEATS_PER_TURN due nodes, but not those acked within the
        last interval."""
        mono = time.monotonic()
        answered, routes, frame = self.answered, self.routes, reply_heartbeat_frame
        due, self._due = self._due[:HEARTBEATS_PER_TURN], self._due[HEARTBEATS_PER_TURN:]
        for node in due:
            if mono - answered.get(node, -1e9) < self.settings.heartbeat_s:
                continue
            route = routes.get(node)
            if route is not None and self._send(route, frame(node)):
                self.counters.heartbeats_sent += 1

    def _nodes_dir_stamp(self) -> int | None:
        try:
            return os.stat(self.keys_dir / keys.NODES_DIR).st_mtime_ns
        except OSError:
            return None

    def reload_allow_list(self, handler: Handler, *, force: bool = True) -> bool:
        """Re-read the allow-list (and re-configure ZAP) if it changed or ``force``, and
        tell ``handler``. A broken allow-list keeps the previous one (logged). Returns True
        if reloaded."""
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
        handler.allow_list_changed(allowed)
        self.log.info("allow_list_loaded", nodes=len(allowed), added=added, removed=removed)
        return True
