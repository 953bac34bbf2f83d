"""The collector with automation, over real sockets; the `slurmgpu breaker` commands."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from slurmgpu.cli import cli, fleet_cmd
from slurmgpu.cli.common import load_settings
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.automation import Breaker, HeldDrain, Lemon
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.decision import Action
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import NodeState
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.wire import EVENT, REPORT, decode_finding
from tests.agenthelpers import wait_until
from tests.test_collector import Agent, ctx, db_rows, keys_dir, make_settings, running  # noqa: F401

ECC = {"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 0, "subject": None,
       "message": "3 volatile uncorrected ECC errors", "not_applicable": False, "data": {}}




def automation(tmp_path: Path, **kw: Any) -> tuple[Automation, FakeSlurmClient]:
    """An Automation keeping its state in tmp_path/fleet.db: the collector's database
    (``make_settings``) and the one the configs below name."""
    client = FakeSlurmClient(["gpu-a", "gpu-b"])
    return Automation(AutomationSettings(**kw), client, tmp_path / "state",
                      store=Store(tmp_path / "fleet.db")), client


def stored(tmp_path: Path) -> Any:
    """The automation's state as the database holds it."""
    store = Store(tmp_path / "fleet.db")
    try:
        return store.automation().state
    finally:
        store.close()


def with_automation(tmp_path: Path, client: FakeSlurmClient | None = None,
                    **kw: Any) -> tuple[dict[str, Any], FakeSlurmClient]:
    """``build_collector``'s arguments for an automation like ``automation``'s (same state)."""
    client = client or FakeSlurmClient(["gpu-a", "gpu-b"])
    return {"automation": AutomationSettings(**kw), "slurm": client, "state_dir": tmp_path / "state"}, client


