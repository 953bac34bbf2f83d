"""The fleet history the report reads (docs/fleet-db.md): report summaries, hourly
samples, counters stored on change, node state transitions (reachability, Slurm drains)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from slurmgpu.collector.store import Store
from slurmgpu.slurm import NodeState
from slurmgpu.summary import HW_SLOWDOWN, SW_THERMAL, as_dict, report_fields, summarize
from slurmgpu.testing import make_facts
from slurmgpu.wire import REPORT, Envelope

T0 = 1_790_000_000.0


def test_summary_of_a_node() -> None:
    facts = make_facts("gpu-n1", gpus=2, ib_ports=1)
    facts.nvml.gpus[1].clocks_event_reasons = HW_SLOWDOWN | SW_THERMAL
    raw = summarize(facts)
    assert (raw["hw"], raw["sw"]) == (1, 1)
    s = as_dict(raw)
    g0, g1 = s["gpus"]
    assert (g0["index"], g1["index"], g0["model"]) == (0, 1, facts.nvml.gpus[0].name)
    assert g0["remap_pending"] == 0 and g0["serial"] == facts.nvml.gpus[0].serial
    [port] = s["ib"]
    assert port["port"] == f"{facts.ib.hcas[0].name}/1" and "symbol_error" in port
    assert s["versions"]["driver"] == "550.90.07" and s["versions"]["nccl"] == "2.21.5"
    assert s["versions"]["cuda"] == "12.4"
    facts.nvml.gpus[1].clocks_event_reasons = 0
    assert (summarize(facts)["hw"], summarize(facts)["sw"]) == (0, 0)


def _report(node: str, seq: int, ts: float, fields: dict[str, Any], verdict: str = "OK") -> Any:
    """A report whose body has ``fields`` (``report_fields(facts)``: throttle + packed summary)."""
    return (node, Envelope(type=REPORT, node=node, seq=seq, ts=ts,
                           body={"verdict": verdict, "findings": [], **fields}))


def _rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return store.db.execute(sql, params).fetchall()


def test_samples_and_counters_on_change(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.db", sample_interval_s=60)
    facts = make_facts("gpu-n1", gpus=2, ib_ports=1)
    batch = []
    for i in range(9):  # a report every 15 s for 2 minutes
        if i == 4:
            assert facts.nvml.gpus[0].ecc is not None
            facts.nvml.gpus[0].ecc = dataclasses.replace(facts.nvml.gpus[0].ecc, corrected_aggregate=7)
            facts.nvml.gpus[1].clocks_event_reasons = HW_SLOWDOWN
        if i == 6:
            facts.nvml.gpus[1].clocks_event_reasons = 0
        batch.append(_report("gpu-n1", i + 1, T0 + 15 * i, report_fields(facts), "FAIL" if i == 2 else "OK"))
    store.store_batch(batch)
    samples = _rows(store, "SELECT ts, span_s, reports, fail_reports, hw_slowdown_reports, "
                           "sw_thermal_reports FROM node_samples ORDER BY ts")
    # the report at +60 s closes the first interval (reports 0..4), +120 s the second (5..8)
    assert samples == [(T0 + 60, 60.0, 5, 1, 1, 0), (T0 + 120, 60.0, 4, 0, 1, 0)]
    ecc = _rows(store, "SELECT ts, ecc_corrected FROM gpu_counters WHERE gpu = 0 ORDER BY ts")
    assert [e[0] for e in ecc] == [T0, T0 + 60] and ecc[1][1] == 7  # first sight, then the change
    assert len(_rows(store, "SELECT * FROM gpu_counters WHERE gpu = 1")) == 1
    assert len(_rows(store, "SELECT * FROM ib_counters")) == 1
    assert _rows(store, "SELECT driver, nccl FROM node_versions") == [("550.90.07", "2.21.5")]
    # a new driver is a new versions row
    facts.nvml.driver_version = "560.35.03"
    store.store_batch([_report("gpu-n1", 20, T0 + 200, report_fields(facts))])
    assert [r[0] for r in _rows(store, "SELECT driver FROM node_versions ORDER BY ts")] == \
        ["550.90.07", "560.35.03"]
    store.close()  # writes the partial interval
    again = Store(tmp_path / "f.db")
    assert _rows(again, "SELECT reports FROM node_samples ORDER BY ts")[-1] == (1,)


def test_garbage_summaries_are_ignored(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.db", sample_interval_s=60)
    bad = {"gpus": [["x"], "nope", [], [True], [1, "S", "A" * 9999, [1, 2]]],
           "ib": [[5], ["mlx5_0/1", "ACTIVE", 400.0, 2**64 - 1]], "versions": "x"}
    store.store_batch([_report("gpu-n1", 1, T0, {"summary": bad, "throttle": 7}),
                       _report("gpu-n2", 1, T0, {"summary": b"\xc1 not msgpack"})])
    [(serial, model, ecc)] = _rows(store, "SELECT serial, model, ecc_corrected FROM gpu_counters")
    assert serial == "S" and len(model) == 256 and ecc is None
    assert _rows(store, "SELECT port, state, symbol_error, link_downed FROM ib_counters") == [
        ("mlx5_0/1", "ACTIVE", None, None)]
    assert _rows(store, "SELECT count(*) FROM node_versions") == [(0,)]


def test_reachability_transitions(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.db")
    store.store_batch([_report("gpu-n1", 1, T0, {})], received_at=T0)
    assert store.mark_unreachable(T0 + 100, 15) == ["gpu-n1"]
    assert store.mark_unreachable(T0 + 200, 15) == []  # once
    store.store_batch([_report("gpu-n1", 2, T0 + 300, {})], received_at=T0 + 300)
    store.store_batch([_report("gpu-n1", 3, T0 + 315, {})], received_at=T0 + 315)
    assert _rows(store, "SELECT ts, kind, actor FROM node_states ORDER BY id") == [
        (T0 + 100, "unreachable", "collector"), (T0 + 300, "reachable", "collector")]


def test_slurm_drain_transitions_survive_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.db")
    idle = NodeState("gpu-n1", "idle")
    drained = NodeState("gpu-n1", "idle", frozenset({"DRAIN"}), "slurmgpu: ecc.uncorrected GPU 3",
                        "root", T0 + 5)
    assert store.record_slurm_states([idle], T0) == []
    assert store.record_slurm_states([drained], T0 + 60) == [("gpu-n1", "drained")]
    assert store.record_slurm_states([drained], T0 + 120) == []
    store.close()
    store = Store(tmp_path / "f.db")  # a restarted collector does not record it twice
    assert store.record_slurm_states([drained], T0 + 180) == []
    other = dataclasses.replace(drained, reason="disk swap", reason_user="alice", reason_time=T0 + 200)
    assert store.record_slurm_states([other], T0 + 240) == [("gpu-n1", "drained")]
    assert store.record_slurm_states([idle], T0 + 300) == [("gpu-n1", "resumed")]
    assert _rows(store, "SELECT ts, kind, reason, actor FROM node_states ORDER BY id") == [
        (T0 + 5, "drained", "slurmgpu: ecc.uncorrected GPU 3", "root"),
        (T0 + 200, "drained", "disk swap", "alice"),
        (T0 + 300, "resumed", None, None)]


def _decision(node: str, when: float, reason: str, result: str = "drained") -> Any:
    from slurmgpu.collector.policy import Decision

    return Decision(node, "drain", reason, held=False, dry_run=False, trigger="t", result=result,
                    time=when)


def test_slurm_drains_record_who_drained(tmp_path: Path) -> None:
    """node_states.drained_by, from the reason's actor tag, the automation's decisions
    (this collector's own) or neither."""
    store = Store(tmp_path / "f.db")
    idle = [NodeState(f"gpu-n{i}", "idle") for i in range(1, 9)]
    store.record_slurm_states(idle, T0)

    def drain(node: str, reason: str, user: str = "root") -> NodeState:
        return NodeState(node, "idle", frozenset({"DRAIN"}), reason, user, T0 + 10)

    auto = "slurmgpu: ecc.uncorrected GPU 0 3 volatile uncorrected ECC errors"
    store.add_decisions([
        _decision("gpu-n1", T0 + 9, auto),
        # a note the automation adds to its own record, not to Slurm's reason
        _decision("gpu-n2", T0 + 9, auto + " (waiting for 2 job checkpoint(s))"),
        _decision("gpu-n3", T0 + 9, auto, result="already-drained"),  # not its drain
        _decision("gpu-n4", T0 + 9, "slurmgpu: xid.recent GPU 1 XID 79"),  # another reason
        _decision("gpu-n8", T0 + 9, "slurmgpu: " + "x" * 300),  # Slurm got it cut at 256
    ])
    states = [drain("gpu-n1", auto), drain("gpu-n2", auto), drain("gpu-n3", auto),
              drain("gpu-n4", auto),
              drain("gpu-n5", "slurmgpu: gpu.lost GPU 3 lost [by prolog]"),
              drain("gpu-n6", "slurmgpu: replace PSU [by operator alice]"),
              drain("gpu-n7", "Kill task failed", "slurm"),
              drain("gpu-n8", "slurmgpu: " + "x" * 245 + "…")]
    store.record_slurm_states(states, T0 + 30)
    assert _rows(store, "SELECT node, drained_by FROM node_states WHERE kind = 'drained' "
                        "ORDER BY node") == [
        ("gpu-n1", "automation"), ("gpu-n2", "automation"), ("gpu-n3", "slurmgpu"),
        ("gpu-n4", "slurmgpu"), ("gpu-n5", "prolog"), ("gpu-n6", "operator"),
        ("gpu-n7", "outside"), ("gpu-n8", "automation")]
    # resumed, then drained again with the same reason by an older slurmgpu's hook: the
    # automation's decision from before the resume is not this drain's
    store.record_slurm_states([idle[0]], T0 + 60)
    store.record_slurm_states([dataclasses.replace(states[0], reason_time=T0 + 70)], T0 + 90)
    assert _rows(store, "SELECT drained_by FROM node_states WHERE node = 'gpu-n1' AND "
                        "kind = 'drained' ORDER BY id") == [("automation",), ("slurmgpu",)]
    # the automation's reboot: Slurm appends to the reason; still the automation's
    store.add_decisions([_decision("gpu-n1", T0 + 100, auto, result="reboot-requested")])
    store.record_slurm_states([idle[0]], T0 + 95)
    rebooting = dataclasses.replace(states[0], reason=auto + " : reboot issued", reason_time=T0 + 101)
    store.record_slurm_states([rebooting], T0 + 120)
    assert _rows(store, "SELECT drained_by FROM node_states WHERE node = 'gpu-n1' AND "
                        "kind = 'drained' ORDER BY id")[-1] == ("automation",)


def test_schema_5_database_gets_drained_by(tmp_path: Path) -> None:
    import sqlite3

    from slurmgpu.collector.store import SCHEMA_VERSION
    from slurmgpu.collector.store.automation import TABLES as AUTOMATION_TABLES
    from tests.test_automation_store import LATER_COLUMNS, LATER_TABLES

    path = tmp_path / "f.db"
    Store(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("ALTER TABLE node_states DROP COLUMN drained_by")
    for table in (*AUTOMATION_TABLES, *LATER_TABLES):  # (schema 7's and later)
        db.execute(f"DROP TABLE {table}")
    for table, column in LATER_COLUMNS:
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.execute("UPDATE schema_version SET version = 5")
    db.execute("INSERT INTO node_states (node, ts, kind, reason, actor) VALUES "
               "('gpu-n1', 1.0, 'drained', 'slurmgpu: x', 'root')")
    db.close()
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION >= 6
    assert _rows(store, "SELECT node, drained_by FROM node_states") == [("gpu-n1", None)]


def test_collector_polls_slurm_for_drains(tmp_path: Path) -> None:
    import threading

    from slurmgpu import keys
    from slurmgpu.collector.app import build_collector
    from slurmgpu.config.schema import CollectorSettings
    from slurmgpu.testing import FakeSlurmClient

    keys.init(tmp_path / "keys")
    keys.add_node(tmp_path / "keys", "gpu-n1")
    client = FakeSlurmClient(["gpu-n1", "login1"])
    settings = CollectorSettings(bind="tcp://127.0.0.1:*", db=str(tmp_path / "f.db"),
                                 keys_dir=str(tmp_path / "keys"), slurm_poll_s=0.05)
    collector = build_collector(settings, slurm_poll=client)
    stop = threading.Event()
    thread = threading.Thread(target=collector.run, args=(stop,))
    thread.start()
    try:
        for node, reason in (("gpu-n1", "slurmgpu: xid.recent GPU 0 XID 79"), ("login1", "not ours")):
            client.states[node] = NodeState(node, "idle", frozenset({"DRAIN"}), reason, "root", time.time())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = Store(tmp_path / "f.db").db.execute("SELECT node, kind FROM node_states").fetchall()
            if rows:
                break
            time.sleep(0.05)
        assert rows == [("gpu-n1", "drained")]
    finally:
        stop.set()
        thread.join(10)


def test_a_node_inventing_port_names_holds_one_summarys_worth_of_memory() -> None:
    """Issue 12 item 9: the in-memory last-values maps are per node and replaced by each
    summary, so a node that sends new port names in every report (1,000 x 256 names)
    holds at most one message's worth; a port or GPU that vanishes and comes back is a
    change, written again."""
    from slurmgpu.collector.store.history import History, Rows

    history = History()
    rows = Rows()
    for i in range(1000):
        ports = [[f"mlx5_{p}-{i}/1", "ACTIVE", 400.0] for p in range(256)]
        gpus = [[g, f"SN{i}"] for g in range(8)]
        history.observe("evil", float(i), "OK", 0, {"gpus": gpus, "ib": ports}, rows)
    assert sum(len(v) for v in history._ib.values()) == 256
    assert sum(len(v) for v in history._gpu.values()) == 8
    rows = Rows()
    history.observe("n1", 1.0, "OK", 0, {"gpus": [[0, "A"], [1, "B"]], "ib": [["mlx5_0/1", "ACTIVE"]]}, rows)
    history.observe("n1", 2.0, "OK", 0, {"gpus": [[0, "A"]], "ib": []}, rows)
    history.observe("n1", 3.0, "OK", 0, {"gpus": [[0, "A"], [1, "B"]], "ib": [["mlx5_0/1", "ACTIVE"]]}, rows)
    assert [(r[1], r[2]) for r in rows.gpus] == [(0, 1.0), (1, 1.0), (1, 3.0)]
    assert [(r[1], r[2]) for r in rows.ib] == [("mlx5_0/1", 1.0), ("mlx5_0/1", 3.0)]
