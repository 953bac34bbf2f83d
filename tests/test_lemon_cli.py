"""`slurmgpu lemon list|clear NODE`: the automation's lemon nodes, from its state in the
collector's database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slurmgpu.cli import cli
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.result import Finding, Severity
from slurmgpu.testing import FakeClock, FakeSlurmClient

NODES = [f"gpu-{i:03d}" for i in range(1, 41)]
FAIL = [Finding("ecc.uncorrected", Severity.FAIL, "3 volatile uncorrected ECC errors", gpu=0)]


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def config(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient(NODES))
    monkeypatch.delenv("SLURMGPU_DB", raising=False)
    path = tmp_path / "slurmgpu.toml"
    path.write_text(f'[collector]\ndb = "{db_path(state_dir)}"\n[paths]\nstate_dir = "{state_dir}"\n')
    return path


def db_path(state_dir: Path) -> Path:
    return state_dir.parent / "fleet.db"


def make_lemon(state_dir: Path, node: str, clock: FakeClock) -> Automation:
    """Drain ``node`` over and over through a real Automation until it is a lemon."""
    auto = Automation(AutomationSettings(), FakeSlurmClient(NODES), state_dir, clock,
                      store=Store(db_path(state_dir)))
    auto.fleet_size(len(NODES))
    for _ in range(3):
        auto.on_report(node, Severity.FAIL, FAIL, clock.time())
        for _ in range(4):
            clock.advance(300)
            auto.on_report(node, Severity.OK, [], clock.time())
    assert node in auto.status()["lemons"]
    return auto


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["lemon", *args])


def stored(state_dir: Path) -> tuple[int | None, dict[str, dict[str, object]], dict[str, list[float]]]:
    """The automation's state in the database: (version, lemons, drain history)."""
    store = Store(db_path(state_dir))
    try:
        record = store.automation()
        return record.version, record.state.lemons, record.state.history
    finally:
        store.close()


def test_list_empty(config: Path, state_dir: Path) -> None:
    result = run("list", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert result.output == "no lemon nodes\n"
    result = run("list", "--config", str(config), "--json")
    assert result.exit_code == 0 and json.loads(result.output) == []
    assert not db_path(state_dir).exists()  # listing writes nothing, makes no database


def test_list_and_clear(config: Path, state_dir: Path) -> None:
    clock = FakeClock()
    make_lemon(state_dir, "gpu-007", clock)
    make_lemon(state_dir, "gpu-003", clock)
    before = stored(state_dir)

    result = run("list", "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["node"] for r in rows] == ["gpu-003", "gpu-007"]
    assert all(set(r) == {"node", "since", "why"} for r in rows)
    assert all(isinstance(r["since"], float) and "drains within" in r["why"] for r in rows)

    result = run("list", "--config", str(config))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [ln.split()[0] for ln in lines] == ["gpu-003", "gpu-007"]
    assert all(" since " in ln and "drains within" in ln for ln in lines)
    assert stored(state_dir) == before  # (the same version: listing writes nothing)

    result = run("clear", "gpu-007", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert result.output == "gpu-007: lemon cleared\n"
    _, lemons, history = stored(state_dir)
    assert set(lemons) == {"gpu-003"} and "gpu-007" not in history

    result = run("clear", "gpu-003", "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["node"], out["cleared"]) == ("gpu-003", True) and "drains within" in out["why"]
    assert stored(state_dir)[1] == {}

    # A fresh Automation (the collector's next load) sees no lemons.
    auto = Automation(AutomationSettings(), FakeSlurmClient(NODES), state_dir, store=Store(db_path(state_dir)))
    assert auto.status()["lemons"] == {}


@pytest.mark.parametrize("as_json", [False, True])
def test_clear_not_a_lemon(config: Path, state_dir: Path, as_json: bool) -> None:
    make_lemon(state_dir, "gpu-003", FakeClock())
    before = stored(state_dir)
    args = ["clear", "gpu-009", "--config", str(config)] + (["--json"] if as_json else [])
    result = CliRunner().invoke(cli, ["lemon", *args])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == "slurmgpu: error: gpu-009 is not a lemon\n"
    assert stored(state_dir) == before


def test_clear_not_a_lemon_without_database(config: Path, state_dir: Path) -> None:
    result = run("clear", "gpu-001", "--config", str(config))
    assert result.exit_code == 1 and "gpu-001 is not a lemon" in result.output
    assert not db_path(state_dir).exists()


def test_bad_config_is_exit_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[paths\n")
    for args in (["list"], ["clear", "gpu-001"]):
        result = run(*args, "--config", str(bad))
        assert result.exit_code == 3, result.output
        assert result.output.startswith("slurmgpu: error: ")


def test_help() -> None:
    for args in (["--help"], ["list", "--help"], ["clear", "--help"]):
        result = run(*args)
        assert result.exit_code == 0, result.output
