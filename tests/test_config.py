"""The config loader, its validation messages, version matching and `slurmgpu config`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.config.load import (
    DEFAULT_PATH,
    ENV_VAR,
    LoadedConfig,
    config_path,
    format_value,
    load_config,
)
from slurmgpu.config.schema import IbSettings, Settings
from slurmgpu.config.versions_match import compare_versions, match_any, spec_error, version_matches
from slurmgpu.errors import ConfigError, ConfigErrors

EXAMPLE = Path(__file__).resolve().parent.parent / "etc" / "slurmgpu.example.toml"


def write(tmp_path: Path, text: str, name: str = "slurmgpu.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def load_text(tmp_path: Path, text: str, known_checks: list[str] | None = None) -> LoadedConfig:
    return load_config(write(tmp_path, text), environ={}, known_checks=known_checks)


def error_of(tmp_path: Path, text: str, known_checks: list[str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={}, known_checks=known_checks)
    assert str(info.value).startswith(path + ":")
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- example file


def test_example_loads_cleanly() -> None:
    cfg = load_config(str(EXAMPLE), environ={})
    assert cfg.path == str(EXAMPLE)
    assert [h.name for h in cfg.hosts] == ["a100", "no-gpu"]
    h100 = cfg.settings_for("gpu-h100-042")
    assert h100.gpu.count == 8
    assert h100.ib.count == 8
    assert h100.ib.rate_gbps == 400
    assert h100.pins.driver == ["550.90.07"]
    assert h100.pins.cuda == [">=12.4"]
    assert h100.pins.nccl == [">=2.21"]
    assert h100.pins.vbios == ["96.00.*"]
    assert h100.pins.ib_firmware == ["28.39.*"]
    a100 = cfg.settings_for("gpu-a100-016")
    assert a100.gpu.count == 8
    assert a100.pins.vbios != h100.pins.vbios
    assert a100.fabric.required is False
    login = cfg.settings_for("login03")
    assert login.gpu.count == 0
    assert login.checks.disabled == ["ib.*"]
    assert cfg.settings_for("cpu-128").gpu.count == 0


def test_example_covers_every_table() -> None:
    import tomllib

    raw = tomllib.loads(EXAMPLE.read_text())
    assert set(Settings.__dataclass_fields__) <= set(raw)


def test_example_checks_disabled_are_known_checks() -> None:
    # "ib.*" must match some check; with the registry's ids when it is importable.
    try:
        from slurmgpu.checks.registry import all_checks

        known = [s.id for s in all_checks()]
    except ImportError:
        known = ["ib.count", "ib.rate", "gpu.count"]
    load_config(str(EXAMPLE), environ={}, known_checks=known)


# --------------------------------------------------------------------------- finding the file


def test_config_path_precedence() -> None:
    env = {ENV_VAR: "/env/slurmgpu.toml"}
    assert config_path("/cli.toml", env) == ("/cli.toml", True)
    assert config_path(None, env) == ("/env/slurmgpu.toml", True)
    assert config_path(None, {}) == (DEFAULT_PATH, False)
    assert config_path(None, {ENV_VAR: ""}) == (DEFAULT_PATH, False)


def test_load_prefers_explicit_over_env(tmp_path: Path) -> None:
    cli = write(tmp_path, "[gpu]\ncount = 1\n", "cli.toml")
    env = write(tmp_path, "[gpu]\ncount = 2\n", "env.toml")
    assert load_config(cli, environ={ENV_VAR: env}).settings_for(None).gpu.count == 1
    assert load_config(None, environ={ENV_VAR: env}).settings_for(None).gpu.count == 2


def test_missing_default_file_gives_defaults() -> None:
    if os.path.exists(DEFAULT_PATH):
        pytest.skip(f"{DEFAULT_PATH} exists on this machine")
    cfg = load_config(None, environ={})
    assert cfg.path is None
    assert cfg.hosts == []
    assert cfg.settings_for("any-node", environ={}) == Settings()
    assert all(r.source == "default" for r in cfg.explain("any-node", environ={}))


def test_missing_explicit_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as info:
        load_config(missing, environ={})
    assert str(info.value) == f"{missing}: config file not found"
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(None, environ={ENV_VAR: missing})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tmp_path), environ={})  # a directory


def test_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_bytes(b"[gpu]\ncount = 8 # \xff\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(str(p), environ={})


# --------------------------------------------------------------------------- merging


HOSTS = """\
[gpu]
count = 8

