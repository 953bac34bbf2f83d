"""Range checks on every numeric setting, and the loader's other bounds (file size,
nesting depth, hostlist size): issue 12, item 5 and its "Also" items.

The per-setting tests iterate the schema (``numeric_settings``), so a new numeric
setting is covered, and must declare a Range, without touching this file.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.config.hosts import hostlist_size_bound
from slurmgpu.config.load import (
    MAX_CONFIG_BYTES,
    MAX_HOSTLIST_NODES,
    NumericSetting,
    load_config,
    numeric_settings,
    parse_config,
    ranges_markdown,
)
from slurmgpu.config.schema import Range, Settings
from slurmgpu.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "config-ranges.md"
NUMERIC = numeric_settings()


def _id(n: NumericSetting) -> str:
    return n.key


def toml_number(n: NumericSetting, value: float) -> str:
    """``value`` as the setting's TOML literal (nan/inf are TOML's own spellings)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if n.kind is int and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def entry(n: NumericSetting) -> str | None:
    """The dict key a per-entry setting is written under (a real counter name)."""
    return next(iter(n.default)) if n.per_entry else None


def assignment(n: NumericSetting, literal: str) -> str:
    """The lines (after a header or in a [[hosts]] section) that set ``n`` to ``literal``."""
    name = entry(n)
    if name is None:
        return f"{n.table}.{n.name} = {literal}\n"
    return f"{n.table}.{n.name}.{name} = {literal}\n"


def error_key(n: NumericSetting, prefix: str = "") -> str:
    name = entry(n)
    return prefix + n.table + "." + n.name + (f'."{name}"' if name else "")


def read_back(n: NumericSetting, cfg_value: Settings) -> object:
    value = getattr(getattr(cfg_value, n.table), n.name)
    name = entry(n)
    return value[name] if name is not None else value


