"""The collector's decoding of received frames (``wire.decode_received``): ``wire.decode``'s
envelope with the body's bytes as received, and every bound of the protocol a WireError.
Checked on the frames agents send, on unusual valid frames, on bad, broken and generated
frames, and through a real collector."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu import wire
from slurmgpu.result import Finding, Severity
from slurmgpu.summary import report_fields
from slurmgpu.testing import make_facts
from slurmgpu.wire import (
    EVENT,
    HEARTBEAT,
    HELLO,
    REPORT,
    Envelope,
    WireError,
    bundle_frame,
    decode,
    decode_received,
)
from tests.test_collector import NODES, Agent, ctx, db_rows, keys_dir, make_settings, running  # noqa: F401

NODE = "gpu-fast-1"
FACTS = make_facts()
SUMMARY_FIELDS = report_fields(FACTS)  # throttle, and the summary packed as agents send it
DELTA = {"verdict": "OK", "findings": [], "ok_checks": ["gpu.count", "gpu.ecc", "ib.ports"], **SUMMARY_FIELDS}
FULL = {**DELTA, "facts": wire.packed(wire.plain(FACTS.to_json()))}
# Findings as checks make them (wire.encode_findings), their data as deep as checks nest it
FINDINGS = wire.encode_findings([
    Finding("gpu.thermal", Severity.WARN, "GPU 3 at 87 C", gpu=3, data={"margin_c": 2.5}),
    Finding("ib.counters", Severity.FAIL, "symbol errors rising", subject="mlx5_0/1",
            data={"counters": {"symbol_error": 12, "link_downed": 1}}),
    Finding("pins.vbios", Severity.WARN, "GPUs run different VBIOS versions",
            data={"versions": {"96.00.99": [0, 1, 2], "96.00.98": [3]}, "note": None, "ok": True}),
    Finding("xid.recent", Severity.UNKNOWN, "could not read", not_applicable=True)])
WARN = {**DELTA, "verdict": "FAIL", "findings": FINDINGS}


def tree(body: dict[str, Any], seq: int = 5, **envelope: Any) -> dict[str, Any]:
    """A report envelope as a map, in ``Envelope.to_dict``'s order."""
    out: dict[str, Any] = {"v": 1, "id": f"{seq:032x}", "node": NODE, "seq": seq, "ts": 1.79e9,
                           "type": REPORT, "body": body, "epoch": "e0"}
    out.update(envelope)
    return out


