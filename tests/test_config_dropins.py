"""Drop-ins (``<config>.d/*.toml``) and the minimal live config the packages install."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.config.load import dropin_dir, dropin_files, load_config
from slurmgpu.errors import ConfigError
from slurmgpu.quickgate import read_config

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "etc" / "slurmgpu.toml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(tmp_path / "slurmgpu.toml", '[gpu]\ncount = 8\nmig = "disabled"\n'
                                             '[ib.counters_max]\nsymbol_error = 5\n')


def test_the_dropin_directory_is_named_after_the_file() -> None:
    assert dropin_dir("/etc/slurmgpu/slurmgpu.toml") == "/etc/slurmgpu/slurmgpu.d"
    assert dropin_dir("/srv/site.conf") == "/srv/site.conf.d"


def test_dropins_are_read_in_byte_order_and_others_are_not(config: Path) -> None:
    d = config.parent / "slurmgpu.d"
    for name in ("50-site.toml", "10-fleet.toml", "Z-upper.toml", "90-x.toml.dpkg-old",
                 ".hidden.toml", "README", "70-x.toml~"):
        write(d / name, "")
    assert [os.path.basename(f) for f in dropin_files(str(config))] == [
        "10-fleet.toml", "50-site.toml", "Z-upper.toml"]


def test_a_later_file_wins_key_by_key(config: Path) -> None:
    d = config.parent / "slurmgpu.d"
    write(d / "10-a.toml", "[gpu]\ncount = 4\n[ib.counters_max]\nlink_downed = 1\n")
    write(d / "20-b.toml", '[gpu]\ncount = 2\n[[hosts]]\nnodes = "n[1-2]"\ngpu.count = 1\n')
    loaded = load_config(str(config), environ={})
    node, other = loaded.settings_for("n1", environ={}), loaded.settings_for("x9", environ={})
    assert (node.gpu.count, other.gpu.count, other.gpu.mig) == (1, 2, "disabled")
    assert other.ib.counters_max["symbol_error"] == 5 and other.ib.counters_max["link_downed"] == 1
    sources = {r.key: r.source for r in loaded.explain("n1", environ={})}
    assert sources["gpu.count"] == "20-b.toml: hosts[0] (n[1-2])"
    assert sources["gpu.mig"] == "top-level"


def test_a_dropin_top_level_wins_over_the_files_hosts_sections(tmp_path: Path) -> None:
    main = write(tmp_path / "slurmgpu.toml", '[[hosts]]\nnodes = "n1"\ngpu.count = 8\n')
    write(tmp_path / "slurmgpu.d" / "50-site.toml", "[gpu]\ncount = 4\n")
    assert load_config(str(main), environ={}).settings_for("n1", environ={}).gpu.count == 4


def test_an_error_in_a_dropin_names_its_file_line_and_key(config: Path) -> None:
    bad = write(config.parent / "slurmgpu.d" / "50-site.toml", '\n\n[gpu]\nmig = "sometimes"\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(config), environ={})
    assert str(err.value).startswith(f"{bad}:4: gpu.mig: ")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 3 and f"{bad}:4: gpu.mig" in result.output


def test_dropins_apply_where_the_default_file_is_absent(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.config import load

    monkeypatch.setattr(load, "DEFAULT_PATH", str(tmp_path / "slurmgpu.toml"))
    write(tmp_path / "slurmgpu.d" / "50-site.toml", "[gpu]\ncount = 3\n")
    loaded = load.load_config(None, environ={})
    assert loaded.path is None and loaded.settings_for(None, environ={}).gpu.count == 3


def test_config_check_and_explain_list_the_dropins(config: Path) -> None:
    site = write(config.parent / "slurmgpu.d" / "50-site.toml", "[gpu]\ncount = 4\n")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 0 and f"drop-ins, later wins: {site}" in result.output
    result = CliRunner().invoke(cli, ["config", "explain", "--config", str(config), "--node", "n1"])
    lines = result.output.splitlines()
    assert lines[0] == f"node n1: config {config}; drop-ins, later wins: {site}"
    assert any(line.split() == ["gpu.count", "4", "50-site.toml:", "top-level"] for line in lines)


def test_the_quick_paths_read_the_dropins_too(config: Path) -> None:
    """quickgate (socket, timeout, on_error) and the TaskProlog (jobs_dir) read the same files."""
    from slurmgpu.jobfiles import configured_jobs_dir

    write(config.parent / "slurmgpu.d" / "50-site.toml",
          '[agent]\nsocket = "/run/site.sock"\njobs_dir = "/run/site-jobs"\n')
    write(config.parent / "slurmgpu.d" / "60-bad.toml", "not toml [")
    assert read_config(str(config))["agent"] == {"socket": "/run/site.sock", "jobs_dir": "/run/site-jobs"}
    assert read_config(str(config))["gpu"]["count"] == 8
    assert configured_jobs_dir({}, str(config)) == "/run/site-jobs"


def test_the_live_config_sets_nothing_and_validates() -> None:
    """The shipped /etc/slurmgpu/slurmgpu.toml: no pins, no count, no IB expectation; the
    defaults it leaves in place are the safe ones."""
    assert tomllib.loads(LIVE.read_text()) == {}
    settings = load_config(str(LIVE), environ={}).settings_for("any-node", environ={})
    assert settings.gpu.count is None and settings.ib.count is None and settings.ib.rate_gbps is None
    pins = settings.pins
    assert not any([pins.driver, pins.cuda, pins.cuda_driver, pins.nccl, pins.vbios,
                    pins.ib_firmware, pins.ofed])
    assert settings.fabric.required is None and settings.nvlink.links is None