def test_fail_report_drains_and_records(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    args, client = with_automation(tmp_path)
    with running(cfg, **args) as collector:
        assert collector.automation is not None and collector.automation.state.fleet == 2  # the allow-list size
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(REPORT, 1, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
        assert agent.acked() == [1]
        wait_until(lambda: collector.counters.decisions == 1)
        agent.send(REPORT, 1, {"verdict": "FAIL", "findings": [ECC], "facts": {}})  # a resend
        assert agent.acked() == [1]
        agent.send(EVENT, 2, {"kind": "xid", "verdict": "OK", "findings": []})
        assert agent.acked() == [2]
        assert collector.counters.automation_errors == 0
    assert [c[:2] for c in client.calls if c[0] == "drain"] == [("drain", "gpu-a")]
    store = Store(cfg.db)
    [d] = store.decisions()
    assert (d["node"], d["action"], d["result"], d["held"], d["dry_run"], d["trigger"]) == (
        "gpu-a", "drain", "drained", False, False, "ecc.uncorrected")
    assert d["reason"].startswith("slurmgpu: ecc.uncorrected GPU 0")
    assert store.decisions(node="gpu-b") == [] and store.count("decisions") == 1
    store.close()


def test_dry_run_records_without_slurm(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    args, client = with_automation(tmp_path, dry_run=True)
    with running(cfg, **args) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-b")
        agent.send(REPORT, 1, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
        assert agent.acked() == [1]
        wait_until(lambda: collector.counters.decisions == 1)
    assert client.calls == []
    assert db_rows(cfg, "SELECT node, action, result, dry_run FROM decisions") == [
        ("gpu-b", "drain", "dry-run", 1)]


def test_automation_failure_keeps_serving(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_settings(tmp_path, keys_dir)
    calls: list[str] = []

    def fleet_size(self: Automation, n: int) -> None:
        raise RuntimeError("fleet size broken")

    def on_report(self: Automation, node: str, *a: Any) -> list[Any]:
        calls.append(node)
        raise RuntimeError("policy bug")

    monkeypatch.setattr(Automation, "fleet_size", fleet_size)
    monkeypatch.setattr(Automation, "on_report", on_report)
    args, _ = with_automation(tmp_path)
    with running(cfg, **args) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        for seq in (1, 2, 3):
            agent.send(REPORT, seq, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
            assert agent.acked() == [seq]
        wait_until(lambda: len(calls) == 3)
        # (counted after the call raised: wait for it, not for the call)
        wait_until(lambda: collector.counters.automation_errors >= 4)  # fleet_size at start + 3 reports
        assert collector.counters.acks_sent == 3 and collector.counters.stored == 3
    assert db_rows(cfg, "SELECT count(*) FROM decisions") == [(0,)]


def test_external_release_is_picked_up(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    before, _client = automation(tmp_path)
    before.state.breaker = Breaker(True, 1.0, "test")
    before._record.save()  # the collector starts with its breaker open
    args, _ = with_automation(tmp_path)
    with running(cfg, **args) as collector:
        auto = collector.automation
        assert auto is not None and auto.state.breaker.open
        other, _ = automation(tmp_path)
        assert other.status()["breaker_open"]
        other.release()
        wait_until(lambda: not auto.state.breaker.open)


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "slurmgpu.toml"
    path.write_text(f'[collector]\ndb = "{tmp_path / "fleet.db"}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def test_breaker_status_and_release(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    auto, _ = automation(tmp_path)
    auto.state.breaker = Breaker(True, 1.0, "storm: ecc.uncorrected failing")
    auto.state.held["gpu-a"] = HeldDrain(Action.DRAIN, "slurmgpu: x", "t", 1.0, 1.0)
    auto.state.lemons["gpu-b"] = Lemon(1.0, "3 drains")
    auto._record.save()

    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["breaker_open"] and status["why"].startswith("storm")
    assert [h["node"] for h in status["held"]] == ["gpu-a"] and "gpu-b" in status["lemons"]

    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert result.exit_code == 0 and "breaker OPEN" in result.output and "lemons: gpu-b" in result.output

    result = CliRunner().invoke(fleet_cmd.breaker, ["release", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert not status["breaker_open"] and status["held"] == [] and "gpu-b" in status["lemons"]
    assert stored(tmp_path).breaker.open is False

    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert result.exit_code == 0 and "breaker closed" in result.output


def test_collector_automation_from_config(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    settings = load_settings(str(config)).settings
    assert settings.automation.enabled is False
    assert "automation" not in fleet_cmd._collector_args(settings, dry_run=True)
    enabled = dataclasses.replace(settings, automation=dataclasses.replace(settings.automation, enabled=True))
    args = fleet_cmd._collector_args(enabled, dry_run=True)
    assert args["automation"].dry_run and args["state_dir"] == settings.paths.state_dir
    assert not fleet_cmd._collector_args(enabled)["automation"].dry_run
    store = Store(settings.collector.db)
    auto = fleet_cmd._automation(settings, store=store)  # `slurmgpu breaker`'s: the state the collector keeps
    assert auto.store is store and not auto.settings.dry_run
    store.close()


def test_breaker_bad_config_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    bad = tmp_path / "bad.toml"
    bad.write_text('[automation.policy]\n"ecc.uncorrected" = "explode"\n')
    result = CliRunner().invoke(cli, ["breaker", "status", "--config", str(bad)])  # as `slurmgpu` runs it
    assert result.exit_code == 3
    assert len(result.output.strip().splitlines()) == 1 and "error" in result.output


def test_fleet_prints_breaker_line(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient(["gpu-a"]))
    store = Store(tmp_path / "fleet.db")
    store.store_batch([("gpu-a", _report("gpu-a"))])
    store.close()
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", str(tmp_path / "fleet.db")])
    assert result.exit_code == 0, result.output
    assert "automation" not in result.output  # no automation state in the database yet
    auto, _ = automation(tmp_path)
    auto.fleet_size(1)
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", str(tmp_path / "fleet.db")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "automation: breaker closed; now 0 of 1 nodes drained; lemons: none"


def test_breaker_status_is_current(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29 item 4: a held drain of a node the prolog drained since stayed "held", and
    the headline showed the reason the breaker opened with as if it were now."""
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    auto, _ = automation(tmp_path)
    auto.fleet_size(4)
    auto.state.breaker = Breaker(True, 1.0, "fraction: 2 of 4 nodes drained, gpu-c would make 3")
    for node in ("gpu-c", "gpu-d"):
        auto.state.held[node] = HeldDrain(Action.DRAIN, f"slurmgpu: pin.driver {node}", "pin.driver", 1.0, 1.0)
    auto._record.save()
    poll = [NodeState("gpu-a", "idle", frozenset({"DRAIN"}), "slurmgpu: xid.recent [by prolog]"),
            NodeState("gpu-b", "idle", frozenset({"DRAIN"}), "fan [by root]"),
            NodeState("gpu-c", "idle", frozenset({"DRAIN"}), "slurmgpu: pin.driver off-pin [by prolog]")]
    auto.store.record_slurm_states(poll, 2.0)

    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert result.exit_code == 0, result.output
    headline = result.output.splitlines()[0]
    assert headline.startswith("automation: breaker OPEN since ") and headline.endswith(
        "(opened on: fraction: 2 of 4 nodes drained, gpu-c would make 3); 1 drain(s) held; now 3 of 4 "
        "nodes drained (outside: gpu-b; prolog: gpu-a, gpu-c); lemons: none")
    assert [line for line in result.output.splitlines() if line.startswith("  held:")] == [
        "  held: gpu-d drain: slurmgpu: pin.driver gpu-d"]
    # The collector drops the moot hold at the node's next report.
    [d] = auto.on_report("gpu-c", Severity.FAIL, [Finding("pin.driver", Severity.FAIL, "off-pin")], 3.0)
    assert (d.result, "gpu-c" in auto.state.held) == ("already-drained", False)
    assert "drained meanwhile by prolog" in d.reason
    assert auto.on_report("gpu-c", Severity.FAIL, [Finding("pin.driver", Severity.FAIL, "off-pin")], 4.0) == []


def _report(node: str) -> Any:
    from slurmgpu.wire import Envelope

    return Envelope(type=REPORT, node=node, seq=1, body={"verdict": "OK", "findings": []})


# --------------------------------------------------------------------------- breaker release


def three_node_state(tmp_path: Path, config: Path) -> Automation:
    """The admin's cluster: 3 nodes, max_fraction = 0.34 (one drained at a time), gpu-a
    drained, gpu-b's drain held by the breaker."""
    config.write_text(f'[collector]\ndb = "{tmp_path / "fleet.db"}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                      "[automation]\nmax_fraction = 0.34\nmin_nodes = 1\n")
    client = FakeSlurmClient(["gpu-a", "gpu-b", "gpu-c"])
    auto = Automation(AutomationSettings(max_fraction=0.34, min_nodes=1), client, tmp_path / "state",
                      store=Store(tmp_path / "fleet.db"))
    auto.fleet_size(3)
    auto.on_report("gpu-a", Severity.FAIL, [decode_finding(ECC)])
    [held] = auto.on_report("gpu-b", Severity.FAIL, [decode_finding(dict(ECC, check="nvlink.state"))])
    assert held.held
    return auto


def test_breaker_release_says_it_would_trip_again_and_why(tmp_path: Path, config: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    monkeypatch.setenv("SUDO_USER", "alice")
    three_node_state(tmp_path, config)
    status = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert status.exit_code == 0, status.output
    assert "  held: gpu-b drain" in status.output and "if released:" in status.output
    assert "would trip again: YES" in status.output

    result = CliRunner().invoke(fleet_cmd.breaker, ["release", "--config", str(config)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("released by alice: 1 held drain(s) proceed once "
                        "(the collector carries them out at its next loop turn):")
    assert lines[1].startswith("  gpu-b drain: slurmgpu: nvlink.state")
    assert lines[2] == "would trip again: YES"
    assert lines[3] == ("  fraction (trips again; [automation] max_fraction): 2 of 3 nodes (67%) would be "
                        "drained; max_fraction = 0.34 trips at 2 nodes: the next drain trips the breaker again")
    assert f"state: {tmp_path / 'fleet.db'} (config: {config})" in lines
    in_db = stored(tmp_path)
    assert in_db.breaker.open is False and in_db.held == {}
    assert in_db.released["gpu-b"].released_by == "alice"


def test_breaker_release_json(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    monkeypatch.setenv("SUDO_USER", "alice")
    three_node_state(tmp_path, config)
    result = CliRunner().invoke(fleet_cmd.breaker, ["release", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["released_by"] == "alice" and [r["node"] for r in doc["released_now"]] == ["gpu-b"]
    assert [r["node"] for r in doc["released"]] == ["gpu-b"] and doc["held"] == []
    assert doc["db"] == str(tmp_path / "fleet.db") and doc["config"] == str(config)
    forecast = doc["forecast"]
    assert (forecast["fleet"], forecast["drained"], forecast["drained_pct"], forecast["would_trip"]) == (3, 2, 67, True)
    fraction = forecast["rules"][0]
    assert {k: fraction[k] for k in ("rule", "setting", "value", "count", "limit", "trips_at", "trips_again")} == {
        "rule": "fraction", "setting": "automation.max_fraction", "value": 0.34, "count": 2, "limit": 1,
        "trips_at": 2, "trips_again": True}
    assert forecast["why"] == [fraction["text"]]


def test_collector_carries_out_a_release(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any],  # noqa: F811
                                         config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`slurmgpu breaker release` while the collector runs: the collector drains the
    released node once (it used to drop the held drain), and records who released it."""
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    monkeypatch.setenv("SUDO_USER", "alice")
    cfg = make_settings(tmp_path, keys_dir)
    auto, client = automation(tmp_path, max_fraction=0.5)  # 2 nodes: one drained at a time
    auto.fleet_size(2)
    auto.on_report("gpu-a", Severity.FAIL, [decode_finding(ECC)])
    assert auto.on_report("gpu-b", Severity.FAIL, [decode_finding(ECC)])[0].held
    args, _ = with_automation(tmp_path, client, max_fraction=0.5)  # the collector's: the same state
    with running(cfg, **args):
        result = CliRunner().invoke(fleet_cmd.breaker, ["release", "--config", str(config)])
        assert result.exit_code == 0, result.output
        wait_until(lambda: [c[1] for c in client.calls if c[0] == "drain"] == ["gpu-a", "gpu-b"])
    store = Store(cfg.db)
    [d] = store.decisions(node="gpu-b")
    assert (d["action"], d["result"], d["held"]) == ("drain", "drained", False)
    assert d["reason"].endswith("(held by the breaker, released by alice)")
    store.close()
    assert stored(tmp_path).released == {}


# --------------------------------------------------------------------------- where the state is


@pytest.fixture
def no_config_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No --config, no $SLURMGPU_CONFIG (nor $SLURMGPU_DB): /etc/slurmgpu/slurmgpu.toml is
    this test's file."""
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    monkeypatch.delenv("SLURMGPU_CONFIG", raising=False)
    monkeypatch.delenv("SLURMGPU_DB", raising=False)
    default = tmp_path / "etc" / "slurmgpu.toml"
    monkeypatch.setattr("slurmgpu.config.load.DEFAULT_PATH", str(default))
    return default


def test_breaker_status_without_state_is_not_closed(tmp_path: Path, no_config_env: Path) -> None:
    """Without --config, state that is not there used to read as "breaker closed", exit 0,
    while the collector's breaker (in another database) was open."""
    no_config_env.parent.mkdir()
    no_config_env.write_text(f'[collector]\ndb = "{tmp_path / "empty" / "fleet.db"}"\n'
                             f'[paths]\nstate_dir = "{tmp_path / "empty"}"\n')
    for command in ("status", "release"):
        result = CliRunner().invoke(fleet_cmd.breaker, [command])
        assert result.exit_code == 4, result.output
        assert result.output == (
            f"slurmgpu: error: no breaker state in {tmp_path / 'empty' / 'fleet.db'} (is the collector "
            f"running with [automation] enabled?); the database from [collector] db in {no_config_env}\n")
        assert "closed" not in result.output
    assert fleet_cmd.EXIT_NO_STATE == 4
    assert not (tmp_path / "empty").exists()  # neither made the directory nor a database
    # A database without the automation's state (a collector without [automation]) is the same.
    (tmp_path / "empty").mkdir()
    Store(tmp_path / "empty" / "fleet.db").close()
    result = CliRunner().invoke(fleet_cmd.breaker, ["status"])
    assert result.exit_code == 4 and "no breaker state in" in result.output and "closed" not in result.output


def test_breaker_status_finds_the_state_as_the_collector_does(tmp_path: Path, no_config_env: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    auto, _ = automation(tmp_path)  # state in tmp_path/fleet.db
    auto.state.breaker = Breaker(True, 1.0, "storm: ecc.uncorrected failing")
    auto._record.save()
    no_config_env.parent.mkdir()
    no_config_env.write_text(f'[collector]\ndb = "{tmp_path / "fleet.db"}"\n')
    result = CliRunner().invoke(fleet_cmd.breaker, ["status"])  # /etc/slurmgpu/slurmgpu.toml
    assert result.exit_code == 0 and "breaker OPEN" in result.output, result.output
    assert result.output.splitlines()[-1] == f"state: {tmp_path / 'fleet.db'} (config: {no_config_env})"
    # $SLURMGPU_CONFIG comes before it, --config before both; --db and $SLURMGPU_DB before any config.
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(f'[collector]\ndb = "{tmp_path / "nothing.db"}"\n')
    monkeypatch.setenv("SLURMGPU_CONFIG", str(elsewhere))
    assert CliRunner().invoke(fleet_cmd.breaker, ["status"]).exit_code == 4
    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--json", "--config", str(no_config_env)])
    doc = json.loads(result.output)
    assert doc["breaker_open"] and doc["db"] == str(tmp_path / "fleet.db")
    assert doc["config"] == str(no_config_env) and "forecast" in doc
    assert CliRunner().invoke(fleet_cmd.breaker, ["status", "--db", str(tmp_path / "fleet.db")]).exit_code == 0
    monkeypatch.setenv("SLURMGPU_DB", str(tmp_path / "fleet.db"))
    assert CliRunner().invoke(fleet_cmd.breaker, ["status"]).exit_code == 0


def test_breaker_status_with_built_in_defaults_names_them(no_config_env: Path) -> None:
    if Path("/var/lib/slurmgpu/fleet.db").exists():
        pytest.skip("this machine has a real fleet database")
    result = CliRunner().invoke(fleet_cmd.breaker, ["status"])
    assert result.exit_code == 4
    assert result.output == (
        "slurmgpu: error: no breaker state in /var/lib/slurmgpu/fleet.db (is the collector running "
        f"with [automation] enabled?); the database from the built-in default (no {no_config_env})\n")


def test_breaker_help_documents_the_exit_codes() -> None:
    for command in ("status", "release"):
        result = CliRunner().invoke(fleet_cmd.breaker, [command, "--help"])
        assert result.exit_code == 0
        assert "Exit status:" in result.output and "  4  no breaker state" in result.output


def test_a_report_stored_before_a_crash_is_automated_once_at_the_next_start(tmp_path: Path) -> None:
    """One route into the automation on SQLite too (issue 30): what a batch stored goes
    through the inbox, so a report stored (and acked) by a collector that died before its
    automation ran is drained at the next start, and one it did automate is not again."""
    from slurmgpu.collector.counters import Counters
    from slurmgpu.collector.fleet import Fleet
    from slurmgpu.config.schema import CollectorSettings
    from slurmgpu.wire import Envelope

    client = FakeSlurmClient(["gpu-a", "gpu-b"])

    def life() -> Fleet:
        auto = Automation(AutomationSettings(), client, tmp_path / "state", store=Store(tmp_path / "fleet.db"))
        allowed = {f"key-{i}".encode(): f"gpu-{i}" for i in range(40)}  # (the breaker lets two drains by)
        return Fleet(CollectorSettings(), auto.store, Counters(), allowed=allowed, automation=auto, own_store=True)

    def batch(node: str) -> list[Any]:
        report = Envelope(type=REPORT, node=node, seq=1, body={"verdict": "FAIL", "findings": [ECC]},
                          findings=(decode_finding(ECC),))  # (as wire.decode gives it)
        return [(node, report, b"")]

    fleet = life()
    for node, crashes in (("gpu-a", False), ("gpu-b", True)):
        stored_ = fleet.commit(batch(node), 100.0)
        assert stored_ is not None and stored_.new == [(node, 1)]
        if not crashes:
            fleet.acked(batch(node), stored_.new, 100.0)
    assert [c[:2] for c in client.calls] == [("drain", "gpu-a")]
    fleet.store.close()  # the crash: gpu-b's report is stored, its automation never ran
    fleet = life()
    fleet.tick()
    fleet.tick()
    assert [c[:2] for c in client.calls] == [("drain", "gpu-a"), ("drain", "gpu-b")]
    assert fleet.store.count("leader_inbox") == 0 and fleet.store.count("decisions") == 2
    fleet.close()


def test_inbox_rows_a_day_old_are_pruned_on_sqlite_too(tmp_path: Path) -> None:
    """Rows left by a collector that ran the automation, and then ran without it, do not
    stay for ever: the hourly prune drops inbox rows older than a day on either backend."""
    from slurmgpu.collector.counters import Counters
    from slurmgpu.collector.fleet import Fleet
    from slurmgpu.config.schema import CollectorSettings
    from slurmgpu.wire import Envelope

    store = Store(tmp_path / "fleet.db")
    store.inbox = True
    report = Envelope(type=REPORT, node="gpu-a", seq=1, body={"verdict": "OK", "findings": []})
    store.store_batch([("gpu-a", report)], received_at=time.time() - 2 * 86_400)
    assert store.count("leader_inbox") == 1
    fleet = Fleet(CollectorSettings(), store, Counters(), allowed={}, own_store=True)  # no automation
    fleet.tick()  # (the first prune comes at the start)
    assert store.count("leader_inbox") == 0
    fleet.close()
