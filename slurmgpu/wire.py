"""The agent <-> collector wire protocol: one envelope, every message type, msgpack.

A frame is one msgpack map: {"v": 1, "id": ..., "node": ..., "seq": ..., "ts": ...,
"type": ..., "body": {...}, "epoch": ...}. Promises: every frame is bounded and every
body validated per type (``decode``; ``decode_received`` adds the body's bytes as
received), so a bad frame is a ``WireError`` (``BodyError`` when only its body is bad),
never a crash, and whatever it accepts both stores can store; ``encode`` refuses what
the other side would. Every frame either side sends is built here.

The message types, their fields and bounds: docs/design-notes.md (``slurmgpu/wire.py``).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgpack

from slurmgpu.errors import WireError
from slurmgpu.facts import XID_MESSAGE_MAX
from slurmgpu.result import Finding, Severity
from slurmgpu.wiresummary import INT64_MAX as INT64_MAX  # (the wire's bounds: wire.MAX_*)
from slurmgpu.wiresummary import INT64_MIN as INT64_MIN
from slurmgpu.wiresummary import MAX_GPUS as MAX_GPUS
from slurmgpu.wiresummary import MAX_IB_PORTS as MAX_IB_PORTS
from slurmgpu.wiresummary import MAX_SHORT as MAX_SHORT
from slurmgpu.wiresummary import MAX_SUMMARY_ROW as MAX_SUMMARY_ROW
from slurmgpu.wiresummary import is_int, is_str, short, validate_summary

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a full 8-GPU report is ~20 KiB
MAX_NODE_NAME = 128
MAX_ID = 64
MAX_EPOCH = 64
# Bounds per message. Generous for any real node (8 GPUs, 8 IB ports, ~40 checks), tight
# enough that one message cannot add more than a few thousand keys to the collector's
# in-memory maps and metric labels.
MAX_SEQ = INT64_MAX
MAX_TS = 1e11  # seconds since the epoch: year 5138
MAX_FINDINGS = 4096
MAX_CHECKS = 1024  # ok_checks ids per report
MAX_CHECK_NAME = 128
MAX_SEVERITY = 16  # also verdicts
MAX_KIND = 64  # event kinds, command names
MAX_TEXT = 1 << 16  # finding messages (stored truncated; never a key or a label)
MAX_ACK_SEQS = 100_000
MAX_BUNDLE = 256  # frames per bundle (and the whole bundle is one frame: MAX_FRAME)
MAX_THROTTLE = (1 << 32) - 1
MAX_INTERVAL_S = 1e7
_EPOCH_RE = re.compile(r"[A-Za-z0-9._-]+")
# Slurm node name characters (the same rule the CURVE allow-list uses for file names).
_NODE_RE = re.compile(r"[A-Za-z0-9._-]+")

# Event kinds agents send (the agent's NVML kinds, gpu_lost and the gate's own): anything
# else is still stored, but labelled "other" in metrics (a label per invented kind would
# let one node grow the metrics without bound).
EVENT_KINDS = frozenset({"xid", "ecc_dbe", "ecc_sbe", "ecc_sbe_storm", "dram_retirement",
                         "dram_retirement_failure", "poison_nonfatal", "poison_fatal",
                         "gpu_unavailable", "recovery_action", "gpu_lost", "clock", "pstate",
                         "power_source", "local_checkpoint", "prolog_blocked", "validation"})

HELLO, REPORT, EVENT, HEARTBEAT, ACK, COMMAND, COMMAND_RESULT, BUNDLE = (
    "hello", "report", "event", "heartbeat", "ack", "command", "command-result", "bundle")
TYPES = frozenset({HELLO, REPORT, EVENT, HEARTBEAT, ACK, COMMAND, COMMAND_RESULT, BUNDLE})
# Types the agent spools and the collector acknowledges.
ACKED = frozenset({HELLO, REPORT, EVENT, COMMAND_RESULT})


class BodyError(WireError):
    """A frame whose envelope is valid but whose body is not. The receiver knows which
    message of which spool it was, so it can tell the sender to drop it (a frame that
    is bad now is bad on every resend)."""

    def __init__(self, message: str, envelope: Envelope) -> None:
        super().__init__(message)
        self.envelope = envelope  # its body is the raw, unvalidated one


@dataclass(frozen=True)
class Envelope:
    type: str
    node: str
    seq: int
    body: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ts: float = field(default_factory=time.time)
    v: int = PROTOCOL_VERSION
    epoch: str = ""
    # A received report's or event's findings, decoded from ``body`` (not sent: senders
    # put them in the body, ``encode_findings``).
    findings: tuple[Finding, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = {"v": self.v, "id": self.id, "node": self.node, "seq": self.seq, "ts": self.ts,
                "type": self.type, "body": self.body}
        if self.epoch:  # absent when empty: frames of epoch-less senders stay byte-identical
            data["epoch"] = self.epoch
        return data


def encode(message: Envelope) -> bytes:
    """Serialise ``message``; a message the other side would reject is a WireError here."""
    frame = encode_unchecked(message)
    decode(frame)  # what we send must be what the receiver accepts
    return frame


def encode_unchecked(message: Envelope) -> bytes:
    """Serialise ``message`` without validating it (only msgpack-ability and the size
    bound are checked). For senders that construct well-formed messages themselves;
    anything built from outside input goes through ``encode``."""
    try:
        frame: bytes = msgpack.packb(message.to_dict(), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"{message.type} message cannot be encoded: {exc}") from None
    if len(frame) > MAX_FRAME:
        raise WireError(f"{message.type} message is {len(frame)} bytes (max {MAX_FRAME})")
    return frame


# ---------------------------------------------------------------- frames


def message_frame(mtype: str, node: str, seq: int, body: dict[str, Any], *, epoch: str = "",
                  ts: float | None = None, id: str | None = None) -> bytes:
    """An acked message from an agent (hello, report, event, command-result), validated:
    what the agent spools and sends (NUL in its text as U+FFFD, ``text_safe``: a kernel
    log line or a device string with NUL is still sent). ``ts`` defaults to now, ``id``
    to a fresh uuid4."""
    return encode(Envelope(type=mtype, node=node, seq=seq, body=text_safe(body), epoch=epoch,
                           ts=time.time() if ts is None else ts,
                           id=uuid.uuid4().hex if id is None else id))


def hello_frame(node: str, seq: int, *, version: str, gpus: int, interval_s: float,
                epoch: str = "", ts: float | None = None, id: str | None = None) -> bytes:
    """A hello: the agent's version, GPU count and report interval."""
    return message_frame(HELLO, node, seq, {"version": version, "gpus": gpus, "interval_s": interval_s},
                         epoch=epoch, ts=ts, id=id)


