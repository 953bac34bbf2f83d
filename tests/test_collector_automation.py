"""The collector with automation, over real sockets; the `slurmgpu breaker` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from slurmgpu.cli import fleet_cmd
from slurmgpu.collector.policy import STATE_FILE, Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.wire import EVENT, REPORT
from tests.test_collector import Agent, ctx, db_rows, keys_dir, make_settings, running  # noqa: F401

ECC = {"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 0, "subject": None,
       "message": "3 volatile uncorrected ECC errors", "not_applicable": False, "data": {}}




def automation(tmp_path: Path, **kw: Any) -> tuple[Automation, FakeSlurmClient]:
    client = FakeSlurmClient(["gpu-a", "gpu-b"])
    return Automation(AutomationSettings(**kw), client, tmp_path / "state"), client


def wait_for(predicate: Any, timeout_s: float = 3.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_fail_report_drains_and_records(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    auto, client = automation(tmp_path)
    with running(cfg, auto) as collector:
        assert auto.state.fleet == 2  # the allow-list size
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(REPORT, 1, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
        assert agent.acked() == [1]
        assert wait_for(lambda: collector.counters.decisions == 1)
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
    auto, client = automation(tmp_path, dry_run=True)
    with running(cfg, auto) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-b")
        agent.send(REPORT, 1, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
        assert agent.acked() == [1]
        assert wait_for(lambda: collector.counters.decisions == 1)
    assert client.calls == []
    assert db_rows(cfg, "SELECT node, action, result, dry_run FROM decisions") == [
        ("gpu-b", "drain", "dry-run", 1)]


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def fleet_size(self, n: int) -> None:
        raise RuntimeError("fleet size broken")

    def on_report(self, *a: Any) -> list[Any]:
        self.calls += 1
        raise RuntimeError("policy bug")


def test_automation_failure_keeps_serving(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    broken = Broken()
    with running(cfg, broken) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        for seq in (1, 2, 3):
            agent.send(REPORT, seq, {"verdict": "FAIL", "findings": [ECC], "facts": {}})
            assert agent.acked() == [seq]
        assert wait_for(lambda: broken.calls == 3)
        assert collector.counters.automation_errors >= 4  # fleet_size at start + 3 reports
        assert collector.counters.acks_sent == 3 and collector.counters.stored == 3
    assert db_rows(cfg, "SELECT count(*) FROM decisions") == [(0,)]


def test_external_release_is_picked_up(tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir)
    auto, _client = automation(tmp_path)
    auto.state.breaker = {"open": True, "since": 1.0, "why": "test"}
    with running(cfg, auto):
        other, _ = automation(tmp_path)
        assert other.status()["breaker_open"]
        other.release()
        assert wait_for(lambda: not auto.state.breaker.get("open"))


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "slurmgpu.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def test_breaker_status_and_release(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    auto, _ = automation(tmp_path)
    auto.state.breaker = {"open": True, "since": 1.0, "why": "storm: ecc.uncorrected failing"}
    auto.state.held["gpu-a"] = {"action": "drain", "reason": "slurmgpu: x", "trigger": "t", "time": 1.0}
    auto.state.lemons["gpu-b"] = {"since": 1.0, "why": "3 drains"}
    auto._save()

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
    on_disk = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert on_disk["breaker"]["open"] is False

    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(config)])
    assert result.exit_code == 0 and "breaker closed" in result.output


def test_collector_automation_from_config(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    settings = fleet_cmd._settings(str(config))
    assert settings.automation.enabled is False
    auto = fleet_cmd._automation(settings, dry_run=True)
    assert auto.settings.dry_run and auto.path == Path(settings.paths.state_dir) / STATE_FILE
    assert not fleet_cmd._automation(settings).settings.dry_run


def test_breaker_bad_config_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient())
    bad = tmp_path / "bad.toml"
    bad.write_text('[automation.policy]\n"ecc.uncorrected" = "explode"\n')
    result = CliRunner().invoke(fleet_cmd.breaker, ["status", "--config", str(bad)])
    assert result.exit_code == 3
    assert len(result.output.strip().splitlines()) == 1 and "error" in result.output


def test_fleet_prints_breaker_line(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient(["gpu-a"]))
    store = Store(tmp_path / "f.db")
    store.store_batch([("gpu-a", _report("gpu-a"))])
    store.close()
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", str(tmp_path / "f.db")])
    assert result.exit_code == 0, result.output
    assert "automation" not in result.output  # no state file yet
    auto, _ = automation(tmp_path)
    auto.fleet_size(1)
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config), "--db", str(tmp_path / "f.db")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "automation: breaker closed; lemons: none"


def _report(node: str) -> Any:
    from slurmgpu.wire import Envelope

    return Envelope(type=REPORT, node=node, seq=1, body={"verdict": "OK", "findings": []})
