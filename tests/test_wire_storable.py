"""What the wire accepts, both store backends can store (issue 28, item 6): strings with
NUL (PostgreSQL's text cannot hold it), summary values of another type than their
column's, are refused at the wire; a message the store refuses
anyway costs its batch a few transactions, not one per message; and a node sending NUL
reports leaves other nodes' ingest alone on a real collector on PostgreSQL.

Before: a finding message with NUL passed the wire; PostgreSQL refused the batch and the
collector re-stored it one message per transaction, for every such report."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Any

import msgpack
import pytest

from slurmgpu import wire
from slurmgpu.collector.app import Collector
from slurmgpu.collector.store import Store
from slurmgpu.wire import REPORT, WireError, decode_received
from tests.test_collector import Agent
from tests.test_wire_fuzz import BODIES, acked_all, rig, serve_until  # noqa: F401

NUL_VALUES = ["\x00", "gpu\x00ecc", "x" * 15 + "\x00"]
# Every string the collector stores from a frame (the envelope's id is not stored, but
# is refused alike), as (type, path).
STRING_FIELDS: list[tuple[str, tuple[Any, ...]]] = [
    (REPORT, ("id",)), (REPORT, ("body", "verdict")), (REPORT, ("body", "ok_checks", 0)),
    *[(t, ("body", "findings", 0, k)) for t in (REPORT, wire.EVENT) for k in ("check", "severity", "subject", "message")],
    (REPORT, ("body", "findings", 0, "data")),
    (REPORT, ("body", "summary", "gpus", 0, 1)), (REPORT, ("body", "summary", "gpus", 0, 2)),
    (REPORT, ("body", "summary", "ib", 0, 0)), (REPORT, ("body", "summary", "ib", 0, 1)),
    *[(REPORT, ("body", "summary", "versions", i)) for i in range(8)],
    (wire.EVENT, ("body", "kind")), (wire.EVENT, ("body", "message")), (wire.EVENT, ("body", "verdict")),
    (wire.HELLO, ("body", "version")), (wire.COMMAND_RESULT, ("body", "command_id")),
]
# A summary value of each kind, in every stored column (gpus: serial, model, 6 counters;
# ib: port state, rate, 6 counters; versions: 8 strings).
SUMMARY_COLUMNS = ([("gpus", 0, i) for i in range(1, 9)] + [("ib", 0, i) for i in range(1, 9)]
                   + [("versions", i) for i in range(8)])
KINDS = ["abc", 7, 1.5, 1e300, -(2**63), True, None]


def frame(mtype: str, path: tuple[Any, ...], value: Any, seq: int, node: str = "gpu-s1") -> bytes:
    """A valid frame of ``mtype`` (``BODIES``'; a report's or event's finding with data)
    with ``value`` at ``path`` (at ``data``: as a key and as a value), the report's facts
    and summary packed as agents send them."""
    tree: dict[str, Any] = {"v": 1, "id": f"{seq:032x}", "node": node, "seq": seq, "ts": 1.79e9,
                            "type": mtype, "epoch": "e0", "body": copy.deepcopy(BODIES[mtype])}
    if mtype in (REPORT, wire.EVENT):
        tree["body"]["findings"] = [dict(BODIES[REPORT]["findings"][0], data={"k": "v"})]
    target: Any = tree
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = {value: 1, "v": value} if path[-1] == "data" else value
    if mtype == REPORT:
        tree["body"]["facts"] = wire.packed(tree["body"]["facts"])
        tree["body"]["summary"] = wire.packed(tree["body"]["summary"])
    return msgpack.packb(tree, use_bin_type=True)


def answer(decoder: Any, data: bytes) -> tuple[str, str]:
    try:
        env, _body = decoder(data)
    except WireError as exc:
        return ("error", str(exc))
    return ("ok", env.type)


@pytest.mark.parametrize(("mtype", "path"), STRING_FIELDS, ids=lambda x: "/".join(map(str, x))
                         if isinstance(x, tuple) else x)
@pytest.mark.parametrize("value", NUL_VALUES, ids=["nul", "inner-nul", "last-nul"])
def test_nul_is_refused_in_every_stored_string(mtype: str, path: tuple[Any, ...], value: str) -> None:
    for seq in (1, 2):  # (the second: a node already known)
        plain = answer(decode_received, frame(mtype, path, value, seq))
        assert plain[0] == "error", plain
    assert answer(decode_received, frame(mtype, path, "ok", 3)) == ("ok", mtype)


@pytest.mark.parametrize("column", SUMMARY_COLUMNS, ids=lambda c: "/".join(map(str, c)))
def test_summary_values_of_another_kind_than_their_column_are_refused(column: tuple[Any, ...]) -> None:
    text = column[0] == "versions" or column in (("gpus", 0, 1), ("gpus", 0, 2), ("ib", 0, 1))
    real = column == ("ib", 0, 2)
    for value in KINDS:
        data = frame(REPORT, ("body", "summary", *column), value, 5)
        plain = answer(decode_received, data)
        fits = value is None or (isinstance(value, str) if text else
                                 isinstance(value, int | float) if real else isinstance(value, int))
        assert plain[0] == ("ok" if fits else "error"), (value, plain)


def test_what_the_wire_accepts_both_backends_store(store_url: str) -> None:
    """Every string field with NUL and every summary column with every kind of value:
    each frame the wire accepts is stored without an error, on SQLite and PostgreSQL."""
    store = Store(store_url)
    try:
        cases = [(t, p, v) for t, p in STRING_FIELDS for v in [*NUL_VALUES, "fine"]]
        cases += [(REPORT, ("body", "summary", *c), v) for c in SUMMARY_COLUMNS for v in KINDS]
        accepted = 0
        for seq, (mtype, path, value) in enumerate(cases, start=1):
            try:
                env, body = decode_received(frame(mtype, path, value, seq))
            except WireError:
                continue
            store.store_batch([(env.node, env, body)])  # an error here fails the test
            accepted += 1
        assert accepted > len(STRING_FIELDS)  # ("fine" everywhere, and the summary kinds that fit)
    finally:
        store.close()


# --------------------------------------------------------------------------- the collector

def test_a_message_the_store_refuses_costs_its_batch_a_few_transactions(
        rig: tuple[Collector, Agent, Agent], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        store_url: str) -> None:
    """A message the wire let through but neither backend can store (a seq past int64,
    as a wire missing that bound would pass it) in a batch of 64: it is refused, the 63
    others are stored and acked, in at most 2 log2(64) + 1 transactions (one a message:
    65)."""
    collector, bad, good = rig
    real_decode = decode_received

    def lax_decode(data: bytes) -> tuple[wire.Envelope, bytes]:  # a wire that missed a bound
        env, body = real_decode(data)
        return (replace(env, seq=2**63 + env.seq) if (env.node, env.seq) == ("gpu-a", 7) else env), body

    monkeypatch.setattr(wire, "decode_received", lax_decode)
    monkeypatch.setattr(collector.transport, "max_batch_read_s", 2.0)  # (a loaded machine: still one batch)
    good.report(1)
    bad.report(1)  # (both connections up: the batch below arrives whole)
    serve_until(collector, 2)
    acked_all(good, {1})
    calls = []
    real_store = collector.store.store_batch

    def counting(batch: Any, **kw: Any) -> list[tuple[str, int]]:
        calls.append(len(batch))
        return real_store(batch, **kw)

    monkeypatch.setattr(collector.store, "store_batch", counting)
    for seq in range(2, 34):
        good.report(seq)
    bad.report(7)
    for seq in range(34, 65):
        good.report(seq)
    time.sleep(0.5)  # (all 64 queued before the loop reads them)
    serve_until(collector, 66)
    acked_all(good, set(range(2, 65)))
    assert collector.counters.rejected["store"] == 1 and collector.counters.store_errors == 0
    # (a loaded machine may read the 64 as two batches: the bad one's still costs ~2 log2 n + 1)
    assert calls[0] >= 32 and len(calls) <= 15 and sum(calls) <= 3 * 64, calls
    assert collector.store.count("messages") == 65


def test_a_node_sending_nul_leaves_other_nodes_alone(rig: tuple[Collector, Agent, Agent],  # noqa: F811
                                                     store_url: str) -> None:
    """Through a real collector, on each backend: the NUL reports are refused at the wire
    (acked as rejected, never stored, the store never fails), the other node's reports
    are stored in batches beside them."""
    collector, bad, good = rig
    finding = {"check": "gpu.thermal", "severity": "WARN", "gpu": 0, "subject": None, "message": "hot\x00"}
    for seq in range(1, 41):
        bad.sock.send(wire.encode_unchecked(wire.Envelope(
            type=REPORT, node="gpu-a", seq=seq, body={"verdict": "WARN", "findings": [finding]})))
        good.report(seq)
    serve_until(collector, 80)
    acked_all(good, set(range(1, 41)))
    assert collector.counters.rejected["malformed"] == 40
    assert collector.counters.store_errors == 0 and not collector.counters.rejected.get("store")
    assert collector.store.count("messages") == 40


def test_an_agents_text_with_nul_is_sent_with_a_replacement_character() -> None:
    """The sending side of the rule: an agent's report or event whose text holds NUL (a
    device string, a kernel log line, a finding's message or data) is still encoded and
    accepted, each NUL as U+FFFD, instead of being dropped as unencodable."""
    from slurmgpu.result import Finding, Severity
    from slurmgpu.summary import report_fields
    from slurmgpu.testing import make_facts

    facts = make_facts()
    facts.nvml.gpus[0].serial = "SN\x00001"
    finding = Finding("xid.recent", Severity.FAIL, "Xid 79\x00", gpu=0, data={"text\x00": ["a\x00"]})
    report = {"verdict": "FAIL", "findings": wire.encode_findings([finding]), **report_fields(facts)}
    event = {"kind": "xid", "gpu": 0, "data": 79, "verdict": "FAIL", "findings": [], "message": "NVRM\x00 Xid"}
    for mtype, body in ((REPORT, report), (wire.EVENT, event)):
        env, _body = decode_received(wire.message_frame(mtype, "gpu-s2", 1, body, epoch="e0"))
        assert "\x00" not in repr(env.body) and "\ufffd" in repr(env.body)
    summary = msgpack.unpackb(report["summary"])
    assert summary["gpus"][0][1] == "SN\ufffd001"


def test_the_wire_knows_a_kind_for_every_summary_field() -> None:
    """The summary's column kinds follow slurmgpu.summary's fields, one for one."""
    from slurmgpu import wiresummary
    from slurmgpu.summary import GPU_FIELDS, IB_FIELDS, VERSION_FIELDS

    assert len(wiresummary._GPU_COLUMNS) == len(GPU_FIELDS)
    assert len(wiresummary._IB_COLUMNS) == len(IB_FIELDS)
    assert len(wiresummary._VERSION_COLUMNS) == len(VERSION_FIELDS)
