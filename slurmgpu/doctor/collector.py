"""Doctor checks of the link to the collector: the collector is reachable, its CURVE
handshake accepts this node's key, it answers this node's heartbeat, and the two clocks
agree.

The probe is a DEALER with the node's bundle, as the agent's link is. It sends one
heartbeat marked ``{"probe": true}``, which the collector answers at once and stores
nothing for: it leaves the node's route (where checkpoint commands go) and last-seen time
to the agent. A hello would be stored as a message under a sequence number the agent's
spool owns. A collector older than the probe answers on its heartbeat tick instead, so
the probe waits up to one ``[collector] heartbeat_s`` (see ``reply_wait_s``).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from slurmgpu.doctor.local import NEEDS_CONFIG, expects_agent
from slurmgpu.doctor.model import (
    HEAD,
    RUNNER_SLACK_S,
    STEP_TIMEOUT_S,
    CollectorReply,
    Context,
    Finding,
    fail,
    ok,
    skip,
    warn,
)

COLLECTOR_UNIT = "slurmgpu-collector"
# The answer comes on the collector's heartbeat tick: one interval at most (plus the
# trip). A collector with a very long heartbeat is not waited for past this.
MAX_REPLY_WAIT_S = 10.0
REPLY_MARGIN_S = 0.5
# Clock skew against the collector. NTP keeps hosts within milliseconds, so 2 s means time
# sync is not working here, and the order of this node's events against the collector's
# drains and checkpoints (`slurmgpu jobs events`, the report) is no longer to be trusted.
# Past 30 s those timelines are wrong by half a minute and the skew is heading for munge's
# credential lifetime (300 s by default), past which Slurm itself refuses this node.
SKEW_WARN_S = 2.0
SKEW_FAIL_S = 30.0


def reply_wait_s(ctx: Context) -> float:
    heartbeat = ctx.settings.collector.heartbeat_s if ctx.settings is not None else 5.0
    return min(heartbeat + REPLY_MARGIN_S, MAX_REPLY_WAIT_S)


def collector_budget_s(ctx: Context) -> float:
    """The runner's limit for the collector check: the handshake, one heartbeat interval."""
    return STEP_TIMEOUT_S + reply_wait_s(ctx) + RUNNER_SLACK_S


def check_collector(ctx: Context) -> Iterator[Finding]:
    settings = ctx.settings
    if settings is None:
        yield skip("collector", NEEDS_CONFIG)
    elif ctx.role == HEAD:
        yield listening(settings.collector.addresses[0])
    elif not expects_agent(ctx):
        yield skip("collector", "no collector configured (no [collector] address, no node bundle)")
    else:
        yield probe(ctx)


# --------------------------------------------------------------------------- head node


def listening(address: str) -> Finding:
    """On the head node: something accepts TCP connections where agents connect."""
    where = urlsplit(address)
    if where.scheme != "tcp" or where.port is None:
        return skip("collector", f"[collector] address {address} is not tcp://HOST:PORT; not probed")
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=STEP_TIMEOUT_S):
            pass
    except OSError as exc:
        return fail("collector", f"nothing accepts connections at {address}: {exc.strerror or exc}",
                    f"systemctl start {COLLECTOR_UNIT}; `journalctl -u {COLLECTOR_UNIT}` says why it stopped")
    return ok("collector", f"listening at {address}")


# --------------------------------------------------------------------------- GPU node


def probe(ctx: Context) -> Finding:
    from slurmgpu import keys

    assert ctx.settings is not None
    try:
        node_keys = keys.client_keys(ctx.keys_dir)
    except keys.KeyFileError:
        return skip("collector", "needs this node's keys (see the keys line)")
    address = ctx.settings.collector.addresses[0]
    fp = keys.fingerprint(node_keys[0])
    outcome, reply = _exchange(ctx, address, node_keys)
    if reply is not None:
        ctx.collector_reply = reply
        return ok("collector", f"{address} accepted key {fp} and answered {ctx.node}'s heartbeat "
                               f"in {reply.waited_s:.1f} s")
    return _failed(ctx, address, fp, outcome)


