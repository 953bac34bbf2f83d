"""Every command that reads the fleet database finds it the same way (issue 13 item 4):
--db > $SLURMGPU_DB > [collector] db of the config (--config > $SLURMGPU_CONFIG) > the
built-in default; a missing database is one line naming the path and where it came from;
`sim cluster env` exports the head node's config so these commands read that cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmgpu.cli.common import Loaded, fleet_db
from slurmgpu.collector.store import Store
from slurmgpu.config.load import LoadedConfig, parse_config
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.sim.cluster import SimCluster

READERS = [["fleet"], ["jobs", "events", "12"], ["report", "--since", "1h", "--format", "json"],
           ["report-nightly", "--no-mail", "--dir", "{tmp}/reports"]]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURMGPU_CONFIG", "SLURMGPU_DB")}
    return {**env, **extra}


DEFAULT_DB = CollectorSettings().db


def loaded(config: LoadedConfig, env: dict[str, str]) -> Loaded:
    return Loaded(config, config.settings_for(None, env))


def test_the_resolution_order() -> None:
    env = {"SLURMGPU_DB": "/env.db"}
    config = parse_config('[collector]\ndb = "/cfg.db"\n', path="/c.toml")
    assert fleet_db(loaded(config, env), "/flag.db", env).path == "/flag.db"
    found = fleet_db(loaded(config, env), None, env)
    assert (found.path, found.source) == ("/env.db", "$SLURMGPU_DB")
    found = fleet_db(loaded(config, {}), None, {})
    assert (found.path, found.source) == ("/cfg.db", "[collector] db in /c.toml")
    found = fleet_db(loaded(LoadedConfig(path=None), {}), None, {})
    assert (found.path, found.source) == (DEFAULT_DB, "the built-in default")


@pytest.mark.parametrize("args", READERS)
def test_every_reader_takes_the_db_from_the_config_in_the_environment(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "head" / "fleet.db"
    Store(db).close()
    config = tmp_path / "head.toml"
    config.write_text(f'[collector]\ndb = "{db}"\n[paths]\nstate_dir = "{tmp_path}/state"\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run(argv, clean_env(SLURMGPU_CONFIG=str(config)))
    assert "no fleet database" not in proc.stderr, proc.stderr
    if args[0] != "jobs":  # (an unknown job is its own error)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args", READERS)
def test_a_missing_database_names_the_path_and_its_source(tmp_path: Path, args: list[str]) -> None:
    config = tmp_path / "head.toml"
    config.write_text(f'[collector]\ndb = "{tmp_path}/nope.db"\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run(argv, clean_env(SLURMGPU_CONFIG=str(config)))
    assert proc.returncode != 0
    assert f"no fleet database at {tmp_path}/nope.db (from [collector] db in {config})" in proc.stderr
    proc = run(argv, clean_env(SLURMGPU_CONFIG=str(config), SLURMGPU_DB=str(tmp_path / "env.db")))
    assert f"no fleet database at {tmp_path}/env.db (from $SLURMGPU_DB)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", READERS)
def test_help_gives_the_real_default(args: list[str]) -> None:
    out = run([*args[:2 if args[0] == "jobs" else 1], "--help"], clean_env()).stdout
    assert DEFAULT_DB in " ".join(out.split()) and "collector.db" not in out


def test_the_sim_cluster_shell_env_points_the_fleet_commands_at_the_cluster(cluster: SimCluster) -> None:
    env = cluster.shell_env()
    config = tomllib.loads(Path(env["SLURMGPU_CONFIG"]).read_text())
    assert config["collector"]["db"] == str(cluster.collector_db())
    assert config["paths"]["state_dir"] == str(cluster.collector_state_dir)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "sim", "cluster", "env", "--dir", str(cluster.dir)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert f"export SLURMGPU_CONFIG={env['SLURMGPU_CONFIG']}" in proc.stdout.splitlines()