[pins]
driver = ["550.90.07"]
nccl = ">=2.21"

[ib.counters_max]
symbol_error = 5000

[[hosts]]
name = "first"
nodes = "gpu-[001-010],gpu-100"
gpu.count = 4
pins.driver = ["535.*", "550.*"]

[[hosts]]
nodes = "gpu-[005-006]"
[hosts.gpu]
count = 2
[hosts.ib.counters_max]
link_downed = 1
"""


def test_host_sections_override_in_order(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, HOSTS)
    assert cfg.settings_for(None).gpu.count == 8
    assert cfg.settings_for("other").gpu.count == 8
    assert cfg.settings_for("gpu-100").gpu.count == 4
    assert cfg.settings_for("gpu-003").gpu.count == 4
    assert cfg.settings_for("gpu-005").gpu.count == 2
    assert [h.index for h in cfg.matching_sections("gpu-005")] == [0, 1]
    assert cfg.matching_sections("gpu-5") == []  # hostlist padding is exact
    # lists are replaced, not appended; a single string is a one-entry list
    assert cfg.settings_for("gpu-005").pins.driver == ["535.*", "550.*"]
    assert cfg.settings_for("gpu-005").pins.nccl == [">=2.21"]
    # dict settings merge key by key, over the defaults
    counters = cfg.settings_for("gpu-005").ib.counters_max
    assert counters["symbol_error"] == 5000
    assert counters["link_downed"] == 1
    assert counters["link_error_recovery"] == IbSettings().counters_max["link_error_recovery"]
    assert cfg.settings_for("gpu-001").ib.counters_max["link_downed"] == 5


def test_settings_are_independent_copies(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, HOSTS)
    s = cfg.settings_for("gpu-005")
    s.pins.driver.append("x")
    s.ib.counters_max["symbol_error"] = 1
    again = cfg.settings_for("gpu-005")
    assert again.pins.driver == ["535.*", "550.*"]
    assert again.ib.counters_max["symbol_error"] == 5000


def test_float_setting_accepts_integer(tmp_path: Path) -> None:
    s = load_text(tmp_path, "[ib]\nrate_gbps = 400\n").settings_for(None)
    assert s.ib.rate_gbps == 400.0
    assert isinstance(s.ib.rate_gbps, float)


def test_xid_override_keys_normalized(tmp_path: Path) -> None:
    s = load_text(tmp_path, '[xid.overrides]\n"079" = "drain"\n').settings_for(None)
    assert s.xid.overrides == {"79": "drain"}


def test_explain_sources(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, HOSTS)
    rows = {r.key: r for r in cfg.explain("gpu-005")}
    assert rows["gpu.count"].value == 2
    assert rows["gpu.count"].source == "hosts[1] (gpu-[005-006])"
    assert rows["pins.driver"].source == "hosts[0] first (gpu-[001-010],gpu-100)"
    assert rows["pins.nccl"].source == "top-level"
    assert rows["pins.nccl"].value == [">=2.21"]
    assert rows["gpu.persistence"].source == "default"
    assert rows['ib.counters_max."symbol_error"'].source == "top-level"
    assert rows['ib.counters_max."link_downed"'].source == "hosts[1] (gpu-[005-006])"
    assert rows['ib.counters_max."link_error_recovery"'].source == "default"
    assert rows["xid.overrides"].value == {}
    other = {r.key: r for r in cfg.explain("login1")}
    assert other["gpu.count"].source == "top-level"
    assert other["pins.driver"].value == ["550.90.07"]


def test_format_value() -> None:
    assert format_value(None) == "(not set)"
    assert format_value(True) == "true"
    assert format_value(["a", ">=1"]) == '["a", ">=1"]'
    assert format_value({"79": "drain"}) == '{ "79" = "drain" }'
    assert format_value(400.0) == "400.0"


# --------------------------------------------------------------------------- errors


def test_unknown_top_level_table(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[gpus]\ncount = 4\n")
    assert str(e).endswith(":1: gpus: unknown table 'gpus' (did you mean 'gpu'?)")
    assert (e.key, e.line) == ("gpus", 1)


def test_unknown_table_without_close_match_lists_valid(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[zzz]\na = 1\n")
    assert "unknown table 'zzz' (expected one of: gpu, pins," in str(e)


def test_host_key_at_top_level(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'nodes = "gpu-[1-4]"\n')
    assert str(e).endswith(":1: nodes: 'nodes' belongs in a [[hosts]] section")


def test_misspelled_key_did_you_mean(tmp_path: Path) -> None:
    e = error_of(tmp_path, "# comment\n[gpu]\ncuont = 4\n")
    assert str(e).endswith(":3: gpu.cuont: unknown key 'cuont' (did you mean 'count'?)")


def test_misspelled_key_in_hosts(tmp_path: Path) -> None:
    text = '[[hosts]]\nnodes = "a[1-2]"\n\n[[hosts]]\nnodes = "b1"\ngpu.cuont = 1\n'
    e = error_of(tmp_path, text)
    assert e.key == "hosts[1].gpu.cuont"
    assert e.line == 6
    assert "did you mean 'count'?" in str(e)


def test_wrong_type_str_for_int(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[gpu]\ncount = "8"\n')
    assert str(e).endswith(':2: gpu.count: expected an integer, got a string ("8")')


def test_wrong_type_bool_for_int(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[gpu]\ncount = true\n")
    assert str(e).endswith(":2: gpu.count: expected an integer, got a boolean (true)")


def test_wrong_type_int_for_bool(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[ecc]\nrequire_enabled = 1\n")
    assert e.key == "ecc.require_enabled"
    assert "expected a boolean (true or false), got an integer (1)" in str(e)


def test_wrong_type_table_for_scalar_and_list_items(tmp_path: Path) -> None:
    assert "expected a table" in str(error_of(tmp_path, "gpu = 4\n"))
    e = error_of(tmp_path, "[ib]\ndevices = [\"mlx5_0\", 3]\n")
    assert e.key == "ib.devices[1]"
    assert "expected a string, got an integer (3)" in str(e)


def test_bad_literal(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[pins]\nseverity = "error"\n')
    assert str(e).endswith(
        ':2: pins.severity: must be one of "warn", "fail"; got a string ("error")')


def test_bad_literal_dict_value(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[xid.overrides]\n"79" = "panic"\n')
    assert e.key == 'xid.overrides."79"'
    assert 'must be one of "ignore", "warn", "checkpoint", "drain", "reset", "reboot"' in str(e)


def test_bad_hostlist(tmp_path: Path) -> None:
    text = '[[hosts]]\nnodes = "a1"\n[[hosts]]\nnodes = "b1"\n[[hosts]]\nnodes = "gpu-[001-"\n'
    e = error_of(tmp_path, text)
    assert e.key == "hosts[2].nodes"
    assert e.line == 6
    assert 'invalid hostlist "gpu-[001-": missing bracket' in str(e)


@pytest.mark.parametrize(("nodes", "message"), [
    ("", "empty hostlist"),
    ("gpu[5-1]", "bad range"),
    ("@gpus", "node groups (@group) are not supported"),
    ("gpu1 gpu2", "node names cannot contain spaces"),
])
def test_other_bad_hostlists(tmp_path: Path, nodes: str, message: str) -> None:
    e = error_of(tmp_path, f'[[hosts]]\nnodes = "{nodes}"\n')
    assert e.key == "hosts[0].nodes"
    assert message in str(e)


def test_missing_nodes_in_hosts(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[gpu]\ncount = 8\n\n[[hosts]]\nname = "x"\ngpu.count = 4\n')
    assert e.key == "hosts[0]"
    assert e.line == 4
    assert "missing required key 'nodes'" in str(e)


def test_hosts_must_be_array_of_tables(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[hosts]\nnodes = "a1"\n')
    assert e.key == "hosts"
    assert "[[hosts]]" in str(e)


def test_bad_xid_override_key(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[xid.overrides]\n"79" = "drain"\nabc = "warn"\n')
    assert 'xid.overrides."abc": XID must be an integer from 1 to 1000' in str(e)
    assert e.line == 3
    e = error_of(tmp_path, '[xid]\noverrides = { "1001" = "warn" }\n')
    assert e.key == 'xid.overrides."1001"'


def test_bad_pin_spec(tmp_path: Path) -> None:
    e = error_of(tmp_path, '[pins]\ndriver = ["550.*", "=>550"]\n')
    assert e.key == "pins.driver[1]"
    assert "invalid version spec '=>550'" in str(e)
    e = error_of(tmp_path, '[[hosts]]\nnodes = "a1"\npins.nccl = ">="\n')
    assert e.key == "hosts[0].pins.nccl"
    assert e.line == 3
    assert "no version after '>='" in str(e)


def test_unknown_ib_counter(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[ib.counters_max]\nsymbol_errors = 3\n")
    assert str(e).endswith(':2: ib.counters_max."symbol_errors": unknown IB counter '
                           "'symbol_errors' (did you mean 'symbol_error'?)")


def test_negative_threshold(tmp_path: Path) -> None:
    # Every range is covered in test_config_ranges.py; these pin the message's shape.
    e = error_of(tmp_path, "[ecc]\nuncorrected_volatile_max = -1\n")
    assert str(e).endswith(
        ":2: ecc.uncorrected_volatile_max: must be from 0 to 1000000000; got -1")
    e = error_of(tmp_path, "[ib.counters_delta_max]\nlink_downed = -1\n")
    assert e.key == 'ib.counters_delta_max."link_downed"'
    assert "must be from 1 to 32; got 0" in str(error_of(tmp_path, "[pcie]\nwidth = 0\n"))


def test_toml_syntax_error(tmp_path: Path) -> None:
    e = error_of(tmp_path, "[gpu]\ncount = = 4\n")
    assert e.line == 2
    assert ":2: invalid TOML: " in str(e)
    assert "(at line 2, column" in str(e)


def test_toml_error_at_the_end_of_the_file_names_a_line(tmp_path: Path) -> None:
    """Issue 29 item 7: an unclosed array was "invalid TOML: Invalid value (at end of
    document)" with no line at all."""
    e = error_of(tmp_path, '[pins]\ndriver = ["550.90.07",\n\n')
    assert e.line == 2 and ":2: invalid TOML: " in str(e)


