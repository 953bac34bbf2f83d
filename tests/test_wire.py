"""The wire envelope: round trips, every validation error, frame bounds, and fuzzing
(``decode`` never raises anything but WireError)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu import wire
from slurmgpu.wire import Envelope, WireError, decode, encode

FINDING = {"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 3, "message": "DBE"}
BODIES: dict[str, dict[str, Any]] = {
    wire.HELLO: {"version": "0.1.0", "gpus": 8, "interval_s": 30.0},
    wire.REPORT: {"verdict": "FAIL", "findings": [FINDING], "facts": {"driver": "550.54"}},
    wire.EVENT: {"kind": "xid", "gpu": 2, "data": 79, "verdict": "FAIL", "findings": [FINDING]},
    wire.HEARTBEAT: {},
    wire.ACK: {"seqs": [1, 2, 17]},
    wire.COMMAND: {"command": "recheck", "args": {"checks": ["ecc"]}},
    wire.COMMAND_RESULT: {"command_id": "c0ffee", "ok": True, "result": {"verdict": "OK"}},
    wire.BUNDLE: {"frames": [b"\x80", b"spooled frame"]},
}


def frame(**overrides: Any) -> bytes:
    """A valid report frame with some top-level fields replaced (or removed with ...)."""
    data: dict[str, Any] = {"v": 1, "id": "a" * 32, "node": "gpu-n1", "seq": 5,
                            "ts": 1790000000.5, "type": "report", "body": BODIES[wire.REPORT]}
    for key, value in overrides.items():
        if value is ...:
            data.pop(key)
        else:
            data[key] = value
    return msgpack.packb(data, use_bin_type=True)


def body_frame(mtype: str, body: Any) -> bytes:
    return frame(type=mtype, body=body)


def test_types_cover_the_bodies() -> None:
    assert set(BODIES) == wire.TYPES


@pytest.mark.parametrize("mtype", sorted(wire.TYPES))
def test_round_trip_every_type(mtype: str) -> None:
    seq = 0 if mtype == wire.HEARTBEAT else 42
    message = Envelope(type=mtype, node="gpu-h100-001.cluster_a", seq=seq, body=BODIES[mtype])
    back = decode(encode(message))
    assert back == message
    assert back.to_dict() == message.to_dict()


def test_integer_timestamp_becomes_float() -> None:
    assert decode(frame(ts=1790000000)).ts == 1790000000.0


@pytest.mark.parametrize(("overrides", "match"), [
    ({"v": 2}, "unsupported protocol version 2"),
    ({"v": ...}, "unsupported protocol version None"),
    ({"v": True}, "unsupported protocol version True"),
    ({"v": 1.0}, "unsupported protocol version 1.0"),
    ({"v": "1"}, "unsupported protocol version"),
    ({"type": "gossip"}, "unknown message type 'gossip'"),
    ({"type": ...}, "unknown message type None"),
    ({"type": ["report"]}, "unknown message type"),
    ({"type": {"a": 1}}, "unknown message type"),
    ({"node": ""}, "bad node name"),
    ({"node": "x" * 129}, "bad node name"),
    ({"node": 7}, "bad node name"),
    ({"node": "gpu n1"}, "bad node name"),
    ({"node": "gpu-n1\n"}, "bad node name"),
    ({"node": "../etc"}, "bad node name"),
    ({"node": ...}, "bad node name"),
    ({"seq": -1}, "bad sequence number"),
    ({"seq": True}, "bad sequence number"),
    ({"seq": False}, "bad sequence number"),
    ({"seq": 1.5}, "bad sequence number"),
    ({"seq": "1"}, "bad sequence number"),
    ({"seq": ...}, "bad sequence number"),
    ({"id": ""}, "bad message id"),
    ({"id": "x" * 65}, "bad message id"),
    ({"id": 12}, "bad message id"),
    ({"id": ...}, "bad message id"),
    ({"ts": "now"}, "bad timestamp"),
    ({"ts": True}, "bad timestamp"),
    ({"ts": math.nan}, "bad timestamp"),
    ({"ts": math.inf}, "bad timestamp"),
    ({"ts": ...}, "bad timestamp"),
    ({"body": []}, "body is not a map"),
    ({"body": None}, "body is not a map"),
    ({"body": ...}, "body is not a map"),
])
def test_envelope_errors(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode(frame(**overrides))


def test_node_name_limits() -> None:
    assert decode(frame(node="x" * 128)).node == "x" * 128
    assert decode(frame(node="a.B_9-z")).node == "a.B_9-z"
    assert decode(frame(id="x" * 64)).id == "x" * 64


@pytest.mark.parametrize(("mtype", "body", "match"), [
    # hello
    ("hello", {"gpus": 8, "interval_s": 30.0}, "'version'"),
    ("hello", {"version": "1", "gpus": True, "interval_s": 30.0}, "'gpus'"),
    ("hello", {"version": "1", "gpus": 8, "interval_s": "30"}, "'interval_s'"),
    # report / event: findings
    ("report", {"findings": []}, "'verdict'"),
    ("report", {"verdict": "OK"}, "'findings'"),
    ("report", {"verdict": "OK", "findings": {}}, "'findings'"),
    ("report", {"verdict": "OK", "findings": ["x"]}, "malformed finding"),
    ("report", {"verdict": "OK", "findings": [{"check": "a"}]}, "malformed finding"),
    ("report", {"verdict": "OK", "findings": [{"severity": "OK"}]}, "malformed finding"),
    ("report", {"verdict": "OK", "findings": [{"check": 1, "severity": "OK"}]},
     "malformed finding"),
    ("report", {"verdict": "OK", "findings": [], "facts": []}, "'facts'"),
    ("event", {"verdict": "OK", "findings": [FINDING]}, "'kind'"),
    ("event", {"kind": "xid", "verdict": "OK", "findings": [[]]}, "malformed finding"),
    ("event", {"kind": "xid", "gpu": "0", "verdict": "OK", "findings": []}, "'gpu'"),
    ("event", {"kind": "xid", "data": 7.5, "verdict": "OK", "findings": []}, "'data'"),
    # ack
    ("ack", {}, "'seqs'"),
    ("ack", {"seqs": "1,2"}, "'seqs'"),
    ("ack", {"seqs": [1, "2"]}, "seqs must be non-negative integers"),
    ("ack", {"seqs": [1, True]}, "seqs must be non-negative integers"),
    ("ack", {"seqs": [1.0]}, "seqs must be non-negative integers"),
    ("ack", {"seqs": [-3]}, "seqs must be non-negative integers"),
    # command / command-result
    ("command", {}, "'command'"),
    ("command", {"command": 5}, "'command'"),
    ("command", {"command": "recheck", "args": [1]}, "'args'"),
    ("command-result", {"ok": True}, "'command_id'"),
    ("command-result", {"command_id": "c1"}, "'ok'"),
    ("command-result", {"command_id": "c1", "ok": 1}, "'ok'"),
    ("command-result", {"command_id": 1, "ok": True}, "'command_id'"),
    ("command-result", {"command_id": "c1", "ok": False, "result": "boom"}, "'result'"),
])
def test_body_errors(mtype: str, body: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode(body_frame(mtype, body))
    with pytest.raises(WireError, match=match):  # the sender refuses it too
        encode(Envelope(type=mtype, node="n1", seq=1, body=body))


def test_optional_fields_may_be_absent_or_none() -> None:
    decode(body_frame("event", {"kind": "gpu_lost", "gpu": None, "data": None,
                                "verdict": "FAIL", "findings": []}))
    decode(body_frame("report", {"verdict": "OK", "findings": []}))
    decode(body_frame("command", {"command": "recheck"}))
    decode(body_frame("command-result", {"command_id": "c1", "ok": False}))


@pytest.mark.parametrize("junk", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x01", b"\xa3abc",
                                  msgpack.packb({1: 2}), msgpack.packb({"v": 1}) + b"\x00",
                                  b"\xdf\xff\xff\xff\xff"])
def test_not_a_message(junk: bytes) -> None:
    with pytest.raises(WireError):
        decode(junk)


def test_oversized_frame_rejected_on_encode_and_decode() -> None:
    big = {"verdict": "OK", "findings": [], "facts": {"blob": "x" * wire.MAX_FRAME}}
    with pytest.raises(WireError, match=r"report message is \d+ bytes \(max 1048576\)"):
        encode(Envelope(type="report", node="n1", seq=1, body=big))
    raw = msgpack.packb({"v": 1, "id": "a", "node": "n1", "seq": 1, "ts": 1.0, "type": "report",
                         "body": big}, use_bin_type=True)
    with pytest.raises(WireError, match="exceeds 1048576"):
        decode(raw)
    # Just under the bound is fine.
    filler = wire.MAX_FRAME - len(encode(Envelope(type="report", node="n1", seq=1, id="a", ts=1.0,
                                                  body={"verdict": "OK", "findings": [],
                                                        "facts": {"blob": ""}}))) - 8
    ok = Envelope(type="report", node="n1", seq=1, id="a", ts=1.0,
                  body={"verdict": "OK", "findings": [], "facts": {"blob": "x" * filler}})
    assert len(encode(ok)) <= wire.MAX_FRAME


def test_unencodable_body_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="cannot be encoded"):
        encode(Envelope(type="report", node="n1", seq=1,
                        body={"verdict": "OK", "findings": [], "facts": {"x": object()}}))


# ---------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20))
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
keys = st.sampled_from(["v", "id", "node", "seq", "ts", "type", "body"]) | st.text(max_size=6)
# Envelope-shaped maps whose fields are sometimes right and sometimes anything at all.
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "v": st.just(1) | values,
        "id": st.just("abc") | values,
        "node": st.just("gpu-n1") | values,
        "seq": st.integers(min_value=0, max_value=10) | values,
        "ts": st.just(1.5) | values,
        "type": st.sampled_from(sorted(wire.TYPES)) | values,
        "body": st.fixed_dictionaries({}, optional={
            k: values for k in ("version", "gpus", "interval_s", "verdict", "findings", "facts",
                                "kind", "gpu", "data", "seqs", "command", "args", "command_id",
                                "ok", "result")}) | values,
    },
)


def _decodes_or_wire_error(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode(raw)


@FUZZ
@given(st.binary(max_size=4096))
def test_decode_arbitrary_bytes(raw: bytes) -> None:
    _decodes_or_wire_error(raw)


@FUZZ
@given(st.dictionaries(keys, values, max_size=8) | envelopes)
def test_decode_arbitrary_maps(data: dict[str, Any]) -> None:
    _decodes_or_wire_error(msgpack.packb(data, use_bin_type=True))


@FUZZ
@given(values)
def test_decode_arbitrary_values(data: Any) -> None:
    _decodes_or_wire_error(msgpack.packb(data, use_bin_type=True))


@pytest.mark.parametrize("mtype", sorted(wire.TYPES))
def test_truncated_frames(mtype: str) -> None:
    raw = encode(Envelope(type=mtype, node="n1", seq=1, body=BODIES[mtype]))
    for end in range(len(raw)):
        with pytest.raises(WireError):
            decode(raw[:end])


@FUZZ
@given(st.sampled_from(sorted(wire.TYPES)), st.data())
def test_mutated_frames(mtype: str, data: st.DataObject) -> None:
    raw = bytearray(encode(Envelope(type=mtype, node="n1", seq=1, body=BODIES[mtype])))
    i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[i] = data.draw(st.integers(min_value=0, max_value=255))
    _decodes_or_wire_error(bytes(raw))


# ---------------------------------------------------------------- the collector's fast paths

REPORT_FIELDS = {"verdict": st.just("WARN") | st.text(max_size=20) | values,
                 "findings": st.just([]) | st.just([FINDING]) | st.lists(values, max_size=2) | values,
                 "ok_checks": st.just(["gpu.ecc", "gpu.temp"]) | st.lists(st.text(max_size=130), max_size=3)
                 | values,
                 "facts": st.just(b"\x80") | st.just({"a": 1}) | values,
                 "summary": st.just(wire.packed({"gpus": [[0, 1, 2.5]], "versions": ["550"]}))
                 | st.just({"gpus": [[0, "x" * 300]]}) | st.just(b"\xc1") | values,
                 "throttle": st.just(0) | st.integers(min_value=-2, max_value=2**33) | values}


def _outcome(validate: Any, body: dict[str, Any]) -> Any:
    try:
        return validate(body)
    except WireError as exc:
        return f"WireError: {exc}"


@FUZZ
@given(st.fixed_dictionaries({}, optional=REPORT_FIELDS))
def test_report_fast_path_is_the_checked_one(body: dict[str, Any]) -> None:
    """``_report`` checks the common case inline and hands everything else to
    ``_report_checked``: the same bodies pass, with the same findings, the same error."""
    assert _outcome(wire._report, body) == _outcome(wire._report_checked, body)


def test_checked_names_are_remembered_per_field() -> None:
    """Node names and epochs that passed are remembered, each for its own field: a node
    name too long for an epoch is still refused as one."""
    long = "n" * (wire.MAX_EPOCH + 1)
    assert decode(frame(node=long)).node == long
    with pytest.raises(WireError, match="bad epoch"):
        decode(frame(node=long, epoch=long))
    assert decode(frame(epoch="e1")).epoch == "e1"
    with pytest.raises(WireError, match="bad epoch"):
        decode(frame(epoch=0))


def _pairs_frame(pairs: list[tuple[Any, Any]], header: bytes | None = None) -> bytes:
    """A map frame packed pair by pair (any key order, any encoding of the values)."""
    packer = msgpack.Packer(use_bin_type=True)
    out = header if header is not None else packer.pack_map_header(len(pairs))
    for key, value in pairs:
        out += packer.pack(key) + (value if isinstance(value, bytes) else packer.pack(value))
    return out


@pytest.mark.parametrize("layout", ["encode", "epoch", "body_first", "epoch_before_body", "str8_body",
                                    "float32_ts_after_body"])
def test_body_bytes_are_the_bytes_received(layout: str) -> None:
    """``body_bytes`` gives the body's bytes as they are in the frame, whatever the key
    order and encoding (re-packed only where that gives the same bytes)."""
    body = {"verdict": "OK", "findings": [], "summary": wire.packed({"versions": ["550.54"] * 8})}
    canonical = wire.packed(body)
    str8 = b"\x83" + b"\xd9\x07verdict" + b"\xd9\x02OK" + canonical[1 + 8 + 3:]  # same map, other bytes
    head = [("v", 1), ("id", "a" * 32), ("node", "n1"), ("seq", 3), ("ts", 1.5), ("type", "report")]
    raw = {"encode": lambda: encode(Envelope(type="report", node="n1", seq=3, body=body, ts=1.5)),
           "epoch": lambda: encode(Envelope(type="report", node="n1", seq=3, body=body, ts=1.5, epoch="e1")),
           "body_first": lambda: _pairs_frame([("body", canonical), *head]),
           "epoch_before_body": lambda: _pairs_frame([*head, ("epoch", "e1"), ("body", canonical)]),
           "str8_body": lambda: _pairs_frame([*head, ("body", str8), ("epoch", "e1")]),
           "float32_ts_after_body": lambda: _pairs_frame([*head[:4], ("type", "report"), ("body", canonical),
                                                          ("ts", b"\xca" + bytes.fromhex("3fc00000"))]),
           }[layout]()
    env = decode(raw)
    assert env.body == body
    got = wire.body_bytes(raw, env.body, env.epoch)
    assert got == wire.raw_body(raw)
    assert msgpack.unpackb(got, raw=False) == body
    if layout == "str8_body":
        assert got == str8
