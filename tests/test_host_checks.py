"""The layers around NVML (issue 33): host.disk, nvml.driver_mismatch, rdma.gpudirect,
host.services. Logic over pure-Python facts, the host source over fixture roots, and each
bundled fault through `slurmgpu check` on the simulator."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from slurmgpu.config.load import load_config
from slurmgpu.config.schema import Settings
from slurmgpu.engine import evaluate
from slurmgpu.errors import ConfigError
from slurmgpu.facts import DiskState, NodeFacts, ServiceState
from slurmgpu.result import Finding, Severity
from slurmgpu.sim.hostroot import materialize
from slurmgpu.sim.scenario import load_scenario, sim_environment
from slurmgpu.sources.host import (
    HostConfig,
    ServiceReadError,
    SystemctlReader,
    SystemHostSource,
    parse_show,
)
from slurmgpu.testing import FakeServiceReader, healthy_host, make_facts, running

DATA = Path(__file__).resolve().parent / "data" / "host"


def host_facts() -> NodeFacts:
    facts = make_facts()
    facts.host = healthy_host()
    facts.nvml.library_version = "550.90.07"
    return facts


def findings(facts: NodeFacts, check: str, settings: Settings | None = None) -> list[Finding]:
    return [f for f in evaluate(facts, settings or Settings()).findings if f.check == check]


def bad(facts: NodeFacts, check: str, settings: Settings | None = None) -> list[tuple[str, str | None, str]]:
    return [(f.severity.name, f.subject, f.message) for f in findings(facts, check, settings)
            if f.severity is not Severity.OK]


def test_a_healthy_host_passes_every_host_check() -> None:
    settings = Settings()
    settings.rdma.gpudirect = True
    for check in ("host.disk", "host.services", "nvml.driver_mismatch", "rdma.gpudirect"):
        found = findings(host_facts(), check, settings)
        assert found and all(f.severity is Severity.OK and not f.not_applicable for f in found), check


def test_without_host_facts_the_host_checks_do_not_apply() -> None:
    for check in ("host.disk", "host.services", "nvml.driver_mismatch", "rdma.gpudirect"):
        (finding,) = findings(make_facts(), check)
        assert finding.not_applicable, check


# -- host.disk ------------------------------------------------------------------------------

def test_a_full_disk_fails_with_its_path_and_a_read_only_one_too() -> None:
    facts = host_facts()
    facts.host.disks[0].free_bytes = 200 << 20
    facts.host.disks[1].read_only = True
    assert bad(facts, "host.disk") == [
        ("FAIL", "/tmp", "/tmp: 200 MiB free (0.0 %), below 1%"),
        ("FAIL", "/var", "/var is mounted read-only")]


def test_a_size_threshold_and_a_warn_severity() -> None:
    settings = Settings()
    settings.disk.free_min = {"/tmp": "500G"}
    settings.disk.free_severity = "warn"
    assert bad(host_facts(), "host.disk", settings) == [
        ("WARN", "/tmp", "/tmp: 400.0 GiB free (80.0 %), below 500G")]


def test_a_path_that_does_not_exist_is_skipped() -> None:
    facts = host_facts()
    facts.host.disks = [DiskState("/scratch", error="not found")]
    (finding,) = findings(facts, "host.disk")
    assert finding.not_applicable


@pytest.mark.parametrize("value", ["3 percent", "-1%", "101%", "", "10X", "nan%", "1e400G"])
def test_a_bad_threshold_is_a_one_line_config_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[disk]\nfree_min = {{"/tmp" = "{value}"}}\n')
    with pytest.raises(ConfigError, match="not a free-space threshold"):
        load_config(str(path))


# -- nvml.driver_mismatch --------------------------------------------------------------------

def test_a_refused_init_names_both_versions() -> None:
    facts = host_facts()
    facts.nvml = dataclasses.replace(facts.nvml, available=False, gpus=[], init_error_code=18,
                                     library_version="550.127.05", error="nvmlInit failed: ...")
    ((severity, _, message),) = bad(facts, "nvml.driver_mismatch")
    assert severity == "FAIL"
    assert "Driver/library version mismatch: kernel module 550.90.07, NVML library 550.127.05" in message


def test_different_versions_fail_even_when_init_answers() -> None:
    facts = host_facts()
    facts.nvml.library_version = "550.127.05"
    assert bad(facts, "nvml.driver_mismatch")[0][0] == "FAIL"


@pytest.mark.parametrize("entry", json.loads((DATA / "nvidia_version.json").read_text())["lines"],
                         ids=lambda e: e["version"])
def test_published_kernel_module_lines_parse(tmp_path: Path, entry: dict[str, Any]) -> None:
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(entry["text"] + "\nGCC version: gcc 12\n")
    host = SystemHostSource(HostConfig(), root=str(tmp_path), services=FakeServiceReader()).collect()
    assert (host.kernel_module_version, host.open_kernel_module) == (entry["version"], entry["open"])


# -- rdma.gpudirect --------------------------------------------------------------------------

def test_gpudirect_needs_peermem_or_dma_buf() -> None:
    settings = Settings()
    settings.rdma.gpudirect = True
    facts = host_facts()
    facts.host.peermem_loaded = False
    ((severity, _, message),) = bad(facts, "rdma.gpudirect", settings)
    assert severity == "FAIL" and "nvidia_peermem not loaded" in message
    facts.host.open_kernel_module = True  # the open module on 6.8: dma-buf
    assert not bad(facts, "rdma.gpudirect", settings)
    facts.host.kernel_release = "5.10.0-28-amd64"  # before dma-buf
    assert bad(facts, "rdma.gpudirect", settings)
    settings.rdma.gpudirect = False
    (finding,) = findings(facts, "rdma.gpudirect", settings)
    assert finding.not_applicable


# -- host.services ---------------------------------------------------------------------------

def test_a_failed_missing_or_crash_looping_unit_fails() -> None:
    facts = host_facts()
    facts.host.services = [
        ServiceState("nvidia-fabricmanager", "loaded", "failed", "failed", 0, "exit-code"),
        ServiceState("nvidia-persistenced", "not-found", "inactive", "dead", 0),
        ServiceState("nvidia-imex", "loaded", "activating", "auto-restart", 7, "core-dump")]
    assert [(s, subject) for s, subject, _ in bad(facts, "host.services")] == [
        ("FAIL", "nvidia-fabricmanager"), ("FAIL", "nvidia-persistenced"), ("FAIL", "nvidia-imex")]
    assert "crash-looping (7 restarts, last result core-dump)" in bad(facts, "host.services")[2][2]


def test_restarts_rising_between_polls_fail_and_many_restarts_warn() -> None:
    previous = host_facts()
    facts = host_facts()
    facts.previous = previous
    facts.host.services = [running("nvidia-persistenced", 2), running("nvidia-fabricmanager", 0)]
    assert bad(facts, "host.services")[0][:2] == ("FAIL", "nvidia-persistenced")
    facts.previous = None
    facts.host.services = [running("nvidia-persistenced", 3)]
    assert bad(facts, "host.services")[0][:2] == ("WARN", "nvidia-persistenced")


def test_systemctl_that_cannot_answer_is_unknown_and_no_systemd_is_not_applicable() -> None:
    facts = host_facts()
    facts.host.errors["services"] = "systemctl show did not answer within 3 s"
    assert bad(facts, "host.services") == [("UNKNOWN", None, "systemctl show did not answer within 3 s")]
    facts.host.systemd = False
    (finding,) = findings(facts, "host.services")
    assert finding.not_applicable


def test_the_source_asks_for_fabricmanager_only_where_nvswitches_are(tmp_path: Path) -> None:
    reader = FakeServiceReader({"nvidia-persistenced": running("nvidia-persistenced")})
    config = HostConfig(units=["nvidia-persistenced"])
    materialize(load_scenario("a100-sxm-8"), tmp_path / "a100")  # no fabric: no NVSwitch
    host = SystemHostSource(config, root=str(tmp_path / "a100"), services=reader).collect()
    assert reader.asked == [["nvidia-persistenced"]] and host.nvswitches == 0
    materialize({**load_scenario("h100-sxm-8"), "host": {"imex": True}}, tmp_path / "h100")
    SystemHostSource(config, root=str(tmp_path / "h100"), services=reader).collect()
    assert reader.asked[-1] == ["nvidia-persistenced", "nvidia-fabricmanager", "nvidia-imex"]


def test_systemctl_show_output_is_parsed_per_unit() -> None:
    text = ("Id=nvidia-persistenced.service\nLoadState=loaded\nActiveState=active\nSubState=running\n"
            "NRestarts=0\nResult=success\n\nId=nvidia-fabricmanager.service\nLoadState=loaded\n"
            "ActiveState=activating\nSubState=auto-restart\nNRestarts=12\nResult=exit-code\n")
    states = parse_show(text, ["nvidia-persistenced", "nvidia-fabricmanager"])
    assert states[1] == ServiceState("nvidia-fabricmanager", "loaded", "activating", "auto-restart", 12, "exit-code")


def test_a_hanging_systemctl_is_cut_at_its_deadline(tmp_path: Path) -> None:
    script = tmp_path / "systemctl"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    with pytest.raises(ServiceReadError, match=r"did not answer within 0\.3 s"):
        SystemctlReader(str(script), timeout_s=0.3).show(["nvidia-fabricmanager"])


# -- the bundled faults, end to end -----------------------------------------------------------

def check_under(scenario: str, tmp_path: Path, config: str = "") -> tuple[int, dict[str, Any]]:
    cfg = tmp_path / "slurmgpu.toml"
    cfg.write_text(config)
    env = {**os.environ, **sim_environment(scenario)}
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(cfg)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, json.loads(proc.stdout)


def failing(result: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(f["check"], f.get("subject")) for f in result["findings"] if f["severity"] == "FAIL"}


@pytest.mark.parametrize(("scenario", "expected"), [
    ("fault-disk-full", {("host.disk", "/tmp")}),
    ("fault-fabricmanager-down", {("host.services", "nvidia-fabricmanager")}),
    ("fault-peermem-missing", {("rdma.gpudirect", None)}),
    ("fault-driver-mismatch", {("nvml.driver_mismatch", None)}),
])
def test_each_bundled_fault_fails_check_with_its_finding(sim_dir_env: Path, tmp_path: Path,
                                                         scenario: str, expected: set[Any]) -> None:
    code, result = check_under(scenario, tmp_path, "[rdma]\ngpudirect = true\n")
    assert (code, failing(result)) == (2, expected)


@pytest.mark.parametrize("scenario", ["h100-sxm-8", "h100-sxm-8-r535", "a100-sxm-8", "h200-r580"])
def test_the_healthy_nodes_pass_them(sim_dir_env: Path, tmp_path: Path, scenario: str) -> None:
    code, result = check_under(scenario, tmp_path, "[rdma]\ngpudirect = true\n")
    ours = [f for f in result["findings"] if f["check"].startswith(("host.", "nvml.", "rdma.", "nvswitch.", "gpu.resp"))]
    assert code == 0 and all(f["severity"] == "OK" for f in ours), ours
    assert {f["check"] for f in ours if not f.get("not_applicable")} >= {
        "host.disk", "host.services", "nvml.driver_mismatch", "rdma.gpudirect"}


@pytest.mark.parametrize("entry", json.loads((DATA / "nvml_mismatch.json").read_text())["messages"],
                         ids=lambda e: e["library"])
def test_a_published_mismatch_names_what_nvidia_smi_names(sim_dir_env: Path, tmp_path: Path,
                                                          entry: dict[str, Any]) -> None:
    scenario = load_scenario("fault-driver-mismatch")
    scenario["nvml_version"] = f"12.{entry['library']}.04"
    scenario["host"] = {"kernel_module": f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {entry['library']}.06  x"}
    path = tmp_path / "mismatch.json"
    path.write_text(json.dumps(scenario))
    _, result = check_under(str(path), tmp_path)
    (message,) = [f["message"] for f in result["findings"] if f["check"] == "nvml.driver_mismatch"]
    assert entry["text"].splitlines()[0].split(": ", 1)[1] in message
    assert f"kernel module {entry['library']}.06, NVML library {entry['library']}.04" in message


def test_the_new_findings_reach_the_collector_and_the_reports_failures_by_check(tmp_path: Path) -> None:
    from slurmgpu import wire
    from slurmgpu.agent.core import Agent
    from slurmgpu.collector.store import Store
    from slurmgpu.report.model import report_from_path

    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    agent = Agent(settings, "gpu-h100-001", environ={})
    facts = host_facts()
    facts.host.disks[0].free_bytes = 0
    facts.host.services[1] = ServiceState("nvidia-fabricmanager", "loaded", "failed", "failed", 0, "exit-code")
    body = agent.report_body(facts, evaluate(facts, settings))
    frame = wire.message_frame(wire.REPORT, "gpu-h100-001", 1, body)
    store = Store(str(tmp_path / "fleet.db"))
    store.store_batch([("gpu-h100-001", wire.decode(frame))])
    store.close()
    now = time.time()
    model = report_from_path(tmp_path / "fleet.db", now - 3600, now + 60, config=None, generated_at=now)
    by_check = {(r["check_id"], r["severity"]) for r in model["failures"]["by_check"]}
    assert by_check == {("host.disk", "FAIL"), ("host.services", "FAIL")}
    stored = wire.decode(frame).body["facts"]
    plain = msgpack.unpackb(stored, raw=False) if isinstance(stored, bytes) else stored
    assert NodeFacts.from_json(plain).host.disks[0].free_bytes == 0


def test_the_new_settings_and_checks_follow_hosts_sections(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[services]\nrequired = ["nvidia-persistenced"]\n\n'
                    '[[hosts]]\nname = "dcgm"\nnodes = "gpu-[01-04]"\nservices.required = ["nvidia-persistenced", "nvidia-dcgm"]\n'
                    'disk.free_min = {"/scratch" = "10G"}\nrdma.gpudirect = true\n\n'
                    '[[hosts]]\nname = "login"\nnodes = "login01"\nchecks.disabled = ["host.services", "nvswitch.sxid"]\n')
    cfg = load_config(str(path))
    gpu = cfg.settings_for("gpu-02")
    assert gpu.services.required == ["nvidia-persistenced", "nvidia-dcgm"] and gpu.rdma.gpudirect
    assert gpu.disk.free_min == {"/tmp": "1%", "/var": "1%", "/scratch": "10G"}  # tables merge
    assert cfg.settings_for("gpu-05").services.required == ["nvidia-persistenced"]
    login = cfg.settings_for("login01")
    assert {"host.services", "nvswitch.sxid"}.isdisjoint({f.check for f in evaluate(host_facts(), login).findings})