def frame_of(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def strict(value: Any) -> Any:
    """``value`` with every type spelled out (True == 1 and 1.0 == 1 in Python; here they
    differ), NaN comparable."""
    if isinstance(value, Envelope):
        return ("Envelope", strict(dict(value.__dict__)))
    if isinstance(value, dict):
        return ("dict", [(strict(k), strict(v)) for k, v in sorted(value.items(), key=repr)])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [strict(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, repr(value))


def outcome(decoder: Any, frame: bytes) -> Any:
    try:
        return ("ok", strict(decoder(frame)))
    except WireError as exc:
        return ("error", type(exc).__name__, str(exc))


# --------------------------------------------------------------------------- agents' frames


@pytest.mark.parametrize("frame", [
    frame_of(tree(DELTA)),
    frame_of(tree(FULL)),
    frame_of({k: v for k, v in tree(DELTA).items() if k != "epoch"}),  # an epoch-less sender
    frame_of(tree(DELTA, ts=1790000000)),  # an integer timestamp: a float, as decode makes it
    frame_of(tree({**DELTA, "throttle": None, "ok_checks": None})),
    frame_of(tree({"verdict": "OK", "findings": []})),
    frame_of(tree(WARN)),
    frame_of(tree({**WARN, "findings": [{"check": "c", "severity": "weird"}]})),  # UNKNOWN, as decode makes it
    bundle_frame(NODE, [frame_of(tree(DELTA, seq=s)) for s in range(1, 33)]),
], ids=["delta", "full", "no-epoch", "int-ts", "nils", "bare", "findings", "odd-severity", "bundle"])
def test_agents_frames_are_decoded_with_their_body_bytes(frame: bytes) -> None:
    env, body = decode_received(frame)
    assert strict(env) == strict(decode(frame)) and env.findings == decode(frame).findings
    assert body == (b"" if env.type == wire.BUNDLE else frame[frame.index(body):frame.index(body) + len(body)])
    assert body == b"" or msgpack.unpackb(body) == env.body


def test_the_body_kept_is_the_body_received() -> None:
    frame = frame_of(tree(FULL))
    _env, body = decode_received(frame)
    assert msgpack.unpackb(body) == FULL and frame.endswith(body + frame_of("epoch") + frame_of("e0"))
    assert decode_received(bundle_frame(NODE, [frame]))[1] == b""  # (a bundle's body is not stored)


def finding(**changes: Any) -> dict[str, Any]:
    return {**FINDINGS[0], **changes}


@pytest.mark.parametrize("frame", [
    frame_of(tree({**WARN, "findings": [finding(extra=1)]})),  # a key a finding does not have
    frame_of(tree({**WARN, "findings": [finding(data={"a": {"b": {"c": 1}}})]})),  # nested deeper
    frame_of(tree({**WARN, "findings": [finding(data={"a": [[1]]})]})),
    frame_of(tree({**WARN, "findings": [finding(data={"a": b"bytes"})]})),
    frame_of(tree({**WARN, "findings": [finding(data=[1, 2])]})),  # data that is no map: {}
    frame_of(tree({**WARN, "findings": [finding(not_applicable=[1])]})),
    frame_of(tree({**DELTA, "facts": {"gpus": []}})),  # facts as a map
    frame_of(tree({**DELTA, "summary": msgpack.unpackb(SUMMARY_FIELDS["summary"])})),
    frame_of(tree({**DELTA, "extra": 1})),  # a key a report does not have
    frame_of({**tree(DELTA), "extra": {"a": 2}}),
    frame_of(tree(DELTA, node="gpu-never-seen-before")),
    frame_of(tree(DELTA, epoch="epoch-never-seen")),
    frame_of(tree({**DELTA, "summary": frame_of({"gpus": [], "ib": [], "versions": []})})),
    frame_of(tree({"kind": "xid", "gpu": 2, "data": 79, "verdict": "FAIL", "findings": []}, type=EVENT)),
    frame_of(tree({}, type=HEARTBEAT)),
    frame_of(tree({"version": "1.0", "gpus": 8, "interval_s": 15.0}, type=HELLO)),
], ids=["finding-key", "data-deep", "data-list-of-lists", "data-bytes", "data-list", "not-applicable-list",
        "facts-map", "summary-map", "body-key", "envelope-key", "new-node", "new-epoch",
        "new-summary", "event", "heartbeat", "hello"])
def test_unusual_valid_frames_are_decoded(frame: bytes) -> None:
    env, body = decode_received(frame)
    assert strict(env) == strict(decode(frame))
    assert (body == b"") == (env.type not in wire.ACKED) and (not body or msgpack.unpackb(body) == env.body)


def test_a_node_first_heard_is_decoded_the_same_the_second_time() -> None:
    frame = frame_of(tree(DELTA, node="gpu-fast-new"))
    assert strict(decode_received(frame)) == strict(decode_received(frame))  # (names remembered)


@pytest.mark.parametrize(("path", "value"), [
    (("v",), True), (("v",), 1.0), (("v",), 2), (("seq",), -1), (("seq",), 2**63), (("seq",), True),
    (("ts",), math.nan), (("ts",), math.inf), (("ts",), -1.0), (("ts",), 1e12), (("ts",), "1"),
    (("id",), ""), (("id",), "x" * 65), (("node",), "bad node"), (("node",), b"gpu-fast-1"),
    (("epoch",), None), (("epoch",), 0), (("epoch",), "x" * 65), (("type",), "reports"),
    (("body", "verdict"), "x" * 17), (("body", "verdict"), "é" * 17), (("body", "verdict"), None),
    (("body", "findings"), None), (("body", "ok_checks"), ["x" * 129]), (("body", "ok_checks"), [1]),
    (("body", "ok_checks"), "gpu.ecc"), (("body", "throttle"), -1), (("body", "throttle"), 2**32),
    (("body", "throttle"), True), (("body", "summary"), "text"), (("body", "summary"), b"\xc1"),
    (("body", "facts"), "text"), (("body",), []), (("body",), None), (("extra",), {1: 2}),
    (("body", "extra"), {1: 2}),
    (("body", "findings"), [finding(check=None)]), (("body", "findings"), [finding(severity="x" * 17)]),
    (("body", "findings"), [finding(gpu=1024)]), (("body", "findings"), [finding(gpu=-1)]),
    (("body", "findings"), [finding(gpu=True)]), (("body", "findings"), [finding(subject="x" * 257)]),
    (("body", "findings"), [finding(message=5)]), (("body", "findings"), [finding(data={1: 2})]),
    (("body", "findings"), [finding(data={"a": {2: 1}})]), (("body", "findings"), ["finding"]),
    (("body", "findings"), [finding()] * (wire.MAX_FINDINGS + 1)),
    # NUL, which PostgreSQL's text cannot store (issue 28)
    (("id",), "0" * 31 + "\x00"), (("body", "verdict"), "OK\x00"), (("body", "ok_checks"), ["gpu.ecc", "a\x00"]),
    (("body", "findings"), [finding(check="gpu\x00")]), (("body", "findings"), [finding(severity="\x00")]),
    (("body", "findings"), [finding(subject="\x00")]), (("body", "findings"), [finding(message="hot\x00")]),
    (("body", "findings"), [finding(data={"a\x00": 1})]), (("body", "findings"), [finding(data={"a": ["\x00"]})]),
])
def test_bad_frames_are_a_wire_error(path: tuple[str, ...], value: Any) -> None:
    t = tree(copy.deepcopy(DELTA))
    target: Any = t
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    frame = frame_of(t)
    plain = outcome(decode_received, frame)
    assert plain[0] == "error", plain


@pytest.mark.parametrize("frame", [
    frame_of(tree(DELTA)) + b"\x00",  # trailing data
    frame_of(tree(DELTA))[:-3],  # cut short
    frame_of(tree(DELTA)).replace(b"\xa7verdict\xa2OK", b"\xa7verdict\xa2\xff\xfe"),  # not UTF-8
    b"\xc1",
    frame_of(tree(DELTA)) + b"\x00" * wire.MAX_FRAME,  # over the size bound
])
def test_broken_bytes_are_a_wire_error(frame: bytes) -> None:
    plain = outcome(decode_received, frame)
    assert plain[0] == "error", plain


def repeating(body_first: dict[str, Any], key: str = "body", value: Any = None) -> bytes:
    """A report frame whose map has ``key`` twice: first ``value`` (``body_first`` for
    the body), then the frame's own."""
    pairs = [frame_of(key) + frame_of(body_first if value is None else value)]
    pairs += [frame_of(k) + frame_of(v) for k, v in tree(DELTA).items()]
    return bytes((0x80 | len(pairs),)) + b"".join(pairs)


@pytest.mark.parametrize("frame", [
    repeating(WARN), repeating(DELTA), repeating({}, "node", NODE), repeating({}, "epoch", "e1"),
    repeating({}, "seq", 1),
], ids=["body", "same-body", "node", "epoch", "seq"])
def test_a_frame_repeating_a_key_is_refused(frame: bytes) -> None:
    """Which ``body`` counts? Neither: the frame is refused."""
    plain = outcome(decode_received, frame)
    assert plain[0] == "error" and "repeats a key" in plain[2], plain


# --------------------------------------------------------------------------- generated frames

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-0.0, 1e11, 1.79e9]),
    st.text(max_size=20), st.sampled_from(["OK", "WARN", "e0", NODE, "x" * 16, "x" * 17, "report", "bundle",
                                           "OK\x00", "\x00"]),
    st.binary(max_size=16), st.just(SUMMARY_FIELDS["summary"]),
    st.lists(st.one_of(st.text(max_size=5), st.integers(0, 3)), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), st.integers(0, 3), max_size=2))