def test_every_problem_is_reported_not_the_first(tmp_path: Path, runner: CliRunner) -> None:
    from slurmgpu.cli.config_cmd import config

    text = ('[gpu]\ncount = "x"\ncuont = 4\n[[hosts]]\nnodes = "n[1-2]"\n[hosts.gpu]\ncount = -4\n'
            '[[hosts]]\nname = "no nodes"\n[wat]\n')
    e = error_of(tmp_path, text)
    assert isinstance(e, ConfigErrors) and [x.line for x in e.errors] == [2, 3, 7, 8, 10]
    assert str(e).endswith('gpu.count: expected an integer, got a string ("x") (and 4 more: '
                           "slurmgpu config check lists them)")
    result = runner.invoke(config, ["check", str(tmp_path / "slurmgpu.toml")])
    assert result.exit_code == 3 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert [line.split(":")[3] for line in lines] == ["2", "3", "7", "8", "10"]
    assert "unknown key 'cuont' (did you mean 'count'?)" in lines[1]
    assert "missing required key 'nodes'" in lines[3]


def test_a_hosts_section_that_matches_no_slurm_node_warns(tmp_path: Path, runner: CliRunner) -> None:
    from slurmgpu.cli.config_cmd import config

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2 $3" = "-o show node" ] || exit 1\n'
                                      'echo "NodeName=gpu-n1 State=IDLE"\necho "NodeName=gpu-n2 State=IDLE"\n')
    (bin_dir / "scontrol").chmod(0o755)
    path = write(tmp_path, f'[slurm]\nbin_dir = "{bin_dir}"\n[[hosts]]\nnodes = "gpu-n[1-2]"\n'
                           '[[hosts]]\nname = "typo"\nnodes = "gpu-m[1-2]"\n')
    result = runner.invoke(config, ["check", path])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f'WARN: {path}:7: hosts[1] typo (gpu-m[1-2]): matches none of the 2 nodes Slurm knows',
        f"OK: {path}: 2 host sections"]
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")  # slurmctld does not answer
    assert runner.invoke(config, ["check", path]).stdout == f"OK: {path}: 2 host sections\n"
    result = runner.invoke(config, ["check", "--slurm", path])
    assert result.exit_code == 3 and result.stderr.startswith("slurmgpu: error: --slurm: Slurm did not list its nodes")