def heartbeat_frame(node: str, *, ts: float | None = None, id: str | None = None) -> bytes:
    """An agent's heartbeat (no seq, no ack), validated; the collector's is the same
    frame (``reply_heartbeat_frame``)."""
    return encode(reply_heartbeat(node, ts, id))


def reply_heartbeat_frame(node: str, *, ts: float | None = None, id: str | None = None) -> bytes:
    """The collector's heartbeat to ``node`` (or its answer to `slurmgpu doctor`'s probe),
    from an authenticated node's name: not checked again."""
    return encode_unchecked(reply_heartbeat(node, ts, id))


def reply_heartbeat(node: str, ts: float | None, id: str | None) -> Envelope:
    return Envelope(type=HEARTBEAT, node=node, seq=0, ts=time.time() if ts is None else ts,
                    id=uuid.uuid4().hex if id is None else id)


def ack_frame(node: str, seqs: list[int], *, epoch: str = "", rejected: list[int] | None = None,
              bundle: int = 0, ts: float | None = None, id: str | None = None) -> bytes:
    """The collector's ack of ``seqs`` of ``epoch``'s spool; ``rejected``: those refused for
    good; ``bundle``: the bundle size it takes now (0: not said). Built from what the
    collector accepted: not checked again."""
    body: dict[str, Any] = {"seqs": seqs}
    if rejected:
        body["rejected"] = rejected
    if bundle:
        body["bundle"] = bundle
    return encode_unchecked(Envelope(type=ACK, node=node, seq=0, body=body, epoch=epoch,
                                     ts=time.time() if ts is None else ts,
                                     id=uuid.uuid4().hex if id is None else id))