def refused(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "slurmgpu.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ={})
    message = str(info.value)
    assert "\n" not in message
    where = str(path) if info.value.line is None else f"{path}:{info.value.line}"
    assert message.startswith(f"{where}: ")
    return info.value


def bad_values(n: NumericSetting) -> list[float]:
    assert n.bounds is not None
    lo, hi = n.bounds.lo, n.bounds.hi
    below = lo - 1 if n.kind is int or lo <= 0 else lo / 2
    above = hi + 1 if n.kind is int else hi * 2
    return [math.nan, math.inf, -math.inf, below, above]


# --------------------------------------------------------------------------- the schema


def test_every_numeric_setting_declares_a_range() -> None:
    assert NUMERIC, "no numeric settings found"
    missing = [n.key for n in NUMERIC if n.bounds is None]
    assert missing == [], f"numeric settings without Range(...) in schema.py: {missing}"
    for n in NUMERIC:
        assert n.bounds is not None
        assert math.isfinite(n.bounds.lo) and math.isfinite(n.bounds.hi)
        assert n.bounds.lo <= n.bounds.hi, n.key


def test_numeric_settings_finds_every_numeric_default() -> None:
    # An independent walk over the defaults: a number (or a dict of numbers) must be listed.
    listed = {(n.table, n.name) for n in NUMERIC}
    defaults = Settings()
    for tf in dataclasses.fields(Settings):
        table = getattr(defaults, tf.name)
        for kf in dataclasses.fields(table):
            value = getattr(table, kf.name)
            numbers = list(value.values()) if isinstance(value, dict) else [value]
            if numbers and all(isinstance(v, int | float) and not isinstance(v, bool)
                               for v in numbers):
                assert (tf.name, kf.name) in listed, f"{tf.name}.{kf.name}"


def test_defaults_lie_in_their_ranges() -> None:
    for n in NUMERIC:
        assert n.bounds is not None
        values = list(n.default.values()) if n.per_entry else [n.default]
        for v in values:
            assert v is None or v in n.bounds, f"{n.key} default {v} outside {n.bounds}"


def test_range_membership() -> None:
    r = Range(1, 10, off=0)
    assert 0 in r and 1 in r and 10 in r and 5.5 in r
    assert 0.5 not in r and 11 not in r and -1 not in r
    assert math.nan not in r and math.inf not in r and -math.inf not in r
    assert 10**26 not in r and True not in r and "5" not in r
    assert r.describe() == "0 (off) or 1 to 10"
    assert Range(0.05, 3600).describe("from ") == "from 0.05 to 3600"


# --------------------------------------------------------------------------- every setting


@pytest.mark.parametrize("n", NUMERIC, ids=_id)
def test_setting_refuses_out_of_range(tmp_path: Path, n: NumericSetting) -> None:
    for value in bad_values(n):
        literal = toml_number(n, value)
        e = refused(tmp_path, "# a comment first\n" + assignment(n, literal))
        assert e.key == error_key(n), literal
        assert e.line == 2, literal
        text = str(e)
        if n.kind is int and not float(value).is_integer():
            assert "expected an integer, got a float" in text, text
        else:
            assert f"must be {'a finite number, ' if not math.isfinite(value) else ''}" \
                   f"{n.bounds.describe('from ') if n.bounds else ''}; got " in text, text


@pytest.mark.parametrize("n", NUMERIC, ids=_id)
def test_setting_refuses_out_of_range_in_hosts(tmp_path: Path, n: NumericSetting) -> None:
    for value in (math.inf, bad_values(n)[-1]):
        literal = toml_number(n, value)
        text = f'[[hosts]]\nnodes = "gpu-[1-4]"\n\n[[hosts]]\nnodes = "gpu-9"\n' \
               f"{assignment(n, literal)}"
        e = refused(tmp_path, text)
        assert e.key == error_key(n, "hosts[1]."), literal
        assert e.line == 6, literal


@pytest.mark.parametrize("n", NUMERIC, ids=_id)
def test_setting_accepts_default_and_bounds(n: NumericSetting) -> None:
    assert n.bounds is not None
    default = n.default[entry(n)] if n.per_entry else n.default
    values = [n.bounds.lo, n.bounds.hi]
    values += [v for v in (default, n.bounds.off) if v is not None]
    for value in values:
        literal = toml_number(n, value)
        cfg = parse_config(assignment(n, literal), path="t.toml")
        got = read_back(n, cfg.settings_for(None))
        assert got == value, (n.key, literal, got)
        assert type(got) is n.kind
        host = parse_config(f'[[hosts]]\nnodes = "a1"\n{assignment(n, literal)}', path="t.toml")
        assert read_back(n, host.settings_for("a1")) == value


def test_moved_key_is_range_checked_too(tmp_path: Path) -> None:
    # [agent] flap_count is read as [ib] flap_count, and held to its range.
    e = refused(tmp_path, "[agent]\nflap_count = 0\n")
    assert e.key == "agent.flap_count"
    assert "must be from 1 to 1000; got 0" in str(e)


# --------------------------------------------------------------------------- the issue's cases


@pytest.mark.parametrize(("text", "key", "why"), [
    ("[agent]\nheartbeat_s = inf\n", "agent.heartbeat_s",
     "must be a finite number, from 0.1 to 3600; got inf"),
    ("[collector]\nheartbeat_s = inf\n", "collector.heartbeat_s",
     "must be a finite number, from 0.1 to 3600; got inf"),
    ("[agent]\ninterval_s = 0\n", "agent.interval_s", "must be from 1 to 3600; got 0"),
    ("[gpu]\ncount = 100000000000000000000000000\n", "gpu.count",
     "must be from 0 to 1024; got 100000000000000000000000000"),
    ("[ecc]\ncorrected_rate_per_hour_max = 1e308\n", "ecc.corrected_rate_per_hour_max",
     "must be from 0 to 1000000000; got 1e+308"),
    ("[slurm]\ncommand_timeout_s = inf\n", "slurm.command_timeout_s",
     "must be a finite number, from 0.05 to 3600; got inf"),
    ("[thermal]\nbrake_fraction = nan\n", "thermal.brake_fraction",
     "must be a finite number, from 0 to 1; got nan"),
    ("[collector]\nslurm_poll_s = 0.001\n", "collector.slurm_poll_s",
     "must be 0 (off) or from 1 to 86400; got 0.001"),
])
def test_issue_cases_cli(tmp_path: Path, text: str, key: str, why: str) -> None:
    from slurmgpu.cli.config_cmd import config

    path = tmp_path / "slurmgpu.toml"
    path.write_text(text)
    result = CliRunner().invoke(config, ["check", str(path)])
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr == f"slurmgpu: error: {path}:2: {key}: {why}\n"


def test_huge_integer_is_truncated_in_the_message(tmp_path: Path) -> None:
    e = refused(tmp_path, "[gpu]\ncount = " + "9" * 4000 + "\n")
    assert "got 99999999999999999999... (4000 digits)" in str(e)
    assert len(str(e)) < 200


def test_integer_beyond_python_digit_limit(tmp_path: Path) -> None:
    # tomllib raises a plain ValueError (not TOMLDecodeError) past 4300 digits.
    e = refused(tmp_path, "[gpu]\ncount = " + "9" * 5000 + "\n")
    assert str(e).endswith(": invalid TOML: an integer with too many digits")


# --------------------------------------------------------------------------- file bounds


def test_file_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    filler = "# " + "x" * 97 + "\n"  # 100 bytes a line
    body = "[gpu]\ncount = 8\n"
    path.write_text(body + filler * ((MAX_CONFIG_BYTES - len(body)) // 100))
    assert path.stat().st_size <= MAX_CONFIG_BYTES
    assert load_config(str(path), environ={}).settings_for(None).gpu.count == 8
    path.write_text(body + filler * (MAX_CONFIG_BYTES // 100 + 1))
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ={})
    assert str(info.value) == (f"{path}: config file is larger than 1024 KiB; "
                               "is this the right file?")


@pytest.mark.parametrize("text", [
    "a = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "a = " + "{b = " * 50_000 + "1" + "}" * 50_000 + "\n",
])
def test_deep_nesting_is_a_config_error(tmp_path: Path, text: str) -> None:
    e = refused(tmp_path, text)
    assert str(e).endswith(": invalid TOML: arrays or tables nested too deeply")


# --------------------------------------------------------------------------- hostlist size


@pytest.mark.parametrize("nodes", [
    "gpu-[1-99999999]",
    "gpu-[1-99999999999999999999999999999]",
    "gpu-[1-100001]",
    "a[1-1000]b[1-1000]",
    "a[1-60000],b[1-60000]",
    "gpu-[1-10],gpu-[1-99999999]!gpu-[1-99999999]",
])
def test_huge_hostlist_is_refused_quickly(tmp_path: Path, nodes: str) -> None:
    start = time.monotonic()
    e = refused(tmp_path, f'[[hosts]]\nnodes = "{nodes}"\ngpu.count = 8\n')
    assert time.monotonic() - start < 2
    assert e.key == "hosts[0].nodes"
    assert e.line == 2
    assert f"names more than {MAX_HOSTLIST_NODES:,} nodes" in str(e)


@pytest.mark.parametrize("nodes", ["gpu-[1-100000]", "a[1-200000/2]", "a[1-300]b[1-300]"])
def test_hostlist_at_the_limit_is_accepted(nodes: str) -> None:
    cfg = parse_config(f'[[hosts]]\nnodes = "{nodes}"\n', path="t.toml")
    assert len(cfg.hosts[0].nodeset) <= MAX_HOSTLIST_NODES


@pytest.mark.parametrize("nodes", [
    "gpu-h100-[001-128],gpu-h100-[200-210]", "n[1-10/3]", "a[1,3,5-9]b[0-1]", "x1,y[2-3]",
    "gpu-[1-20]!gpu-[5-6]", "gpu-[1-20]&gpu-[5-30]", "c[01-12]-ib[1-2]",
])
def test_size_bound_is_an_upper_bound(nodes: str) -> None:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    assert hostlist_size_bound(nodes) >= len(NodeSet(nodes, resolver=RESOLVER_NOGROUP))


# --------------------------------------------------------------------------- docs


def test_ranges_doc_is_generated_from_the_schema() -> None:
    assert DOC.read_text() == ranges_markdown(), \
        "regenerate: slurmgpu config ranges > docs/config-ranges.md"
    for n in NUMERIC:
        assert f"| `{n.key}` |" in ranges_markdown()


def test_cli_ranges() -> None:
    from slurmgpu.cli.config_cmd import config

    result = CliRunner().invoke(config, ["ranges"])
    assert result.exit_code == 0
    assert result.output == ranges_markdown()
