"""The agent <-> collector wire protocol: one envelope, every message type, msgpack.

A frame is one msgpack map:

    {"v": 1, "id": "<uuid4 hex>", "node": "gpu-n1", "seq": 17, "ts": 1790000000.0,
     "type": "report", "body": {...}}

* ``v`` protocol version; a frame with an unknown version is rejected.
* ``id`` unique message id; ``seq`` per-node sequence number, strictly increasing for
  messages that need an ack (report, event, command-result, hello); the collector
  deduplicates by (node, seq).
* Every frame is bounded (``MAX_FRAME``) and every body is validated per type, so a
  malformed frame is a ``WireError`` (counted and logged by the receiver), never a crash.

Message types (body fields):
    hello           {"version": str, "gpus": int, "interval_s": float}
    report          {"verdict": str, "findings": [non-OK finding...], "ok_checks": [check id...],
                     "facts": {...} or msgpack bytes of it,
                     "throttle": int, "summary": msgpack bytes (slurmgpu.summary: counters and
                     versions for the fleet history)}
    event           {"kind": "xid"|"ecc_dbe"|"ecc_sbe_storm"|"dram_retirement"|
                     "dram_retirement_failure"|"poison_nonfatal"|"poison_fatal"|
                     "gpu_unavailable"|"recovery_action"|"gpu_lost"|"local_checkpoint"|
                     "prolog_blocked"|..., "gpu": int|None, "data": int|None, "verdict": str,
                     "findings": [finding...], "coalesced": int (events folded into this one),
                     "message": str (an XID's kernel-log text, at most XID_MESSAGE_MAX)}
    heartbeat       {}                         (no ack, no seq needed: seq 0)
    ack             {"seqs": [int, ...]}       (collector -> agent)
    command         {"command": str, "args": {...}}   (collector -> agent)
    command-result  {"command_id": str, "ok": bool, "result": {...}}

``facts``, ``gpu``, ``data``, ``args`` and ``result`` may be absent (or None); every other
field listed is required. ``node`` is a Slurm node name ([A-Za-z0-9._-], at most 128).
``encode`` validates too, so a sender never emits a frame the receiver would reject;
``encode_unchecked`` skips that self-check, for frames whose fields the caller builds
itself (the collector's acks and heartbeats, the load simulator).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack

from slurmgpu.errors import SlurmGpuError
from slurmgpu.facts import XID_MESSAGE_MAX

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a full 8-GPU report is ~20 KiB
MAX_NODE_NAME = 128
MAX_ID = 64
# Slurm node name characters (the same rule the CURVE allow-list uses for file names).
_NODE_RE = re.compile(r"[A-Za-z0-9._-]+")

HELLO, REPORT, EVENT, HEARTBEAT, ACK, COMMAND, COMMAND_RESULT = (
    "hello", "report", "event", "heartbeat", "ack", "command", "command-result")
TYPES = frozenset({HELLO, REPORT, EVENT, HEARTBEAT, ACK, COMMAND, COMMAND_RESULT})
# Types the agent spools and the collector acknowledges.
ACKED = frozenset({HELLO, REPORT, EVENT, COMMAND_RESULT})


class WireError(SlurmGpuError):
    """A frame that is not a valid message (too big, not msgpack, bad version/fields)."""


@dataclass(frozen=True)
class Envelope:
    type: str
    node: str
    seq: int
    body: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ts: float = field(default_factory=time.time)
    v: int = PROTOCOL_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "node": self.node, "seq": self.seq, "ts": self.ts,
                "type": self.type, "body": self.body}


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
    """Parse and validate one frame; any problem is a WireError."""
    if len(frame) > MAX_FRAME:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    try:
        data = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not a msgpack frame: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise WireError("frame is not a map")
    version = data.get("v")
    # (True == 1 and 1.0 == 1 in Python: insist on a real int)
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {_short(version)} "
                        f"(this side speaks {PROTOCOL_VERSION})")
    mtype, node, seq, body = data.get("type"), data.get("node"), data.get("seq"), data.get("body")
    mid, ts = data.get("id"), data.get("ts")
    if not isinstance(mtype, str) or mtype not in TYPES:  # (a list is unhashable)
        raise WireError(f"unknown message type {_short(mtype)}")
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE_NAME \
            or not _NODE_RE.fullmatch(node):
        raise WireError("bad node name")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise WireError("bad sequence number")
    if not isinstance(mid, str) or not 0 < len(mid) <= MAX_ID:
        raise WireError("bad message id")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        raise WireError("bad timestamp")
    if not isinstance(body, dict):
        raise WireError("body is not a map")
    _validate_body(mtype, body)
    return Envelope(type=mtype, node=node, seq=seq, body=body, id=mid, ts=float(ts), v=version)


def _short(value: Any) -> str:
    """repr() of an untrusted value, bounded for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def _validate_body(mtype: str, body: dict[str, Any]) -> None:
    if mtype == HELLO:
        _require(body, "version", str, mtype)
        _require(body, "gpus", int, mtype)
        _require(body, "interval_s", (int, float), mtype)
    if mtype in (REPORT, EVENT):
        _require(body, "verdict", str, mtype)
        _require(body, "findings", list, mtype)
        for f in body["findings"]:
            if not isinstance(f, dict) or not isinstance(f.get("check"), str) or \
                    not isinstance(f.get("severity"), str):
                raise WireError(f"{mtype}: malformed finding")
    if mtype == REPORT:
        # facts: a map, or (as the agent sends them) that map pre-packed as msgpack bytes,
        # which the collector stores as they are instead of decoding ~13 KB per report.
        _require(body, "facts", (dict, bytes), mtype, optional=True)
        _require(body, "ok_checks", list, mtype, optional=True)
        _require(body, "summary", (dict, bytes), mtype, optional=True)
        _require(body, "throttle", int, mtype, optional=True)
        # (set of the item types, built in C: ~25 ids per report, on the ingest hot path)
        if not set(map(type, body.get("ok_checks") or ())) <= {str}:
            raise WireError("report: ok_checks must be check ids")
    if mtype == EVENT:
        _require(body, "kind", str, mtype)
        _require(body, "gpu", int, mtype, optional=True)
        _require(body, "data", int, mtype, optional=True)
        _require(body, "message", str, mtype, optional=True)
        if len(body.get("message") or "") > XID_MESSAGE_MAX:
            raise WireError(f"event: message longer than {XID_MESSAGE_MAX} characters")
    if mtype == ACK:
        _require(body, "seqs", list, mtype)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                   for s in body["seqs"]):
            raise WireError("ack: seqs must be non-negative integers")
    if mtype == COMMAND:
        _require(body, "command", str, mtype)
        _require(body, "args", dict, mtype, optional=True)
    if mtype == COMMAND_RESULT:
        _require(body, "command_id", str, mtype)
        _require(body, "ok", bool, mtype)
        _require(body, "result", dict, mtype, optional=True)