def test_unknown_check_id(tmp_path: Path) -> None:
    known = ["gpu.count", "ib.count", "ib.rate"]
    e = error_of(tmp_path, '[checks]\ndisabled = ["ib.rate", "gpu.cont"]\n', known_checks=known)
    assert e.key == "checks.disabled[1]"
    assert "unknown check 'gpu.cont' (did you mean 'gpu.count'?)" in str(e)
    e = error_of(tmp_path, '[checks]\ndisabled = "nvlink.*"\n', known_checks=known)
    assert e.key == "checks.disabled"
    assert "pattern 'nvlink.*' matches no check" in str(e)
    cfg = load_text(tmp_path, '[checks]\ndisabled = ["ib.*"]\n', known_checks=known)
    assert cfg.settings_for(None).checks.disabled == ["ib.*"]
    # without known_checks the ids are not checked
    load_text(tmp_path, '[checks]\ndisabled = ["whatever"]\n')


def test_line_numbers_for_inline_and_dotted_keys(tmp_path: Path) -> None:
    assert error_of(tmp_path, 'gpu = { count = "x" }\n').line == 1
    assert error_of(tmp_path, '\n\ngpu.mig = "on"\n').line == 3
    text = '[ib]\ncount = 8\n\n[ib.counters_max]\n"link_downed" = -5\n'
    assert error_of(tmp_path, text).line == 5


