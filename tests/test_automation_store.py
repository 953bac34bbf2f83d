"""The automation's state in the fleet database (schema 7): the upgrade from automation.json,
the store holding exactly what the policy holds, and an operator's change (another process,
one transaction) that the collector neither misses nor overwrites."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from slurmgpu.cli import fleet_cmd
from slurmgpu.collector.policy import IMPORTED_SUFFIX, LEGACY_STATE_FILE, Automation
from slurmgpu.collector.store import SCHEMA_VERSION, Store
from slurmgpu.collector.store.automation import TABLES, Breaker, DrainedNode, Lemon, Stage, image
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.decision import Action
from slurmgpu.result import Severity
from slurmgpu.testing import FakeClock, FakeSlurmClient
from slurmgpu.wire import REPORT, decode_finding
from tests.agenthelpers import wait_until
from tests.test_collector import Agent, ctx, keys_dir, make_settings, running  # noqa: F401

NODES = [f"gpu-{i:03d}" for i in range(1, 41)]
ECC = {"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 0, "subject": None,
       "message": "3 volatile uncorrected ECC errors", "not_applicable": False, "data": {}}


def fail(check: str = "ecc.uncorrected") -> list[Any]:
    return [decode_finding(dict(ECC, check=check))]


# What the migrations after 7 add (schema 8: several collectors on one database; 9: the
# reports' facts kept apart).
LATER_TABLES = ("leader_inbox", "command_outbox", "history_version", "node_version", "node_facts")
LATER_COLUMNS = (("reports", "epoch"),
                 ("nodes", "verdict_epoch"), ("nodes", "verdict_seq"), ("nodes", "changed"),
                 ("nodes", "history_changed"))


def schema_6_database(target: str) -> None:
    """A fleet database as a slurmgpu before schema 7 left it (no automation tables), with
    a drain that waits for its jobs' checkpoints."""
    with contextlib.closing(Store(target)) as store, store.transaction() as db:
        for table in (*TABLES, *LATER_TABLES):
            db.execute(f"DROP TABLE {table}")
        for table, column in LATER_COLUMNS:
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("UPDATE schema_version SET version = 6")
        db.execute("INSERT INTO pending_drains (node, action, reason, trigger, since, checkpoints) "
                   "VALUES ('gpu-004', 'checkpoint', 'slurmgpu: mem.row_remap', 'mem.row_remap', 50.0, '[1]')")


# What a slurmgpu before schema 7 wrote: the breaker open, a held drain whose jobs were asked
# to checkpoint, a released one the collector had not carried out yet, drained nodes (one
# waiting for checkpoints), a lemon, strikes, streaks, storm evidence and decisions.
LEGACY = {
    "fleet": 40, "seen": ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005"],
    "strikes": {"gpu-002": {"nvlink.state": 2}, "gpu-005": {"thermal.throttle": 1}},
    "healthy": {"gpu-001": [2, 100.0]},
    "drained": {"gpu-001": {"time": 10.0, "trigger": "ecc.uncorrected", "reason": "slurmgpu: ecc"},
                "gpu-004": {"time": 50.0, "trigger": "mem.row_remap", "reason": "slurmgpu: mem.row_remap",
                            "pending": "checkpoint"}},
    "history": {"gpu-001": [10.0], "gpu-005": [1.0, 2.0, 2.0]},
    "drain_times": [10.0, 50.0, 50.0],
    "failing": {"nvlink.state": {"gpu-002": 60.0, "gpu-003": 61.0}},
    "breaker": {"open": True, "since": 61.0, "why": "fraction: 2 of 40 nodes drained"},
    "held": {"gpu-002": {"action": "drain-now", "reason": "slurmgpu: nvlink.state", "trigger": "nvlink.state",
                         "time": 60.0, "since": 55.0, "then": "reboot", "checkpoints": 2}},
    "released": {"gpu-003": {"action": "drain", "reason": "slurmgpu: nvlink.state GPU 1",
                             "trigger": "nvlink.state", "time": 61.0, "since": 61.0,
                             "released_at": 70.0, "released_by": "alice"}},
    "lemons": {"gpu-005": {"since": 2.0, "why": "3 drains within 604800 s"}},
    "log": [{"node": "gpu-001", "action": "drain", "reason": "slurmgpu: ecc", "held": False, "dry_run": False,
             "trigger": "ecc.uncorrected", "result": "drained", "time": 10.0, "released_by": ""}],
}