def _exchange(ctx: Context, address: str,
              node_keys: tuple[bytes, bytes, bytes]) -> tuple[str, CollectorReply | None]:
    """("ok", the reply) or (what went wrong, None)."""
    with _connected(address, node_keys) as (outcome, sock):
        if outcome != "ok":
            return outcome, None
        return _heartbeat(ctx, sock)


@contextlib.contextmanager
def _connected(address: str, node_keys: tuple[bytes, bytes, bytes]) -> Iterator[tuple[str, Any]]:
    """A DEALER with the node's keys connected to ``address``: (the handshake's outcome,
    see ``_handshake``, or "address:<error>"; the socket), closed on exit."""
    import zmq

    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    monitor = None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = node_keys
        monitor = sock.get_monitor_socket(_handshake_events())
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            yield f"address:{exc}", sock
            return
        yield _handshake(monitor, time.monotonic() + STEP_TIMEOUT_S), sock
    finally:
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)
        zctx.term()


def _handshake_events() -> int:
    import zmq

    return int(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _handshake(monitor: Any, deadline: float) -> str:
    """"ok"; "auth" (the collector's ZAP refused the key); "server-key" (the handshake
    broke: the bundle's collector.key is not this collector's); "no-handshake" (a TCP
    peer that never completed one); "unreachable" (no connection at all)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    connected = False
    while (left := deadline - time.monotonic()) > 0:
        if not monitor.poll(int(left * 1000) + 1):
            continue
        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return "ok"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return "auth"
        if event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return "server-key"
        connected = connected or event == zmq.EVENT_CONNECTED
    return "no-handshake" if connected else "unreachable"


def _heartbeat(ctx: Context, sock: Any) -> tuple[str, CollectorReply | None]:
    import zmq

    from slurmgpu import wire

    sent = time.monotonic()
    try:
        sock.send(wire.encode(wire.Envelope(type=wire.HEARTBEAT, node=ctx.node, seq=0,
                                            body={"probe": True})), zmq.NOBLOCK)
    except zmq.Again:  # the connection went away right after the handshake
        return "no-reply", None
    deadline = sent + reply_wait_s(ctx)
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1):
            continue
        frame = sock.recv()
        received_at = time.time()
        try:
            envelope = wire.decode(frame)
        except wire.WireError:
            continue
        return "ok", CollectorReply(envelope.ts, received_at, time.monotonic() - sent)
    return "no-reply", None


def _failed(ctx: Context, address: str, fp: str, outcome: str) -> Finding:
    node, keys_dir = ctx.node, ctx.keys_dir
    if outcome == "auth":
        return fail("collector", f"{address} refused this node's key {fp}: not on the collector's "
                                 "allow-list",
                    f"on the head node run `slurmgpu keys add-node {node}` (--force if it has a key), "
                    f"copy the bundle to {keys_dir}, then `systemctl reload {COLLECTOR_UNIT}`")
    if outcome == "server-key":
        return fail("collector", f"the CURVE handshake with {address} failed: "
                                 f"{Path(keys_dir) / 'collector.key'} is not that collector's key",
                    f"copy collector.key from the head node's keys directory to {keys_dir}")
    if outcome == "no-handshake":
        return fail("collector", f"{address} takes connections but completed no CURVE handshake "
                                 f"in {STEP_TIMEOUT_S:g} s: is that the collector's port?",
                    f"check [collector] address in {ctx.config_path} against the head's [collector] bind")
    if outcome == "no-reply":
        return fail("collector", f"{address} accepted key {fp} but did not answer {node}'s heartbeat "
                                 f"in {reply_wait_s(ctx):g} s",
                    f"on the head node `slurmgpu keys list` must show {node} with key {fp} (a key "
                    f"allow-listed under another name is refused); else see `journalctl -u {COLLECTOR_UNIT}`")
    if outcome.startswith("address:"):
        return fail("collector", f"[collector] address {address} is not usable: {outcome[8:]}",
                    f"set [collector] address = \"tcp://HEAD:7150\" in {ctx.config_path}")
    unset = "" if ctx.configured("collector.address") else " (the default: [collector] address is not set)"
    return fail("collector", f"no connection to {address}{unset} in {STEP_TIMEOUT_S:g} s",
                f"start the collector (systemctl start {COLLECTOR_UNIT} on the head node), open its "
                f"port, or set [collector] address in {ctx.config_path}")


# --------------------------------------------------------------------------- the events port


def check_events_port(ctx: Context) -> Iterator[Finding]:
    """``[collector] events_port``: a WARN at most, since events still reach the
    collector without it (with the reports, behind any backlog)."""
    settings = ctx.settings
    if settings is None:
        yield skip(EVENTS_CHECK, NEEDS_CONFIG)
        return
    address = settings.collector.addresses[0]
    endpoint = settings.collector.events_endpoint(address)
    if endpoint is None:
        yield skip(EVENTS_CHECK, "no events port ([collector] events_port = 0, or an ipc:// address): "
                                 "events and command results go with the reports")
    elif ctx.role == HEAD:
        yield _events_listening(endpoint)
    elif ctx.collector_reply is None:
        yield skip(EVENTS_CHECK, "the collector did not answer (see the collector line)")
    else:
        yield _events_probe(ctx, endpoint)


EVENTS_CHECK = "collector.events"
_EVENTS_WHY = "events and command results go with the reports, behind any backlog after an outage"


def _events_listening(endpoint: str) -> Finding:
    host, port = _host_port(endpoint)
    try:
        with socket.create_connection((host, port), timeout=STEP_TIMEOUT_S):
            pass
    except OSError as exc:
        return warn(EVENTS_CHECK, f"nothing accepts connections at {endpoint} ([collector] events_port): "
                                  f"{exc.strerror or exc}; {_EVENTS_WHY}",
                    f"`journalctl -u {COLLECTOR_UNIT}` shows events_port_unavailable if the port is taken; "
                    "free it or choose another [collector] events_port (the same on every node)")
    return ok(EVENTS_CHECK, f"listening at {endpoint}")


def _events_probe(ctx: Context, endpoint: str) -> Finding:
    from slurmgpu import keys

    node_keys = keys.client_keys(ctx.keys_dir)  # (the collector line read them)
    with _connected(endpoint, node_keys) as (outcome, _):
        if outcome == "ok":
            return ok(EVENTS_CHECK, f"{endpoint} accepted key {keys.fingerprint(node_keys[0])}: events "
                                    "and command results go there")
    port = endpoint.rpartition(":")[2]
    return warn(EVENTS_CHECK, f"no CURVE handshake at {endpoint} ([collector] events_port) in "
                              f"{STEP_TIMEOUT_S:g} s ({outcome}); {_EVENTS_WHY}",
                f"open TCP port {port} from the nodes to the head node (as 7150), or set "
                f"[collector] events_port = 0 in {ctx.config_path}")


def _host_port(endpoint: str) -> tuple[str, int]:
    where = urlsplit(endpoint)
    host = "127.0.0.1" if where.hostname in (None, "*") else where.hostname
    return host, int(where.port or 0)


# --------------------------------------------------------------------------- clock


def check_clock(ctx: Context) -> Iterator[Finding]:
    """This host's clock against the timestamp of the collector's answer."""
    if ctx.role == HEAD:
        yield skip("clock", "head node: the GPU nodes compare their clocks with the collector's")
        return
    reply = ctx.collector_reply
    if reply is None:
        yield skip("clock", "no answer from the collector to compare with")
        return
    skew = reply.received_at - reply.ts  # > 0: this host is ahead
    side = "ahead of" if skew > 0 else "behind"
    message = f"this host's clock is {abs(skew):.1f} s {side} the collector's"
    fix = "turn on time sync on both hosts (`timedatectl set-ntp true`; `chronyc tracking` shows the offset)"
    if abs(skew) > SKEW_FAIL_S:
        yield fail("clock", message, fix)
    elif abs(skew) > SKEW_WARN_S:
        yield warn("clock", message, fix)
    else:
        yield ok("clock", f"within {SKEW_WARN_S:g} s of the collector's ({skew:+.3f} s)")