# --------------------------------------------------------------------------- version matching


@pytest.mark.parametrize(("actual", "spec", "expected"), [
    ("550.90.07", "550.90.07", True),
    ("550.90.7", "550.90.07", True),
    ("550.90.08", "550.90.07", False),
    ("12.4", "12.4.0", True),
    ("96.00.74.00.01", "96.00.*", True),
    ("92.00.45.00.03", "96.00.*", False),
    ("28.39.1002", "28.39.*", True),
    ("12.4", ">=12.4", True),
    ("12.3", ">=12.4", False),
    ("12.10", ">=12.4", True),
    ("2.21.5", ">=2.21", True),
    ("2.20.5", ">=2.21", False),
    ("2.21.5", ">2.21.5", False),
    ("2.21.5", "<=2.21.5", True),
    ("13.0", "<13", False),
    ("12.9", "<13", True),
    ("12.4.1", "==12.4.1", True),
    ("12.6", ">=12.4,<13", True),
    ("13.1", ">=12.4,<13", False),
    ("2.21rc1", "<2.21", True),
    ("24.04-0.6.6.0", ">=23.10", True),
    ("550.90.07", ">= 550", True),
    ("", ">=1", False),
])
def test_version_matches(actual: str, spec: str, expected: bool) -> None:
    assert version_matches(actual, spec) is expected


def test_match_any() -> None:
    assert match_any("550.90.07", ["535.*", "550.90.07"])
    assert not match_any("545.23.08", ["535.*", "550.*"])
    assert match_any("anything", [])  # not pinned


def test_compare_versions() -> None:
    assert compare_versions("1.10", "1.9") == 1
    assert compare_versions("1.0", "1.0.0") == 0
    assert compare_versions("1.0a", "1.0") == -1


@pytest.mark.parametrize("spec", ["550.90.07", "96.00.*", ">=12.4", "< 13", "==2.21.5",
                                  ">=12.4,<13", "24.04-0.6.6.0", "5[0-9]0.*"])
def test_valid_specs(spec: str) -> None:
    assert spec_error(spec) is None