def test_an_old_database_and_its_automation_json_upgrade(tmp_path: Path, store_url: str) -> None:
    """The first start after the upgrade imports automation.json once: held and released
    drains, the breaker and the lemons survive; the file is renamed, never read again."""
    path = store_url
    schema_6_database(path)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / LEGACY_STATE_FILE).write_text(json.dumps(LEGACY))
    store = Store(path)  # the collector's start: migrations 7 and on
    assert store.schema_version() == SCHEMA_VERSION and store.automation_version() is None
    client = FakeSlurmClient(NODES)
    auto = Automation(AutomationSettings(), client, state_dir, FakeClock(now=100.0), store=store)
    assert not (state_dir / LEGACY_STATE_FILE).exists()
    assert (state_dir / (LEGACY_STATE_FILE + IMPORTED_SUFFIX)).is_file()
    st = auto.state
    assert st.breaker == Breaker(**LEGACY["breaker"]) and st.fleet == 40
    assert st.lemons == {node: Lemon(**v) for node, v in LEGACY["lemons"].items()}
    for mine, theirs in ((st.held, LEGACY["held"]), (st.released, LEGACY["released"])):
        assert {node: v.to_json(node) for node, v in mine.items()} == {n: dict(v, node=n) for n, v in theirs.items()}
    assert st.strikes == LEGACY["strikes"] and st.healthy == LEGACY["healthy"]
    assert st.history == LEGACY["history"] and st.drain_times == LEGACY["drain_times"]
    assert st.failing == LEGACY["failing"] and st.seen == LEGACY["seen"]
    # "waits for checkpoints" has one home: pending_drains (the JSON's copy is not kept)
    assert st.drained == {"gpu-001": DrainedNode(10.0, "ecc.uncorrected", "slurmgpu: ecc"),
                          "gpu-004": DrainedNode(50.0, "mem.row_remap", "slurmgpu: mem.row_remap",
                                                 Stage.CHECKPOINTING, Action.CHECKPOINT)}
    assert auto.status()["checkpointing"] == ["gpu-004"]
    store.close()

    # The next start reads the database; nothing is imported again.
    store = Store(path)
    again = Automation(AutomationSettings(), client, state_dir, FakeClock(now=100.0), store=store)
    assert image(again.state) == image(st)
    # The held drain survives into an operator's release, which the collector carries out.
    [released] = [r for r in again.release(by="bob", now=120.0) if r["node"] == "gpu-002"]
    assert released["checkpoints"] == 2 and released["then"] == "reboot"
    decisions = again.run_released(130.0)
    assert sorted(d.node for d in decisions) == ["gpu-002", "gpu-003"]
    assert {d.node: d.released_by for d in decisions} == {"gpu-002": "bob", "gpu-003": "alice"}
    store.close()


def test_breaker_status_reads_the_imported_state(tmp_path: Path, store_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient(NODES))
    monkeypatch.delenv("SLURMGPU_DB", raising=False)
    monkeypatch.delenv("SLURMGPU_STATE_DIR", raising=False)  # the config's state_dir is read
    path, state_dir = store_url, tmp_path / "state"
    schema_6_database(path)
    state_dir.mkdir()
    (state_dir / LEGACY_STATE_FILE).write_text(json.dumps(LEGACY))
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{path}"\n[paths]\nstate_dir = "{state_dir}"\n')
    # Before the collector started again: not imported, and the command says so.
    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert result.exit_code == 4, result.output
    assert f"{state_dir / LEGACY_STATE_FILE} is not imported yet" in result.output
    Automation(AutomationSettings(), FakeSlurmClient(NODES), state_dir, store=Store(path))  # the collector
    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["breaker_open"] and [h["node"] for h in doc["held"]] == ["gpu-002"]
    assert [r["node"] for r in doc["released"]] == ["gpu-003"] and "gpu-005" in doc["lemons"]