def command_frame(node: str, command: str, args: dict[str, Any] | None, *, id: str,
                  ts: float | None = None) -> bytes:
    """A command to ``node``'s agent, validated; ``id`` comes back as the command-result's
    ``command_id``."""
    return encode(Envelope(type=COMMAND, node=node, seq=0, body={"command": command, "args": args or {}},
                           id=id, ts=time.time() if ts is None else ts))


def bundle_frame(node: str, frames: list[bytes], *, ts: float | None = None,
                 id: str | None = None) -> bytes:
    """Frames of ``node``'s (as spooled, each already valid) in one message, for a
    collector whose acks carry ``bundle``. WireError when they do not fit in one frame."""
    return encode(Envelope(type=BUNDLE, node=node, seq=0, body={"frames": frames},
                           ts=time.time() if ts is None else ts,
                           id=uuid.uuid4().hex if id is None else id))


def packed(value: Any) -> bytes:
    """``value`` packed as the wire packs it (a report's ``facts`` and ``summary`` travel
    pre-packed, and ``ReportFrames`` takes a body packed once)."""
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


class ReportFrames:
    """Report frames around a body packed once (``packed``), for a sender of thousands
    a second (the load simulator): the constant parts are packed once, the node's part
    once per node (``node_part``). Exactly ``encode_unchecked`` of the same envelope."""

    def __init__(self) -> None:
        self._head = b"\x87" + packed("v") + packed(PROTOCOL_VERSION) + packed("id")
        self._ts_key = packed("ts")
        self._tail = packed("type") + packed(REPORT) + packed("body")

    @staticmethod
    def node_part(node: str) -> bytes:
        return packed("node") + packed(node) + packed("seq")

    def report(self, node_part: bytes, id: str, seq: int, ts: float, body: bytes) -> bytes:
        return b"".join((self._head, packed(id), node_part, packed(seq), self._ts_key, packed(ts),
                         self._tail, body))


_EPOCH_KEY = packed("epoch")


def body_bytes(frame: bytes, body: dict[str, Any], epoch: str,
               pack: Callable[[Any], bytes] = packed) -> bytes:
    """The packed bytes of the ``body`` of a frame ``decode`` accepted (``body``,
    ``epoch``: its decoded fields): the bytes as received. Every sender of this package
    packs the envelope's keys in ``Envelope.to_dict``'s order (body last, but for the
    epoch) with msgpack's canonical encoding, so ``body`` re-packed is what the frame
    ends with (one pack and one comparison, ~1 us for a report); a frame packed another
    way is sliced (``raw_body``). Either way the bytes unpack to ``body``."""
    again = pack(body)
    if epoch:
        tail = _EPOCH_KEY + pack(epoch)
        if frame.endswith(tail) and frame.endswith(again, 0, len(frame) - len(tail)):
            return again
    elif frame.endswith(again):
        return again
    return raw_body(frame) or again


def decode_received(frame: bytes) -> tuple[Envelope, bytes]:
    """``decode(frame)`` and, for a type the store keeps, the body's bytes as received
    (``body_bytes``; b"" for the others: heartbeats, bundles, acks)."""
    env = decode(frame)
    return env, (body_bytes(frame, env.body, env.epoch) if env.type in ACKED else b"")


def raw_body(frame: bytes) -> bytes | None:
    """The packed bytes of the ``body`` value of a frame ``decode`` accepted, sliced out
    of the frame (no re-packing: unpacking them gives the decoded body); None if not found.
    Only the top-level keys are read; the values before ``body`` are skipped in C."""
    try:
        unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(frame) + 1)
        unpacker.feed(frame)
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == b"body":
                start = unpacker.tell()
                unpacker.skip()
                return bytes(frame[start:unpacker.tell()])
            unpacker.skip()
    except Exception:  # not expected for a decoded frame; the caller re-packs
        return None
    return None


