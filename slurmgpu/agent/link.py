"""The agent's link to the collector: one zmq DEALER (CURVE client), one thread. It sends
what the spool holds, oldest first, deletes what the collector acked, heartbeats once
``heartbeat_s`` passed with nothing sent, fails over between ``[collector] address``
entries, sends events on the events port once its handshake is done, and bundles a
backlog when the collector's acks offer it.

Design notes: docs/design-notes.md (``slurmgpu/agent/link.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from slurmgpu import wire
from slurmgpu.agent.spool import Spool
from slurmgpu.config.schema import with_port
from slurmgpu.log import get_logger

SILENT_HEARTBEATS = 3
BATCH = 200
# Frames sent on this connection and not acked yet, at most: a backlog (the spool after
# an outage) goes out as acks come back, not all at once into zmq's queue, so a fresh
# event (sent first, URGENT) waits behind at most this many of its own node's frames.
WINDOW = 128
URGENT = (wire.EVENT, wire.COMMAND_RESULT)
# A full window and no ack for this many heartbeats (an ack lost while the collector
# still heartbeats): everything unacked is sent again (the collector dedupes).
STALL_HEARTBEATS = 6
# No heartbeat while frames sent on the main socket within this many heartbeat intervals
# are unacked: the collector reads a connection's frames in the order sent, so it would
# read the heartbeat only after them, and they are the same sign of life, sooner. (At
# 10,000 nodes draining a backlog, a heartbeat was one more message in every node's turn
# of the collector's round over the fleet: 2,000 a second to read, and the nodes' last
# seen times to write.) A frame that goes unanswered longer (refused, or lost with its
# collector) has the heartbeats back after that.
BUSY_HEARTBEATS = 2
# Events and command results unacked on the events socket, at most.
EVENTS_WINDOW = 32
# A bundle holds at most this many frames and this many bytes of them (a larger frame
# goes alone); at most what the collector's acks say it takes now.
BUNDLE_FRAMES = 32
BUNDLE_BYTES = 256 * 1024
# Frames in flight on the main socket: WINDOW for a collector that predates bundles (its
# acks say nothing of them); for one whose acks offer bundles of b frames, b (one bundle,
# or one frame when b is 1): what waits for this node at the collector is read in its
# next round over the fleet, and the next bundle is on its way with the ack, long before
# the round after. The collector then holds about a round's worth of reports however
# large the fleet (the offer shrinks as it grows), where WINDOW frames from each of
# 10,000 nodes were over a million frames queued. Until this connection's first ack,
# one frame.
BUNDLES_IN_FLIGHT = 1
MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

CommandHandler = Callable[[wire.Envelope], None]


class Link(threading.Thread):
    def __init__(self, *, addresses: Sequence[str], node: str, keys: tuple[bytes, bytes, bytes],
                 spool: Spool, heartbeat_s: float, on_command: CommandHandler,
                 on_connected: Callable[[], None] | None = None, events_port: int = 0) -> None:
        super().__init__(name="slurmgpu-link", daemon=True)
        if not addresses:
            raise ValueError("a link needs at least one collector address")
        self.addresses = list(addresses)
        self._at = 0  # index in addresses of the collector this link is on
        self.node = node
        self.public, self.secret, self.server = keys
        self.spool = spool
        self.heartbeat_s = heartbeat_s
        self.on_command = on_command
        self.on_connected = on_connected
        self.events_port = events_port  # 0: no events socket
        self.log = get_logger(component="link", node=node)
        self._halt = threading.Event()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._volatile: deque[bytes] = deque(maxlen=1000)  # frames the spool could not keep
        self._lock = threading.Lock()
        self._up = False
        self.sent_upto = 0
        self.reconnects = 0
        self.failovers = 0
        self.received = 0
        self.bad_frames = 0
        self.commands_failed = 0  # commands whose handler raised (logged; the link goes on)
        self.rejected = 0  # messages the collector refused for good (dropped)
        self.stale_acks = 0  # acks for another spool epoch (ignored)
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._last_rx = 0.0
        self._last_ack = 0.0
        self._blocked = False
        self._inflight: set[int] = set()  # seqs sent on this connection, not acked yet
        self._last_send = 0.0  # monotonic time a frame last went out on the main socket
        self._sent_at = 0.0  # ... anything (a heartbeat too): the next heartbeat waits for it
        self.heartbeats_sent = 0
        self.heartbeats_skipped = 0  # due while the main socket was busy (BUSY_HEARTBEATS)
        self._esock: zmq.Socket[Any] | None = None  # the events socket
        self._emonitor: zmq.Socket[Any] | None = None
        self._eup = False  # its handshake is done
        self._einflight: dict[int, float] = {}  # seq -> monotonic time sent on it, not acked yet
        self.events_sent = 0  # messages sent on the events socket
        # What this connection's collector said in its last ack: frames in flight, and in
        # a bundle, at most (None: no ack yet on this connection; 0: no bundles, WINDOW)
        self._offer: int | None = None
        self.bundles_sent = 0
        self.events_fallbacks = 0  # times its unacked messages went back to the main socket

    # ------------------------------------------------------------ other threads

    @property
    def address(self) -> str:
        """The collector this link is on (or trying)."""
        return self.addresses[self._at]

    @property
    def connected(self) -> bool:
        """The CURVE handshake is done and the collector was heard from (any frame, its
        heartbeats included) within SILENT_HEARTBEATS heartbeat intervals."""
        return self._up and time.monotonic() - self._last_rx <= SILENT_HEARTBEATS * self.heartbeat_s

    @property
    def events_up(self) -> bool:
        """The events socket's handshake is done: events and command results go there."""
        return self._eup

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wfd, b"x")

    def send_unspooled(self, frame: bytes) -> None:
        """Best effort, once: for a message the spool failed to store."""
        with self._lock:
            self._volatile.append(frame)
        self.wake()

    def stop(self) -> None:
        self._halt.set()
        self.wake()

    # ------------------------------------------------------------ the thread

    def run(self) -> None:
        self._ctx = zmq.Context()
        try:
            self._main()
        except Exception as exc:  # pragma: no cover - logged, the agent keeps polling
            self.log.exception("link_crashed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._close()
            self._ctx.term()
            for fd in (self._rfd, self._wfd):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _open(self) -> None:
        # No ROUTING_ID: the collector's ROUTER gives each connection its own, and routes
        # to this node by its authenticated key. (A name chosen here could be claimed by
        # another node's key first and lock this one out.)
        sock = self._dealer()
        self._monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        sock.connect(self.address)
        self._sock = sock
        self._up = False
        self._offer = None  # until this connection's collector says what it takes
        self._resend_all()
        self._last_rx = time.monotonic()
        self._open_events()

    def _dealer(self) -> zmq.Socket[Any]:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server
        return sock

    def _open_events(self) -> None:
        """The events socket, to the events port of the collector this link is on (none
        without an events port, or for an ipc:// address)."""
        endpoint = with_port(self.address, self.events_port) if self.events_port else None
        if endpoint is None:
            return
        sock = self._dealer()
        self._emonitor = sock.get_monitor_socket(MONITOR_EVENTS)
        sock.connect(endpoint)
        self._esock = sock
        self._eup = False

    def _close_events(self) -> None:
        _close_monitored(self._esock, self._emonitor)
        self._esock = self._emonitor = None
        self._eup = False
        self._events_back()

    def _events_back(self) -> None:
        """The events socket's unacked messages go back to the main socket (all unacked
        messages are resent there: they were skipped while in flight on the other one)."""
        if self._einflight:
            self._einflight.clear()
            self.events_fallbacks += 1
            self._resend_all()

    def _close(self) -> None:
        _close_monitored(self._sock, self._monitor)
        self._sock = self._monitor = None
        self._up = False
        self._close_events()

    def _main(self) -> None:
        self._open()
        next_heartbeat = time.monotonic()
        while not self._halt.is_set():
            assert self._sock is not None and self._monitor is not None
            poller = zmq.Poller()
            poller.register(self._sock, zmq.POLLIN | (zmq.POLLOUT if self._blocked else 0))
            poller.register(self._monitor, zmq.POLLIN)
            poller.register(self._rfd, zmq.POLLIN)
            if self._esock is not None and self._emonitor is not None:
                poller.register(self._esock, zmq.POLLIN)
                poller.register(self._emonitor, zmq.POLLIN)
            now = time.monotonic()
            timeout = max(0.0, min(self._heartbeat_at(next_heartbeat),
                                   self._last_rx + SILENT_HEARTBEATS * self.heartbeat_s) - now)
            ready = dict(poller.poll(int(timeout * 1000) + 1))
            if self._halt.is_set():
                return
            if self._rfd in ready:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._rfd, 4096)
            if self._monitor in ready:
                self._monitor_events()
            if ready.get(self._sock, 0) & zmq.POLLIN:
                self._receive(self._sock)
            if self._emonitor is not None and self._emonitor in ready:
                self._events_monitor()
            if self._esock is not None and ready.get(self._esock, 0) & zmq.POLLIN:
                self._receive(self._esock, main=False)
            now = time.monotonic()
            if now - self._last_rx > SILENT_HEARTBEATS * self.heartbeat_s:
                self._reconnect(silent_s=round(now - self._last_rx, 1))
                continue
            if self._eup:
                self._send_events()  # first: the main socket skips what is in flight there
            if self._up:
                self._flush()
            if now >= self._heartbeat_at(next_heartbeat):
                next_heartbeat = now + self.heartbeat_s
                if self._busy(now):
                    self.heartbeats_skipped += 1
                elif self._up and self._send(wire.heartbeat_frame(self.node)):
                    self.heartbeats_sent += 1

    def _heartbeat_at(self, next_heartbeat: float) -> float:
        """When a heartbeat is due: ``heartbeat_s`` after anything last went out on the main
        socket (any frame there is the same sign of life), and not before ``next_heartbeat``."""
        return max(next_heartbeat, self._sent_at + self.heartbeat_s)

    def _busy(self, now: float) -> bool:
        """Frames sent within BUSY_HEARTBEATS heartbeat intervals are unacked on the main
        socket: the collector hears of this node from them, no heartbeat needed."""
        return bool(self._inflight) and now - self._last_send < BUSY_HEARTBEATS * self.heartbeat_s

    def _reconnect(self, silent_s: float) -> None:
        """A new socket, to the next collector when there are several (one log line)."""
        if len(self.addresses) == 1:
            self.log.info("collector_silent_reconnecting", address=self.address,
                          silent_s=silent_s, connected=self._up)
        else:
            was = self.address
            self._at = (self._at + 1) % len(self.addresses)
            self.failovers += 1
            self.log.warning("collector_failover", **{"from": was}, to=self.address,
                             silent_s=silent_s, connected=self._up)
        self._close()
        self._open()
        self.reconnects += 1

    def _monitor_events(self) -> None:
        assert self._monitor is not None
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.log.info("collector_connected", address=self.address)
                self._up = True
                self._offer = None  # (a restarted collector may be an older one)
                self._resend_all()
                self._last_rx = time.monotonic()
                if self.on_connected is not None:
                    self.on_connected()  # spools a hello; _flush sends it with the backlog
            elif kind == zmq.EVENT_DISCONNECTED:
                if self._up:
                    self.log.info("collector_disconnected", address=self.address)
                self._up = False
            else:
                self.log.error("collector_handshake_failed", address=self.address, zmq_event=int(kind),
                               hint="check the CURVE keys (node keypair allowed, collector.key)")

    def _events_monitor(self) -> None:
        assert self._emonitor is not None
        while True:
            try:
                event = recv_monitor_message(self._emonitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._eup = True
                self.log.info("collector_events_connected", port=self.events_port)
            else:  # dropped, or not a collector's events port: the main socket takes them
                self._eup = False
                self._events_back()

    def _send(self, frame: bytes) -> bool:
        assert self._sock is not None
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        self._sent_at = time.monotonic()
        return True

    def _resend_all(self) -> None:
        """A new connection (or a stalled one): every unacked message goes out again."""
        self._blocked = False
        self.sent_upto = 0
        self._inflight.clear()
        self._last_ack = time.monotonic()

    def _flush(self) -> None:
        with self._lock:
            volatile = list(self._volatile)
            self._volatile.clear()
        self._blocked = False
        for frame in volatile:
            self._send(frame)
        window = self._window()
        if len(self._inflight) >= window and time.monotonic() - self._last_ack > STALL_HEARTBEATS * self.heartbeat_s:
            self.log.warning("acks_stalled_resending", unacked=len(self._inflight))
            self._resend_all()
        # Events and command results first (a fault, a job's checkpoint ack), then the rest
        # in seq order: the collector keeps a node's state by seq, whatever the order.
        if not self._send_rows(self.spool.pending(self.sent_upto, WINDOW, types=URGENT)):
            return
        while (room := window - len(self._inflight)) > 0:
            rows = self.spool.pending(self.sent_upto, min(BATCH, room))
            if not self._send_rows(rows, advance=True) or len(rows) < min(BATCH, room):
                return

    def _send_events(self) -> None:
        """Events and command results not in flight yet, on the events socket (its window
        full, or its queue: the rest wait, or go on the main socket)."""
        assert self._esock is not None
        now = time.monotonic()
        if self._einflight and now - min(self._einflight.values()) > STALL_HEARTBEATS * self.heartbeat_s:
            self.log.warning("event_acks_stalled", unacked=len(self._einflight),
                             note="resending on the main connection; reconnecting the events socket")
            self._close_events()
            self._open_events()
            return
        room = EVENTS_WINDOW - len(self._einflight)
        if room <= 0:
            return
        for seq, frame in self.spool.pending(0, EVENTS_WINDOW + len(self._inflight), types=URGENT):
            if seq in self._einflight or seq in self._inflight:
                continue
            try:
                self._esock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return
            self._einflight[seq] = now
            self.events_sent += 1
            room -= 1
            if room == 0:
                return

    def _send_rows(self, rows: list[tuple[int, bytes]], *, advance: bool = False) -> bool:
        """Send the rows not sent yet on this connection, while the window has room, in
        bundles when the collector takes them; ``advance``: they are the next in seq order
        (``sent_upto`` moves past them). False: zmq's queue is full (poll for POLLOUT,
        then go on)."""
        todo: list[tuple[int, bytes]] = []
        window = self._window()
        last = None  # the last row looked at: sent now, or in flight already
        for seq, frame in rows:
            if seq not in self._inflight and seq not in self._einflight:
                if len(self._inflight) + len(todo) >= window:
                    break
                todo.append((seq, frame))
            last = seq
        for group in self._groups(todo):
            if not self._send_group(group):
                self._blocked = True
                if advance:  # the rest of the rows come again from the spool
                    self.sent_upto = max(self.sent_upto, group[0][0] - 1)
                return False
            self._inflight.update(seq for seq, _ in group)
            self._last_send = time.monotonic()
        if advance and last is not None:
            self.sent_upto = last
        return True

    def _window(self) -> int:
        """Frames in flight on the main socket, at most: a bundle's worth, or WINDOW."""
        if self._offer is None:
            return 1  # one frame, until the collector's ack says more
        return WINDOW if self._offer == 0 else BUNDLES_IN_FLIGHT * self._offer

    def _groups(self, rows: list[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
        """``rows`` cut into what goes in one message: a bundle's worth, or one each."""
        bundle = self._offer or 0
        if bundle <= 1:
            return [[row] for row in rows]
        groups: list[list[tuple[int, bytes]]] = []
        size = BUNDLE_BYTES + 1
        for row in rows:
            if size + len(row[1]) > BUNDLE_BYTES or len(groups[-1]) >= bundle:
                groups.append([])
                size = 0
            groups[-1].append(row)
            size += len(row[1])
        return groups

    def _send_group(self, group: list[tuple[int, bytes]]) -> bool:
        if len(group) == 1:
            return self._send(group[0][1])
        if not self._send(wire.bundle_frame(self.node, [frame for _, frame in group])):
            return False
        self.bundles_sent += 1
        return True

    def _receive(self, sock: zmq.Socket[Any], *, main: bool = True) -> None:
        """Everything ``sock`` has: acks, and on the main socket (``main``) commands and
        heartbeats too (any frame there is a sign of life)."""
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if main:
                self._last_rx = time.monotonic()
            self.received += 1
            try:
                message = wire.decode(frame)
            except wire.WireError as exc:
                self.bad_frames += 1
                self.log.warning("bad_frame_from_collector", error=str(exc), main=main)
                continue
            if message.type == wire.ACK:
                self._ack(message, main=main)
            elif main and message.type == wire.COMMAND:
                self._command(message)
            elif not main or message.type != wire.HEARTBEAT:
                self.log.warning("unexpected_message", type=message.type, main=main)

    def _command(self, message: wire.Envelope) -> None:
        """One command, handled on this thread: whatever it raises is logged and counted,
        never the end of the link."""
        try:
            self.on_command(message)
        except Exception as exc:
            self.commands_failed += 1
            self.log.exception("command_failed", command_id=message.id,
                               error=f"{type(exc).__name__}: {str(exc)[:200]}")

    def _ack(self, message: wire.Envelope, *, main: bool = True) -> None:
        """Drop the acked rows. An ack for another spool epoch (sent for a previous
        spool of this node, e.g. before a reinstall) must not delete this spool's rows
        under the same seqs; an ack without an epoch is from an epoch-less collector.
        ``main``: it came on the main socket (an events socket ack says nothing of the
        main connection's stalls)."""
        if message.epoch and message.epoch != self.spool.epoch:
            self.stale_acks += 1
            self.log.info("ack_for_other_epoch", epoch=message.epoch, spool_epoch=self.spool.epoch)
            return
        if main:  # what this collector takes now: no "bundle" (older): WINDOW frames
            offer = message.body.get("bundle")
            self._offer = min(offer, BUNDLE_FRAMES) if type(offer) is int and offer >= 1 else 0
        seqs = message.body["seqs"]
        self._inflight.difference_update(seqs)
        for seq in seqs:
            self._einflight.pop(seq, None)
        if main:
            self._last_ack = time.monotonic()
        rejected = message.body.get("rejected") or []
        if rejected:
            # The collector refused these for good (malformed, or unstorable): resending
            # would fail again. Dropped here, loudly.
            self.rejected += len(rejected)
            self.log.error("messages_rejected_by_collector", seqs=rejected[:20], count=len(rejected))
        self.spool.delete(message.body["seqs"])


def _close_monitored(sock: zmq.Socket[Any] | None, monitor: zmq.Socket[Any] | None) -> None:
    """Close a socket and its monitor socket (either may be None)."""
    if sock is not None:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        sock.close(linger=0)
    if monitor is not None:
        monitor.close(linger=0)