def test_a_leftover_automation_json_is_not_imported_over_the_database(tmp_path: Path, store_url: str) -> None:
    store = Store(store_url)
    auto = Automation(AutomationSettings(), FakeSlurmClient(NODES), tmp_path, store=store)
    auto.fleet_size(3)
    (tmp_path / LEGACY_STATE_FILE).write_text(json.dumps(LEGACY))  # e.g. an old collector still ran
    again = Automation(AutomationSettings(), FakeSlurmClient(NODES), tmp_path, store=store)
    assert again.state.fleet == 3 and again.state.held == {}
    assert (tmp_path / LEGACY_STATE_FILE).is_file()  # left alone (a warning is logged)


def test_an_unreadable_automation_json_stops_the_start(tmp_path: Path, store_url: str) -> None:
    (tmp_path / LEGACY_STATE_FILE).write_text("{not json")
    store = Store(store_url)
    with pytest.raises(ValueError, match=f"cannot import the automation state from {tmp_path / LEGACY_STATE_FILE}"):
        Automation(AutomationSettings(), FakeSlurmClient(NODES), tmp_path, store=store)
    assert store.automation_version() is None and (tmp_path / LEGACY_STATE_FILE).is_file()


def test_the_store_holds_what_the_policy_holds(tmp_path: Path, store_url: str) -> None:
    """After every call, the database read back equals the state in memory (saves write
    only the changed rows of the nodes a call touched)."""
    client, clock = FakeSlurmClient(NODES), FakeClock()
    auto = Automation(AutomationSettings(max_per_hour=100, lemon_drains=2, resume_after_s=0,
                                         resume_healthy_reports=1), client, tmp_path, clock,
                      store=Store(store_url))
    reader = Store(store_url)

    def same() -> None:
        assert image(reader.automation().state) == image(auto.state)

    auto.fleet_size(len(NODES))
    same()
    for i, node in enumerate(NODES[:14]):  # drains, then a storm that trips the breaker
        auto.on_report(node, Severity.FAIL, fail("pins.driver" if i % 2 else "ecc.uncorrected"), clock.time())
        clock.advance(5)
        same()
    assert auto.status()["breaker_open"] and auto.status()["held"]
    for _ in range(2):  # a drained node heals (resumed), fails again: a lemon
        auto.on_report(NODES[0], Severity.OK, [], clock.time())
        same()
        auto.on_report(NODES[0], Severity.FAIL, fail(), clock.time())
        same()
    auto.release(by="carol")
    same()
    auto.run_released(clock.time())
    same()
    auto.clear_lemon(NODES[0])
    same()
    assert reader.automation().version == auto._record.version


def test_an_operators_release_in_the_middle_of_a_slurm_call_is_kept(tmp_path: Path, store_url: str) -> None:
    """The collector saves only what it changed: a release that another process commits
    while the collector waits for Slurm (between its refresh and its save) is neither lost
    nor undone, and the collector reads it back after its own save."""
    settings = AutomationSettings(max_fraction=0.05, min_nodes=1, resume_healthy_reports=1, resume_after_s=0)
    client, clock = FakeSlurmClient(NODES), FakeClock()
    collector = Automation(settings, client, tmp_path, clock, store=Store(store_url))
    collector.fleet_size(len(NODES))  # 40 nodes: 2 drained at a time
    for node in NODES[:3]:
        collector.on_report(node, Severity.FAIL, fail(), clock.time())
    assert collector.status()["breaker_open"] and [h["node"] for h in collector.status()["held"]] == [NODES[2]]
    operator = Automation(settings, client, tmp_path, clock, store=Store(store_url), read_only=True)
    real_resume = client.resume

    def resume_while_released(node: str) -> None:
        operator.release(by="dave")  # another process, one transaction, mid-call
        real_resume(node)

    client.resume = resume_while_released  # type: ignore[method-assign]
    [d] = collector.on_report(NODES[0], Severity.OK, [], clock.time())  # healthy: resumed
    assert d.result == "resumed"
    in_db = Store(store_url).automation().state
    assert in_db.released[NODES[2]].released_by == "dave" and NODES[2] not in in_db.held
    assert not in_db.breaker.open  # the collector did not write its stale breaker back
    assert NODES[0] not in in_db.drained  # the collector's own change, saved all the same
    assert image(collector.state) == image(in_db)  # and it read the release back
    [done] = collector.run_released(clock.time())
    assert (done.node, done.result, done.released_by) == (NODES[2], "drained", "dave")