def decode(frame: bytes) -> Envelope:
    """Parse and validate one frame; any problem is a WireError.

    (The collector's hot path, ~5,000 frames a second: the checks are written out inline,
    with ``type(x) is T`` where msgpack gives exact types, and node names and epochs that
    passed are remembered, so a valid frame costs its unpacking and a few comparisons.)"""
    if len(frame) > MAX_FRAME:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    try:
        data = _unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not a msgpack frame: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise WireError("frame is not a map")
    if map_size(frame) != len(data):  # (msgpack keeps the last of a repeated key)
        raise WireError("frame repeats a key")
    get = data.get
    version = get("v")
    # (True == 1 and 1.0 == 1 in Python: insist on a real int)
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {short(version)} "
                        f"(this side speaks {PROTOCOL_VERSION})")
    mtype, node, seq, body = get("type"), get("node"), get("seq"), get("body")
    mid, ts, epoch = get("id"), get("ts"), get("epoch", "")
    if type(mtype) is not str or mtype not in TYPES:  # (a list is unhashable)
        raise WireError(f"unknown message type {short(mtype)}")
    if type(node) is not str or node not in _GOOD_NODES.items:
        if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE_NAME \
                or not _NODE_RE.fullmatch(node):
            raise WireError("bad node name")
        _GOOD_NODES.add(node)
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise WireError("bad sequence number")
    if type(mid) is not str or not 0 < len(mid) <= MAX_ID or "\x00" in mid:
        raise WireError("bad message id")
    if type(ts) is float:
        if not (0 <= ts <= MAX_TS and math.isfinite(ts)):
            raise WireError("bad timestamp")
    elif type(ts) is int and 0 <= ts <= MAX_TS:
        ts = float(ts)
    else:
        raise WireError("bad timestamp")
    if epoch and (type(epoch) is not str or epoch not in _GOOD_EPOCHS.items):
        if not isinstance(epoch, str) or len(epoch) > MAX_EPOCH or not _EPOCH_RE.fullmatch(epoch):
            raise WireError("bad epoch")
        _GOOD_EPOCHS.add(epoch)
    elif type(epoch) is not str:  # (a falsy non-string: 0, [], None)
        raise WireError("bad epoch")
    if type(body) is not dict:
        raise WireError("body is not a map")
    try:
        findings = _VALIDATORS[mtype](body) or ()
    except WireError as exc:
        raise BodyError(str(exc), Envelope(type=mtype, node=node, seq=seq, body=body, id=mid,
                                           ts=ts, v=version, epoch=epoch)) from None
    # (an Envelope without its dataclass __init__: the fields set at once, ~1.5 us less)
    env = _new_envelope(Envelope)
    _set_attr(env, "__dict__", {"type": mtype, "node": node, "seq": seq, "body": body, "id": mid, "ts": ts,
                                "v": version, "epoch": epoch, "findings": findings})
    return env


def map_size(frame: bytes) -> int:
    """The number of keys the msgpack map ``frame`` starts with says it has (-1: no map
    header). More than its unpacked dict's: a key is repeated."""
    first = frame[0] if frame else 0
    if 0x80 <= first <= 0x8F:
        return first & 0x0F
    if first == 0xDE and len(frame) >= 3:
        return int.from_bytes(frame[1:3], "big")
    if first == 0xDF and len(frame) >= 5:
        return int.from_bytes(frame[1:5], "big")
    return -1


_unpackb = msgpack.unpackb
_new_envelope = object.__new__
_set_attr = object.__setattr__


