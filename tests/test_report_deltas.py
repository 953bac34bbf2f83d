"""Issue 15: reports without facts. Agents send their facts (~13 KB for 8 GPUs) with the
first report, every ``[agent] full_report_s``, on a new connection and when the verdict
changes; the reports in between (~1 KB) carry the verdict, findings and summary, and
the collector keeps the node's last facts."""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgpack

from slurmgpu import wire
from slurmgpu.agent import Agent
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources
from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource, make_facts


def agent(tmp_path: Path, clock: FakeClock, full_report_s: float = 600.0) -> Agent:
    facts = make_facts("n1", gpus=8, ib_ports=8)
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    settings.agent.full_report_s = full_report_s
    node = Agent(settings, "n1", sources=Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                                                  FakeVersionSource(facts.versions), clock), clock=clock)
    node.open_spool()
    return node


def reports(node: Agent) -> list[tuple[bool, int]]:
    """(with facts, frame size) of every report spooled, in order."""
    assert node.spool is not None
    out = []
    for _, frame in node.spool.pending():
        env = wire.decode(frame)
        if env.type == wire.REPORT:
            out.append(("facts" in env.body, len(frame)))
    return out


def test_facts_with_the_first_report_then_every_full_report_s(tmp_path: Path) -> None:
    clock = FakeClock()
    node = agent(tmp_path, clock)
    for _ in range(4):
        node.poll_and_report()
        clock.advance(15)
    clock.advance(600)
    node.poll_and_report()
    sent = reports(node)
    assert [full for full, _ in sent] == [True, False, False, False, True]
    full, delta = sent[0][1], sent[1][1]
    assert full > 10_000 and delta < 2_000, (full, delta)  # 8 GPUs, 8 IB ports


def test_facts_again_when_the_verdict_changes_and_after_a_reconnect(tmp_path: Path) -> None:
    clock = FakeClock()
    node = agent(tmp_path, clock)
    node.poll_and_report()
    clock.advance(15)
    node.poll_and_report()
    node.on_nvml_event("xid", 3, 79)  # the node turns FAIL
    clock.advance(15)
    node.poll_and_report()  # the facts that go with the problem
    clock.advance(15)
    node.poll_and_report()
    node.on_connected()  # a new collector (or database)
    clock.advance(15)
    node.poll_and_report()
    assert [full for full, _ in reports(node)] == [True, False, True, False, True]


def test_full_report_s_zero_sends_facts_every_time(tmp_path: Path) -> None:
    clock = FakeClock()
    node = agent(tmp_path, clock, full_report_s=0)
    for _ in range(3):
        node.poll_and_report()
        clock.advance(15)
    assert [full for full, _ in reports(node)] == [True, True, True]


def _report(seq: int, facts: bytes | None, verdict: str = "OK") -> tuple[str, wire.Envelope]:
    body: dict[str, object] = {"verdict": verdict, "findings": [], "ok_checks": ["gpu.ecc"]}
    if facts is not None:
        body["facts"] = facts
    return "n1", wire.Envelope(type=wire.REPORT, node="n1", seq=seq, body=body, ts=1000.0 + seq)


def test_the_collector_keeps_the_last_facts(store_url: str) -> None:
    facts = wire.packed({"gpus": [{"index": 0, "uuid": "GPU-1"}]})
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_report(1, facts)])
        store.store_batch([_report(2, None, verdict="WARN")])
        latest = store.latest_report("n1")
        assert latest is not None
        assert (latest["seq"], latest["verdict"], latest["facts_ts"]) == (2, "WARN", 1001.0)
        assert latest["body"]["facts"] == {"gpus": [{"index": 0, "uuid": "GPU-1"}]}
        assert latest["body"]["verdict"] == "WARN"
        # node_facts holds them once, with the report they came with; the body is the
        # report without them
        [(body,)] = store.db.execute("SELECT body FROM reports").fetchall()
        assert "facts" not in msgpack.unpackb(bytes(body))
        assert [(bytes(f), seq) for f, seq in store.db.execute("SELECT facts, seq FROM node_facts")] == [(facts, 1)]
        newer = wire.packed({"gpus": []})
        store.store_batch([_report(3, newer)])
        latest = store.latest_report("n1")
        assert latest is not None and latest["facts_ts"] == 1003.0 and latest["body"]["facts"] == {"gpus": []}


def test_facts_in_a_batch_behind_a_newer_report_without_them_are_kept(store_url: str) -> None:
    """A backlog drain: a node's full report and the reports after it (without facts) in
    one batch. The node's facts are the full report's, not the older stored ones; an older
    full report arriving later does not replace them."""
    old, full = wire.packed({"gpus": ["old"]}), wire.packed({"gpus": ["new"]})
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([_report(1, old)])
        store.store_batch([_report(5, full), _report(6, None), _report(7, None, verdict="WARN")])
        latest = store.latest_report("n1")
        assert latest is not None and (latest["seq"], latest["facts_ts"]) == (7, 1005.0)
        assert latest["body"]["facts"] == {"gpus": ["new"]}
        store.store_batch([_report(3, wire.packed({"gpus": ["older"]}))])  # resent late
        latest = store.latest_report("n1")
        assert latest is not None and latest["body"]["facts"] == {"gpus": ["new"]}


def test_facts_kept_in_reports_before_schema_13_move_to_node_facts(tmp_path: Path) -> None:
    """A database from before schema 13 (facts in ``reports``): opening it moves them."""
    facts = wire.packed({"gpus": [{"index": 0}]})
    path = str(tmp_path / "fleet.db")
    with contextlib.closing(Store(path)) as store:
        store.store_batch([_report(4, facts)])
    with contextlib.closing(Store(path)) as store, store.transaction() as db:
        db.execute("DROP TABLE node_facts")
        db.execute("ALTER TABLE reports ADD COLUMN facts BLOB")
        db.execute("ALTER TABLE reports ADD COLUMN facts_ts REAL")
        db.execute("UPDATE reports SET facts = ?, facts_ts = 1004.0", (facts,))
        db.execute("UPDATE schema_version SET version = 12")
    with contextlib.closing(Store(path)) as store:
        latest = store.latest_report("n1")
        assert latest is not None and latest["facts_ts"] == 1004.0
        assert latest["body"]["facts"] == {"gpus": [{"index": 0}]}
        columns = {row[1] for row in store.db.execute("PRAGMA table_info(reports)")}
        assert "facts" not in columns and "facts_ts" not in columns
