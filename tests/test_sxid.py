"""nvswitch.sxid (issue 33): NVSwitch SXid lines, the catalogue from NVIDIA's Fabric
Manager guide, the check, and fault-sxid-fatal through `slurmgpu check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.config.schema import Settings
from slurmgpu.engine import evaluate
from slurmgpu.facts import NodeFacts, SxidEvent
from slurmgpu.result import Severity
from slurmgpu.sim.scenario import sim_environment
from slurmgpu.sources.kmsg import kmsg_record
from slurmgpu.sources.sxids import parse_sxids
from slurmgpu.sxid import CLASS_ACTION, catalog, sxid_rule
from slurmgpu.testing import healthy_host, make_facts

PUBLISHED = json.loads((Path(__file__).resolve().parent / "data" / "sxid" / "published.json").read_text())


@pytest.mark.parametrize("entry", PUBLISHED["lines"], ids=lambda e: str(e["sxid"]))
def test_published_lines_parse_and_classify(entry: dict[str, Any]) -> None:
    (event,) = parse_sxids([entry["text"]])
    assert (event.sxid, event.switch, event.pci) == (entry["sxid"], entry["switch"], entry["pci"])
    assert event.timestamp is None  # a dmesg line carries no wall time
    assert sxid_rule(event.sxid, event.message).sxid_class == entry["class"]


def test_kmsg_records_carry_their_time_and_other_lines_are_not_sxids() -> None:
    lines = [kmsg_record(text, usec=5_000_000) for text in PUBLISHED["incident"]["lines"]]
    events = parse_sxids(lines, boot_wall=1_000.0)
    assert len(events) == len(lines) - 1  # the XID 79 line is not an SXid
    assert {e.timestamp for e in events} == {1_005.0}
    assert {e.switch for e in events} == {"nvidia-nvswitch0", "nvidia-nvswitch1", "nvidia-nvswitch2"}


def test_the_catalogue_follows_the_guides_classes() -> None:
    rows = catalog()
    assert len(rows) == 93 and {r.sxid_class for r in rows.values()} == set(CLASS_ACTION)
    assert (rows[20034].sxid_class, rows[20034].severity) == ("fatal", Severity.FAIL)
    assert (rows[22003].sxid_class, rows[22003].action) == ("always-fatal", "reboot")
    assert (rows[11012].sxid_class, rows[11012].severity) == ("non-fatal", Severity.WARN)
    raw = tomllib.loads((Path(__file__).resolve().parent.parent / "slurmgpu/data/sxid_catalog.toml").read_text())
    assert all(10000 <= int(code) < 30000 for code in raw["sxid"])
    # an unknown code: the line's own word, else a warning
    assert sxid_rule(29999, "Fatal, Link 3 something").severity is Severity.FAIL
    assert sxid_rule(29999, "Non-fatal, Link 3 something").severity is Severity.WARN
    assert sxid_rule(29999, "Data {0x0}").severity is Severity.WARN


def facts_with(*events: SxidEvent, now: float = 1_790_000_000.0) -> NodeFacts:
    facts = make_facts(collected_at=now)
    facts.host = healthy_host()
    facts.host.sxids = list(events)
    return facts


def sxid_findings(facts: NodeFacts) -> list[tuple[str, str | None, str]]:
    return [(f.severity.name, f.subject, f.message) for f in evaluate(facts, Settings()).findings
            if f.check == "nvswitch.sxid"]


def test_the_incident_fails_each_switch_once_with_its_count() -> None:
    events = parse_sxids(PUBLISHED["incident"]["lines"])
    assert sxid_findings(facts_with(*events)) == [
        ("FAIL", "nvidia-nvswitch0", "nvidia-nvswitch0 SXid 20034 x4: LTSSM Fault Up (fatal) -> drain"),
        ("FAIL", "nvidia-nvswitch1", "nvidia-nvswitch1 SXid 20034: LTSSM Fault Up (fatal) -> drain"),
        ("FAIL", "nvidia-nvswitch2", "nvidia-nvswitch2 SXid 20034 x3: LTSSM Fault Up (fatal) -> drain")]


def test_a_fatal_sxid_counts_since_boot_a_non_fatal_one_only_within_the_window() -> None:
    now = 1_790_000_000.0
    old_fatal = SxidEvent(20034, "nvidia-nvswitch0", "0000:05:00.0", now - 86400, "Fatal, Link 30 LTSSM Fault Up")
    old_sbe = SxidEvent(11012, "nvidia-nvswitch1", "0000:06:00.0", now - 7200, "Non-fatal, single bit ECC")
    new_sbe = SxidEvent(11012, "nvidia-nvswitch1", "0000:06:00.0", now - 60, "Non-fatal, single bit ECC")
    assert [s for s, _, _ in sxid_findings(facts_with(old_fatal, old_sbe, now=now))] == ["FAIL"]
    assert [s for s, _, _ in sxid_findings(facts_with(old_sbe, new_sbe, now=now))] == ["WARN"]
    assert [s for s, _, _ in sxid_findings(facts_with(old_sbe, now=now))] == ["OK"]


def test_no_nvswitch_no_sxid_check() -> None:
    facts = facts_with()
    facts.host.nvswitches = 0
    (finding,) = [f for f in evaluate(facts, Settings()).findings if f.check == "nvswitch.sxid"]
    assert finding.not_applicable


def test_fault_sxid_fatal_fails_check(sim_dir_env: Path, tmp_path: Path) -> None:
    env = {**os.environ, **sim_environment("fault-sxid-fatal")}
    config = tmp_path / "c.toml"
    config.write_text("")
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    result = json.loads(proc.stdout)
    failing = {(f["check"], f.get("subject")) for f in result["findings"] if f["severity"] == "FAIL"}
    assert (proc.returncode, failing) == (2, {("nvswitch.sxid", "nvidia-nvswitch0")})
    healthy = {**os.environ, **sim_environment("h100-sxm-8")}
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config)],
                          env=healthy, capture_output=True, text=True, timeout=120, check=False)
    (ok,) = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "nvswitch.sxid"]
    assert ok["severity"] == "OK" and not ok.get("not_applicable")


def test_a_kernel_log_that_cannot_be_read_is_unknown_not_fail() -> None:
    facts = facts_with()
    facts.host.errors["sxids"] = "/dev/kmsg: not read within 2 s"
    assert sxid_findings(facts) == [("UNKNOWN", None, "kernel log not read: /dev/kmsg: not read within 2 s")]


def test_the_agent_keeps_a_fatal_sxid_the_ring_buffer_rotated_out(tmp_path: Path) -> None:
    from slurmgpu.agent.core import Agent
    from slurmgpu.engine import Sources
    from slurmgpu.testing import (
        FakeClock,
        FakeHostSource,
        FakeIbSource,
        FakeNvmlSource,
        FakeVersionSource,
    )

    base = make_facts()
    host = healthy_host()
    host.sxids = parse_sxids(PUBLISHED["incident"]["lines"][1:2])
    source = FakeHostSource(host)
    settings = Settings()
    settings.paths.state_dir = str(tmp_path)
    agent = Agent(settings, "gpu-h100-001", environ={}, clock=FakeClock(),
                  sources=Sources(FakeNvmlSource(base.nvml), FakeIbSource(base.ib),
                                  FakeVersionSource(base.versions), FakeClock(), source))
    _, first = agent.poll()
    source.facts.sxids = []  # rotated out of /dev/kmsg
    _, second = agent.poll()
    for verdict in (first, second):
        assert [(f.severity.name, f.subject) for f in verdict.findings if f.check == "nvswitch.sxid"] == [
            ("FAIL", "nvidia-nvswitch1")]