class _BoundedStrSet:
    """Strings that passed a check (node names, epochs), at most ``limit``; emptied when
    full, so names a node invents cost re-checking, never memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: set[str] = set()

    def add(self, value: str) -> None:
        if len(self.items) >= self.limit:
            self.items.clear()
        self.items.add(value)


# Node names and spool epochs that passed their checks (each of its own field: the limits
# differ). A node may send any name in a frame (it is refused after decoding when it is
# not the node's own), so each set is bounded: at most ~7 MB of names and ~5 MB of epochs
# however many a node invents; a fleet of more than 32,768 nodes re-checks some of its
# names now and then.
_GOOD_NODES = _BoundedStrSet(32_768)
_GOOD_EPOCHS = _BoundedStrSet(32_768)


def _is_number(value: Any, low: float, high: float) -> TypeGuard[int | float]:
    """A real int or a finite float (not a bool) in [low, high]. (The range check comes
    first for ints: math.isfinite(10**400) raises OverflowError.)"""
    if type(value) is int:
        return low <= value <= high
    return type(value) is float and math.isfinite(value) and low <= value <= high


def _require(body: dict[str, Any], key: str, kind: type | tuple[type, ...], mtype: str, *,
             optional: bool = False) -> None:
    """``body[key]`` must be a ``kind`` (a bool is never an int/float here); with
    ``optional`` the field may also be absent or None."""
    value = body.get(key)
    if optional and value is None:
        return
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise WireError(f"{mtype}: field {key!r} missing or of the wrong type")


def _require_str(body: dict[str, Any], key: str, limit: int, mtype: str, *,
                 optional: bool = False) -> None:
    _require(body, key, str, mtype, optional=optional)
    value = body.get(key) or ""
    if len(value) > limit:
        raise WireError(f"{mtype}: field {key!r} longer than {limit} characters")
    if "\x00" in value:
        raise WireError(f"{mtype}: field {key!r} contains NUL")


def _require_int(body: dict[str, Any], key: str, low: int, high: int, mtype: str, *,
                 optional: bool = False) -> None:
    _require(body, key, int, mtype, optional=optional)
    value = body.get(key)
    if value is not None and not low <= value <= high:
        raise WireError(f"{mtype}: field {key!r} out of range [{low}, {high}]")


def _hello(body: dict[str, Any]) -> None:
    _require_str(body, "version", MAX_SHORT, HELLO)
    _require_int(body, "gpus", 0, MAX_GPUS, HELLO)
    _require(body, "interval_s", (int, float), HELLO)
    if not _is_number(body["interval_s"], 0, MAX_INTERVAL_S):
        raise WireError(f"hello: field 'interval_s' out of range [0, {MAX_INTERVAL_S:g}]")


def _verdict_findings(mtype: str, body: dict[str, Any]) -> tuple[Finding, ...]:
    _require_str(body, "verdict", MAX_SEVERITY, mtype)
    _require(body, "findings", list, mtype)
    findings = body["findings"]
    if len(findings) > MAX_FINDINGS:
        raise WireError(f"{mtype}: more than {MAX_FINDINGS} findings")
    return tuple(decode_finding(f, mtype) for f in findings)


# ---------------------------------------------------------------- findings


def plain(value: Any) -> Any:
    """Make finding data msgpack-safe and storable (sets, tuples, odd objects; NUL in
    text as U+FFFD, ``text_safe``)."""
    if isinstance(value, dict):
        return {text_safe(str(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return text_safe(value)
    if value is None or isinstance(value, (bool, int, float, bytes)):
        return value
    return text_safe(str(value))


def text_safe(value: Any) -> Any:
    """``value`` with each NUL in its text (maps, their keys and lists walked) as U+FFFD,
    which a receiver accepts (it refuses NUL: PostgreSQL's text cannot hold it)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {text_safe(k): text_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [text_safe(v) for v in value]
    return value


def encode_finding(finding: Finding) -> dict[str, Any]:
    """A finding as it goes on the wire: ``Finding.to_json()``, its data msgpack-safe."""
    data = finding.to_json()
    data["data"] = plain(data["data"])
    return data


def encode_findings(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [encode_finding(f) for f in findings]


_SEVERITIES = {s.name: s for s in Severity}


def decode_severity(text: str) -> Severity:
    """A severity (or verdict) name from the wire, any case; a name that is none of
    Severity's: UNKNOWN (the collector never knew what to make of it either)."""
    severity = _SEVERITIES.get(text)  # (agents send the names as they are)
    return severity if severity is not None else _SEVERITIES.get(text.upper(), Severity.UNKNOWN)


def decode_finding(raw: Any, mtype: str = "finding") -> Finding:
    """One finding map from the wire -> ``Finding``; WireError (naming ``mtype``) for one
    a receiver must refuse. Lenient where validation always was: an absent or null
    message is "", data that is no map is {}, ``not_applicable`` is its truth value, and
    the severity is ``decode_severity``'s."""
    if type(raw) is not dict:
        raise WireError(f"{mtype}: malformed finding")
    check, severity, gpu = raw.get("check"), raw.get("severity"), raw.get("gpu")
    subject, message = raw.get("subject"), raw.get("message")
    if type(check) is not str or len(check) > MAX_CHECK_NAME or type(severity) is not str \
            or len(severity) > MAX_SEVERITY \
            or (subject is not None and not is_str(subject, MAX_SHORT)) \
            or (message is not None and not is_str(message, MAX_TEXT)):
        raise WireError(f"{mtype}: malformed finding")
    # (the index range also bounds the distinct GPUs per message to MAX_GPUS)
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < MAX_GPUS):
        raise WireError(f"{mtype}: finding GPU index out of range [0, {MAX_GPUS - 1}]")
    data = raw.get("data")
    if "\x00" in check or "\x00" in severity or (subject and "\x00" in subject) \
            or (message and "\x00" in message) or (data and not _nul_free(data)):
        raise WireError(f"{mtype}: a finding's text contains NUL")
    return Finding(check, decode_severity(severity), message or "", gpu=gpu, subject=subject,
                   not_applicable=bool(raw.get("not_applicable")),
                   data=data if isinstance(data, dict) else {})


def _nul_free(value: Any) -> bool:
    """No string in ``value`` (maps, their keys and lists walked, without recursion:
    a frame can nest deeper than Python's stack) contains NUL."""
    todo = [value]
    while todo:
        item = todo.pop()
        if type(item) is str:
            if "\x00" in item:
                return False
        elif type(item) is dict:
            todo.extend(item)
            todo.extend(item.values())
        elif type(item) is list:
            todo.extend(item)
    return True


def _report(body: dict[str, Any]) -> tuple[Finding, ...]:
    """A report's body: the common case (every field of the right type, no finding) is
    checked inline in a few comparisons; anything else goes through ``_report_checked``,
    which accepts exactly the same bodies and says what is wrong with the others."""
    get = body.get
    verdict, findings, ok_checks = get("verdict"), get("findings"), get("ok_checks")
    facts, summary, throttle = get("facts"), get("summary"), get("throttle")
    if type(verdict) is not str or len(verdict) > MAX_SEVERITY or "\x00" in verdict \
            or type(findings) is not list \
            or (facts is not None and type(facts) is not bytes and type(facts) is not dict) \
            or (summary is not None and type(summary) is not bytes and type(summary) is not dict) \
            or (throttle is not None and (type(throttle) is not int or not 0 <= throttle <= MAX_THROTTLE)) \
            or (ok_checks is not None and type(ok_checks) is not list):
        return _report_checked(body)
    # (set of the item types, built in C: ~25 ids per report)
    if ok_checks and (len(ok_checks) > MAX_CHECKS or not set(map(type, ok_checks)) <= _STR_TYPE
                      or max(map(len, ok_checks)) > MAX_CHECK_NAME or "\x00" in "".join(ok_checks)):
        return _report_checked(body)
    decoded: tuple[Finding, ...] = ()
    if findings:  # (in _report_checked's order: findings, then the summary)
        if len(findings) > MAX_FINDINGS:
            return _report_checked(body)
        decoded = tuple([decode_finding(f, REPORT) for f in findings])
    if summary is not None:
        validate_summary(summary)
    return decoded


_STR_TYPE = {str}


def _report_checked(body: dict[str, Any]) -> tuple[Finding, ...]:
    findings = _verdict_findings(REPORT, body)
    # facts: a map, or (as the agent sends them) that map pre-packed as msgpack bytes,
    # which the collector stores as they are instead of decoding ~13 KB per report.
    # They are only ever stored as a blob, never bound as SQL values: not walked here.
    _require(body, "facts", (dict, bytes), REPORT, optional=True)
    _require(body, "ok_checks", list, REPORT, optional=True)
    _require(body, "summary", (dict, bytes), REPORT, optional=True)
    _require_int(body, "throttle", 0, MAX_THROTTLE, REPORT, optional=True)
    ok_checks = body.get("ok_checks") or ()
    # (set of the item types, built in C: ~25 ids per report, on the ingest hot path)
    if not set(map(type, ok_checks)) <= {str}:
        raise WireError("report: ok_checks must be check ids")
    if len(ok_checks) > MAX_CHECKS or max(map(len, ok_checks), default=0) > MAX_CHECK_NAME:
        raise WireError(f"report: at most {MAX_CHECKS} ok_checks of at most "
                        f"{MAX_CHECK_NAME} characters")
    if "\x00" in "".join(ok_checks):
        raise WireError("report: an ok_checks id contains NUL")
    summary = body.get("summary")
    if summary is not None:
        validate_summary(summary)
    return findings


def _event(body: dict[str, Any]) -> tuple[Finding, ...]:
    findings = _verdict_findings(EVENT, body)
    _require_str(body, "kind", MAX_KIND, EVENT)
    _require_int(body, "gpu", 0, MAX_GPUS - 1, EVENT, optional=True)
    _require_int(body, "data", INT64_MIN, INT64_MAX, EVENT, optional=True)
    _require_int(body, "coalesced", 0, INT64_MAX, EVENT, optional=True)
    _require_str(body, "message", XID_MESSAGE_MAX, EVENT, optional=True)
    return findings


def _seq_list(body: dict[str, Any], key: str, *, optional: bool = False) -> None:
    _require(body, key, list, ACK, optional=optional)
    seqs = body.get(key) or ()
    if len(seqs) > MAX_ACK_SEQS:
        raise WireError(f"ack: more than {MAX_ACK_SEQS} {key}")
    if not all(is_int(s, 0, MAX_SEQ) for s in seqs):
        raise WireError(f"ack: {key} must be non-negative integers")


def _ack(body: dict[str, Any]) -> None:
    _seq_list(body, "seqs")
    _seq_list(body, "rejected", optional=True)


def _bundle(body: dict[str, Any]) -> None:
    frames = body.get("frames")
    if type(frames) is not list or not 0 < len(frames) <= MAX_BUNDLE:
        raise WireError(f"bundle: field 'frames' is not a list of 1 to {MAX_BUNDLE} frames")
    if not set(map(type, frames)) <= _BYTES_TYPE:
        raise WireError("bundle: frames must be msgpack frames (bytes)")


_BYTES_TYPE = {bytes}


def _command(body: dict[str, Any]) -> None:
    _require_str(body, "command", MAX_KIND, COMMAND)
    _require(body, "args", dict, COMMAND, optional=True)


def _command_result(body: dict[str, Any]) -> None:
    _require_str(body, "command_id", MAX_ID, COMMAND_RESULT)
    _require(body, "ok", bool, COMMAND_RESULT)
    _require(body, "result", dict, COMMAND_RESULT, optional=True)


_VALIDATORS: dict[str, Callable[[dict[str, Any]], tuple[Finding, ...] | None]] = {
    HELLO: _hello, REPORT: _report, EVENT: _event, HEARTBEAT: lambda body: None, ACK: _ack,
    COMMAND: _command, COMMAND_RESULT: _command_result, BUNDLE: _bundle}