def test_cli_release_while_the_collector_runs(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                              ctx: zmq.Context[Any],  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch, store_url: str) -> None:
    """`slurmgpu breaker release` while the collector runs and reports keep arriving: the
    collector sees the release at its next loop turn (no file to poll), carries the held
    drain out once, and its later saves keep the breaker closed."""
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    monkeypatch.setenv("SUDO_USER", "erin")
    monkeypatch.delenv("SLURMGPU_DB", raising=False)
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{cfg.db}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    client = FakeSlurmClient(["gpu-a", "gpu-b"])
    with running(cfg, automation=AutomationSettings(max_fraction=0.5), slurm=client,
                 state_dir=tmp_path / "state") as collector:
        auto = collector.automation  # one store for the collector and its automation (build_collector)
        assert auto is not None
        agents = {n: Agent(ctx, cfg, keys_dir, n) for n in ("gpu-a", "gpu-b")}
        seq = {"gpu-a": 0, "gpu-b": 0}

        def report(node: str) -> None:
            seq[node] += 1
            agents[node].send(REPORT, seq[node], {"verdict": "FAIL", "findings": [ECC], "facts": {}})
            assert agents[node].acked() == [seq[node]]

        report("gpu-a")
        wait_until(lambda: "gpu-a" in auto.status()["drained"], 20, "gpu-a drained")
        report("gpu-b")
        wait_until(lambda: [h["node"] for h in auto.status()["held"]] == ["gpu-b"], 20, "gpu-b held")
        done = threading.Event()
        results: list[Any] = []

        def release() -> None:
            results.append(CliRunner().invoke(fleet_cmd.breaker, ["release", "--config", str(config)]))
            done.set()

        thread = threading.Thread(target=release)
        thread.start()
        while not done.is_set():  # reports keep coming while the operator releases
            report("gpu-a")
        thread.join(10)
        assert results[0].exit_code == 0, results[0].output
        assert "released by erin: 1 held drain(s)" in results[0].output
        wait_until(lambda: [c[1] for c in client.calls if c[0] == "drain"] == ["gpu-a", "gpu-b"], 5,
                   "the released drain")
        for _ in range(3):
            report("gpu-a")
    assert [c[1] for c in client.calls if c[0] == "drain"] == ["gpu-a", "gpu-b"]  # once
    in_db = Store(cfg.db).automation().state
    assert not in_db.breaker.open and in_db.held == {} and in_db.released == {}
    assert sorted(in_db.drained) == ["gpu-a", "gpu-b"]
    [d] = Store(cfg.db).decisions(node="gpu-b")[-1:]
    assert d["reason"].endswith("(held by the breaker, released by erin)")