@pytest.mark.parametrize("spec", ["", "  ", "=>12", ">=", ">=12.*", "~=1.2", "550 90",
                                  ">=abc", "12.4,>=13", "!=1"])
def test_invalid_specs(spec: str) -> None:
    assert spec_error(spec) is not None


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_cli_check_ok(runner: CliRunner) -> None:
    from slurmgpu.cli.config_cmd import config

    result = runner.invoke(config, ["check", str(EXAMPLE)], env={ENV_VAR: ""})
    assert result.exit_code == 0, result.output
    assert result.output == f"OK: {EXAMPLE}: 2 host sections\n"


def test_cli_check_uses_env(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    path = write(tmp_path, '[[hosts]]\nnodes = "a[1-4]"\n')
    result = runner.invoke(config, ["check"], env={ENV_VAR: path})
    assert result.exit_code == 0, result.output
    assert result.output == f"OK: {path}: 1 host section\n"


def test_cli_check_json(runner: CliRunner) -> None:
    from slurmgpu.cli.config_cmd import config

    result = runner.invoke(config, ["check", "--json", str(EXAMPLE)])
    assert result.exit_code == 0
    assert json.loads(result.output) == {"ok": True, "path": str(EXAMPLE), "exists": True,
                                         "host_sections": 2, "dropins": [], "warnings": []}


def test_cli_check_invalid(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    path = write(tmp_path, "[gpu]\ncuont = 4\n")
    result = runner.invoke(config, ["check", path])
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr == (f"slurmgpu: error: {path}:2: gpu.cuont: unknown key 'cuont' "
                             "(did you mean 'count'?)\n")
    result = runner.invoke(config, ["check", "--json", path])
    assert result.exit_code == 3
    out = json.loads(result.stdout)
    assert out["ok"] is False
    assert (out["key"], out["line"], out["path"]) == ("gpu.cuont", 2, path)


def test_cli_check_missing_file(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    result = runner.invoke(config, ["check", str(tmp_path / "nope.toml")])
    assert result.exit_code == 3
    assert "config file not found" in result.stderr


def test_cli_explain(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    path = write(tmp_path, HOSTS)
    result = runner.invoke(config, ["explain", "--node", "gpu-005", "--config", path])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"node gpu-005: config {path}"
    assert lines[2].split() == ["KEY", "VALUE", "SOURCE"]
    count = next(line for line in lines if line.startswith("gpu.count"))
    assert count.split(None, 2) == ["gpu.count", "2", "hosts[1] (gpu-[005-006])"]
    assert not any(line.startswith("gpu.persistence") for line in lines)
    assert lines[-1].endswith("at the default (--all shows them)")
    result = runner.invoke(config, ["explain", "--node", "gpu-005", "--config", path, "--all"])
    assert any(line.startswith("gpu.persistence") for line in result.output.splitlines())


def test_cli_explain_json(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    path = write(tmp_path, HOSTS)
    result = runner.invoke(config, ["explain", "--node", "gpu-005", "--json"],
                           env={ENV_VAR: path})
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["node"] == "gpu-005"
    assert out["path"] == path
    assert out["sections"] == ["hosts[0] first (gpu-[001-010],gpu-100)",
                               "hosts[1] (gpu-[005-006])"]
    settings = {s["key"]: s for s in out["settings"]}
    assert settings["gpu.count"] == {"key": "gpu.count", "value": 2,
                                     "source": "hosts[1] (gpu-[005-006])"}
    assert "gpu.persistence" not in settings
    total = len(Settings().__dataclass_fields__)
    assert out["defaulted"] > total
    result = runner.invoke(config, ["explain", "--node", "gpu-005", "--json", "--all",
                                    "--config", path])
    out_all = json.loads(result.output)
    assert len(out_all["settings"]) == len(out["settings"]) + out["defaulted"]


def test_cli_explain_invalid(runner: CliRunner, tmp_path: Path) -> None:
    from slurmgpu.cli.config_cmd import config

    path = write(tmp_path, '[[hosts]]\nnodes = "gpu-[1-"\n')
    result = runner.invoke(config, ["explain", "--node", "x", "--config", path])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"slurmgpu: error: {path}:2: hosts[0].nodes: ")
