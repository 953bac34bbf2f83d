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
    report          {"verdict": str, "findings": [finding...], "facts": {...}}  (periodic)
    event           {"kind": "xid"|"ecc_sbe"|"ecc_dbe"|"clock"|"gpu_lost"|..., "gpu": int|None,
                     "data": int|None, "verdict": str, "findings": [finding...]}
    heartbeat       {}                         (no ack, no seq needed: seq 0)
    ack             {"seqs": [int, ...]}       (collector -> agent)
    command         {"command": str, "args": {...}}   (collector -> agent)
    command-result  {"command_id": str, "ok": bool, "result": {...}}
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack

from slurmgpu.errors import SlurmGpuError

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a full 8-GPU report is ~20 KiB
MAX_NODE_NAME = 128

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
    frame: bytes = msgpack.packb(message.to_dict(), use_bin_type=True)
    if len(frame) > MAX_FRAME:
        raise WireError(f"{message.type} message is {len(frame)} bytes (max {MAX_FRAME})")
    return frame


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
    if version != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {version!r} (this side speaks {PROTOCOL_VERSION})")
    mtype, node, seq, body = data.get("type"), data.get("node"), data.get("seq"), data.get("body")
    mid, ts = data.get("id"), data.get("ts")
    if mtype not in TYPES:
        raise WireError(f"unknown message type {mtype!r}")
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE_NAME:
        raise WireError("bad node name")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise WireError("bad sequence number")
    if not isinstance(mid, str) or not 0 < len(mid) <= 64:
        raise WireError("bad message id")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise WireError("bad timestamp")
    if not isinstance(body, dict):
        raise WireError("body is not a map")
    _validate_body(mtype, body)
    return Envelope(type=mtype, node=node, seq=seq, body=body, id=mid, ts=float(ts), v=version)


def _require(body: dict[str, Any], key: str, kind: type, mtype: str) -> None:
    value = body.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise WireError(f"{mtype}: field {key!r} missing or of the wrong type")


def _validate_body(mtype: str, body: dict[str, Any]) -> None:
    if mtype in (REPORT, EVENT):
        _require(body, "verdict", str, mtype)
        _require(body, "findings", list, mtype)
        for f in body["findings"]:
            if not isinstance(f, dict) or not isinstance(f.get("check"), str) or \
                    not isinstance(f.get("severity"), str):
                raise WireError(f"{mtype}: malformed finding")
    if mtype == EVENT:
        _require(body, "kind", str, mtype)
    if mtype == ACK:
        _require(body, "seqs", list, mtype)
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in body["seqs"]):
            raise WireError("ack: seqs must be integers")
    if mtype == COMMAND:
        _require(body, "command", str, mtype)
    if mtype == COMMAND_RESULT:
        _require(body, "command_id", str, mtype)
        _require(body, "ok", bool, mtype)