# Rows as the automation wrote them before its state was typed (issue 30): a drained node,
# one waiting for its jobs' checkpoints before a reboot, one imported from automation.json
# with its time alone, a lemon, a held drain (its jobs asked, a reboot to follow) and a
# released one, the breaker open.
OLD_ROWS = {
    "automation_state": [(1, 7, 40, 1, 61.0, "fraction: 2 of 40 nodes drained")],
    "automation_drained": [("gpu-001", 10.0, "ecc.uncorrected", "slurmgpu: ecc", None),
                           ("gpu-004", 50.0, "xid.recent", "slurmgpu: xid 79", "reboot"),
                           ("gpu-006", 5.0, None, None, None)],
    "pending_drains": [("gpu-004", "drain-now", "slurmgpu: xid 79", "xid.recent", 50.0, "[]")],
    "automation_lemons": [("gpu-006", 2.0, "3 drains within 7 days, last: slurmgpu: ecc")],
    "automation_held": [("gpu-002", "drain-now", "slurmgpu: nvlink", "nvlink.state", 60.0, 55.0, "reboot", 2)],
    "automation_released": [("gpu-003", "drain", "slurmgpu: nvlink 1", "nvlink.state", 61.0, 61.0, None, None,
                             70.0, "alice")],
}


def test_rows_of_the_untyped_automation_load_and_carry_on(tmp_path: Path, store_url: str) -> None:
    """A collector upgraded in place keeps its drained nodes, lemons, held and released
    drains: the old rows load into the typed records, `breaker status` shows what it
    showed, saving rewrites none of them, and the automation carries on from them."""
    with contextlib.closing(Store(store_url)) as store, store.transaction() as db:
        for table, rows_ in OLD_ROWS.items():
            db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows_[0]))})", rows_)
    store = Store(store_url)
    client = FakeSlurmClient(NODES)
    for node in ("gpu-001", "gpu-006"):
        client.drain(node, "slurmgpu: ecc")
    auto = Automation(AutomationSettings(reboot_allowed=True, resume_healthy_reports=1, resume_after_s=0),
                      client, tmp_path, FakeClock(now=100.0), store=store)
    st = auto.state
    assert st.drained == {"gpu-001": DrainedNode(10.0, "ecc.uncorrected", "slurmgpu: ecc"),
                          "gpu-004": DrainedNode(50.0, "xid.recent", "slurmgpu: xid 79", Stage.CHECKPOINTING,
                                                 Action.DRAIN_NOW, then_reboot=True),
                          "gpu-006": DrainedNode(5.0)}
    assert st.breaker == Breaker(True, 61.0, "fraction: 2 of 40 nodes drained") and list(st.lemons) == ["gpu-006"]
    status = auto.status()
    assert (status["drained"], status["checkpointing"]) == (["gpu-001", "gpu-006"], ["gpu-004"])
    assert status["held"] == [{"action": "drain-now", "reason": "slurmgpu: nvlink", "trigger": "nvlink.state",
                               "time": 60.0, "since": 55.0, "then": "reboot", "checkpoints": 2, "node": "gpu-002"}]
    assert status["released"] == [{"action": "drain", "reason": "slurmgpu: nvlink 1", "trigger": "nvlink.state",
                                   "time": 61.0, "since": 61.0, "released_at": 70.0, "released_by": "alice",
                                   "node": "gpu-003"}]
    assert status["lemons"] == {"gpu-006": {"since": 2.0, "why": "3 drains within 7 days, last: slurmgpu: ecc"}}

    def stored_rows() -> list[list[Any]]:
        return [sorted(store.db.execute(f"SELECT * FROM {t}").fetchall()) for t in OLD_ROWS if t != "automation_state"]

    before = stored_rows()
    auto._record.save()
    assert stored_rows() == before
    # The automation carries on: the drained node resumes, the lemon stays, the pending reboot comes.
    ok = [decode_finding(dict(ECC, severity="OK", message="fine"))]
    assert [d.result for d in auto.on_report("gpu-001", Severity.OK, ok)] == ["resumed"]
    assert auto.on_report("gpu-006", Severity.OK, ok) == [] and "gpu-006" in auto.state.drained
    assert auto.finish_pending("gpu-004", Action.DRAIN_NOW, "slurmgpu: xid 79", "xid.recent", 101.0).result \
        == "reboot-requested"
    store.close()
