"""The SLURMGPU_* environment variables: one table, one order (default < file < env <
flag), one error style for a bad value; the stdlib twins on the hot paths agree with it
(issue 14, move 7)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu import jobfiles, localproto
from slurmgpu.cli import cli
from slurmgpu.config import env as config_env
from slurmgpu.config.load import load_config, parse_config
from slurmgpu.config.schema import Settings
from slurmgpu.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
# Where a variable slurmgpu reads or sets can be spelled: the library, the hook wrappers
# and units, the example configs and the packages.
SCANNED = ("slurmgpu", "prolog", "epilog", "daemon", "etc", "packaging")
NAME = re.compile(r"\bSLURMGPU_[A-Z][A-Z0-9_]*\b")

FILE = '[paths]\nstate_dir = "/file"\n[[hosts]]\nnodes = "gpu-[1-2]"\n[hosts.paths]\nstate_dir = "/host"\n'


def test_the_order_is_default_file_hosts_env_flag() -> None:
    config = parse_config(FILE, path="/c.toml")
    env = {"SLURMGPU_STATE_DIR": "/env"}
    assert config.settings_for("other", {}).paths.state_dir == "/file"
    assert config.settings_for("gpu-1", {}).paths.state_dir == "/host"
    assert config.settings_for("gpu-1", env).paths.state_dir == "/env"
    assert config.settings_for("gpu-1", env, {"paths.state_dir": "/flag"}).paths.state_dir == "/flag"
    assert config.settings_for("gpu-1", env, {"paths.state_dir": None}).paths.state_dir == "/env"
    assert parse_config("").settings_for(None, {}).paths.state_dir == Settings().paths.state_dir


def test_an_empty_variable_is_unset() -> None:
    config = parse_config(FILE)
    assert config.settings_for(None, {"SLURMGPU_STATE_DIR": ""}).paths.state_dir == "/file"


@pytest.mark.parametrize("value,why", [("abc", "is not a number"), ("0", "out of range"),
                                       ("nan", "out of range"), ("1e9", "out of range")])
def test_a_bad_value_is_a_config_error_naming_the_variable(value: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config("").settings_for(None, {"SLURMGPU_AGENT_TIMEOUT": value})
    text = str(raised.value)
    assert text.startswith("environment: agent.query_timeout_s: $SLURMGPU_AGENT_TIMEOUT=")
    assert why in text and "\n" not in text


def test_numbers_are_parsed_and_strings_kept() -> None:
    env = {"SLURMGPU_AGENT_TIMEOUT": "2.5", "SLURMGPU_DB": "/x.db", "SLURMGPU_NVML_LIBRARY": "/lib.so"}
    settings = parse_config("").settings_for(None, env)
    assert settings.agent.query_timeout_s == 2.5
    assert (settings.collector.db, settings.nvml.library) == ("/x.db", "/lib.so")


def test_apply_env_is_idempotent_and_leaves_the_input_alone() -> None:
    base = parse_config(FILE).settings_for(None, {})
    env = {"SLURMGPU_KMSG": "/k", "SLURMGPU_JOBS_DIR": "/j"}
    once = config_env.apply_env(base, env)
    assert config_env.apply_env(once, env) == once
    assert (base.paths.kmsg, once.paths.kmsg, once.agent.jobs_dir) == ("/dev/kmsg", "/k", "/j")
    assert config_env.apply_env(base, {}) is base


def test_every_setting_variable_names_a_real_setting() -> None:
    settings = Settings()
    for var in config_env.SETTING_VARS:
        assert var.setting is not None
        table, key = var.setting.split(".")
        assert hasattr(getattr(settings, table), key), var
        assert config_env.env_for(var.setting) == var.name


def test_explain_names_the_variable_that_set_a_setting() -> None:
    rows = {r.key: r for r in parse_config(FILE).explain("gpu-1", {"SLURMGPU_DB": "/e.db"})}
    assert (rows["collector.db"].value, rows["collector.db"].source) == ("/e.db", "$SLURMGPU_DB")
    assert rows["paths.state_dir"].source.startswith("hosts[0]")


def test_every_variable_in_the_code_is_in_the_table() -> None:
    """A new SLURMGPU_* variable cannot escape docs/environment.md."""
    seen: dict[str, str] = {}
    for top in SCANNED:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                for name in NAME.findall(path.read_text(errors="replace")):
                    seen.setdefault(name, str(path.relative_to(REPO)))
    unlisted = {n: where for n, where in seen.items() if n not in config_env.BY_NAME}
    assert unlisted == {}
    assert len(seen) >= 15


def test_the_doc_is_the_table() -> None:
    assert (REPO / "docs" / "environment.md").read_text() == config_env.markdown()
    result = CliRunner().invoke(cli, ["config", "env"])
    assert result.exit_code == 0 and result.output == config_env.markdown()
    rows = json.loads(CliRunner().invoke(cli, ["config", "env", "--json"]).output)
    assert {r["name"] for r in rows} == set(config_env.BY_NAME)


def test_only_the_env_module_reads_a_setting_variable() -> None:
    """Everything else takes the value from the settings (or goes through
    ``setting_value``), except the stdlib twins below."""
    twins = {"slurmgpu/localproto.py", "slurmgpu/quickgate.py", "slurmgpu/jobfiles.py",
             "slurmgpu/config/env.py"}
    names = "|".join(v.name for v in config_env.SETTING_VARS)
    read = re.compile(rf"environ(?:\.get\(|\[)\s*[\"']({names})[\"']")
    offenders = [f"{p.relative_to(REPO)}: {m.group(1)}"
                 for p in (REPO / "slurmgpu").rglob("*.py")
                 if str(p.relative_to(REPO)) not in twins and "sim" not in p.relative_to(REPO).parts
                 for m in read.finditer(p.read_text())]
    assert offenders == []


# ---------------------------------------------------------------- the stdlib twins agree


@pytest.mark.parametrize("env", [{}, {"SLURMGPU_AGENT_SOCKET": "/e.sock", "SLURMGPU_AGENT_TIMEOUT": "2"}])
@pytest.mark.parametrize("text", ["", '[agent]\nsocket = "/f.sock"\nquery_timeout_s = 3\n'])
def test_the_quick_clients_socket_and_timeout_follow_the_order(env: dict[str, str], text: str) -> None:
    import tomllib

    settings = parse_config(text).settings_for(None, env)
    raw = tomllib.loads(text).get("agent", {})
    assert localproto.socket_path(env, raw.get("socket")) == settings.agent.socket
    assert localproto.query_timeout(env, raw.get("query_timeout_s")) == settings.agent.query_timeout_s


@pytest.mark.parametrize("env_value", [None, "/env-jobs"])
@pytest.mark.parametrize("text", ["", '[agent]\njobs_dir = "/file-jobs"\n'])
def test_the_taskprologs_jobs_dir_follows_the_order(tmp_path: Path, env_value: str | None, text: str) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text(text)
    env = {"SLURMGPU_JOBS_DIR": env_value} if env_value else {}
    settings = load_config(str(config), environ=env).settings_for(None, env)
    assert jobfiles.configured_jobs_dir(env, str(config)) == settings.agent.jobs_dir


# ---------------------------------------------------------------- as the commands see it


def slurmgpu(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGPU_")}
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_config_check_refuses_a_bad_variable_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text("")
    proc = slurmgpu(["config", "check", str(config)], SLURMGPU_AGENT_TIMEOUT="soon")
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        "slurmgpu: error: environment: agent.query_timeout_s: $SLURMGPU_AGENT_TIMEOUT='soon' "
        "is not a number"]
    proc = slurmgpu(["config", "check", "--json", str(config)], SLURMGPU_AGENT_TIMEOUT="soon")
    assert proc.returncode == 3 and json.loads(proc.stdout)["key"] == "agent.query_timeout_s"


def test_a_flag_beats_the_variable_and_the_error_says_which_won(tmp_path: Path) -> None:
    proc = slurmgpu(["fleet", "--db", str(tmp_path / "flag.db")], SLURMGPU_DB=str(tmp_path / "env.db"))
    assert proc.returncode == 3
    assert f"no fleet database at {tmp_path}/flag.db (from --db)" in proc.stderr
    proc = slurmgpu(["fleet"], SLURMGPU_DB=str(tmp_path / "env.db"))
    assert f"no fleet database at {tmp_path}/env.db (from $SLURMGPU_DB)" in proc.stderr


def test_config_explain_shows_the_variable(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text("")
    proc = slurmgpu(["config", "explain", "--node", "n1", "--json", "--config", str(config)],
                    SLURMGPU_KMSG="/tmp/kmsg")
    rows = {r["key"]: r for r in json.loads(proc.stdout)["settings"]}
    assert rows["paths.kmsg"] == {"key": "paths.kmsg", "value": "/tmp/kmsg", "source": "$SLURMGPU_KMSG"}


def test_a_hook_with_a_bad_variable_fails_open(tmp_path: Path) -> None:
    """A bad value in the environment is slurmgpu's own trouble, as a bad file is: the
    prolog lets the job run (exit 0) and says why, never drains."""
    config = tmp_path / "slurmgpu.toml"
    config.write_text("")
    proc = slurmgpu(["prolog", "--config", str(config)], SLURMGPU_AGENT_TIMEOUT="soon",
                    SLURMGPU_STATE_DIR=str(tmp_path / "state"), SLURMD_NODENAME="n1",
                    SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(ln) for ln in proc.stderr.splitlines() if ln.startswith("{")]
    assert (line["event"], line["action"]) == ("prolog_decision", "fail-open")
    assert "SLURMGPU_AGENT_TIMEOUT" in line["error"]