ENVELOPE_KEYS = ["v", "id", "node", "seq", "ts", "type", "body", "epoch", "extra"]
BODY_KEYS = ["verdict", "findings", "ok_checks", "throttle", "summary", "facts", "extra"]
FINDING_KEYS = ["check", "severity", "gpu", "subject", "message", "not_applicable", "data", "extra"]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid report or bundle, with a few keys set to other values or dropped, and
    sometimes its bytes cut, extended or changed."""
    base = draw(st.sampled_from([DELTA, FULL, {"verdict": "WARN", "findings": []}, WARN]))
    t = tree(copy.deepcopy(base), seq=draw(st.integers(0, 2**63 - 1)))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["envelope", "body", "finding", "data"]))
        body = t.get("body") if isinstance(t.get("body"), dict) else None
        found = body.get("findings") if body is not None else None
        f = found[0] if isinstance(found, list) and found and isinstance(found[0], dict) else None
        if where == "finding" and f is not None:
            target, keys = f, FINDING_KEYS
        elif where == "data" and f is not None and isinstance(f.get("data"), dict):
            target, keys = f["data"], ["margin_c", "counters", "versions", "x"]
        elif where != "envelope" and body is not None:
            target, keys = body, BODY_KEYS
        else:
            target, keys = t, ENVELOPE_KEYS
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 4)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(VALUES)
    frame = frame_of(t)
    if draw(st.booleans()):
        frame = bundle_frame(NODE, [frame], ts=1.79e9, id="b" * 32) if frame else frame
    if draw(st.integers(0, 5)) == 0:
        at = draw(st.integers(0, len(frame) - 1))
        frame = frame[:at] + bytes([draw(st.integers(0, 255))]) + frame[at + 1:]
    return frame


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(frame=mutated_frames())
def test_generated_frames_are_decoded_or_a_wire_error(frame: bytes) -> None:
    got = outcome(decode_received, frame)  # (anything else raised fails the test)
    if got[0] == "ok":
        assert strict(decode(frame)) == got[1][1][0]


# --------------------------------------------------------------------------- a real collector


def test_a_collector_stores_reports_and_bundles_as_received(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                                             ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    node = NODES[0]
    with running(cfg):
        agent = Agent(ctx, cfg, keys_dir, node)
        agent.send(HELLO, 1, {"version": "1.2.3", "gpus": 8, "interval_s": 15.0})
        assert agent.acked() == [1]
        agent.send(REPORT, 2, FULL)
        assert agent.acked() == [2]
        reports = [wire.encode(Envelope(type=REPORT, node=node, seq=s, ts=1.79e9 + s, body=DELTA))
                   for s in range(3, 9)]
        agent.sock.send(bundle_frame(node, reports))
        deadline = time.monotonic() + 10
        acked: set[int] = set()
        while len(acked) < 6 and time.monotonic() < deadline:
            acked.update(agent.acked() or ())
        assert acked == set(range(3, 9))
    assert db_rows(cfg, "SELECT count(*) FROM messages") == [(8,)]
    [(seq, body)] = db_rows(cfg, "SELECT seq, body FROM reports")
    assert seq == 8 and msgpack.unpackb(bytes(body)) == DELTA
    [(facts,)] = db_rows(cfg, "SELECT facts FROM node_facts")
    assert bytes(facts) == FULL["facts"]
