"""Every check, passing and failing, over pure-Python facts (logic tests)."""

from __future__ import annotations

import dataclasses

import pytest

from slurmgpu.checks.registry import all_checks
from slurmgpu.config.schema import Settings
from slurmgpu.engine import evaluate
from slurmgpu.facts import (
    CLOCKS_EVENT_GPU_IDLE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_SW_POWER_CAP,
    CLOCKS_EVENT_SW_THERMAL,
    NodeFacts,
    RetiredPages,
    XidEvent,
)
from slurmgpu.result import Severity
from slurmgpu.testing import make_facts

ISSUE_CHECKS = {
    "gpu.count", "gpu.lost", "gpu.persistence", "gpu.mig", "pin.driver", "pin.cuda", "pin.nccl",
    "pin.vbios", "pin.ib_firmware", "pin.ofed", "ecc.mode", "ecc.uncorrected", "ecc.corrected",
    "mem.retired_pages", "mem.row_remap", "thermal.temperature", "thermal.throttle", "pcie.link",
    "nvlink.state", "nvlink.errors", "fabric.state", "xid.recent", "ib.count", "ib.port_state",
    "ib.rate", "ib.errors",
}


def run(facts: NodeFacts, settings: Settings | None = None, *, scope: frozenset[int] | None = None,
        check: str | None = None) -> list:
    verdict = evaluate(facts, settings or Settings(), scope=scope)
    return [f for f in verdict.findings if check is None or f.check == check]


def worst(findings: list) -> Severity:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)


def problems(findings: list) -> list:
    return [f for f in findings if f.severity is not Severity.OK]


def test_every_issue_check_is_registered() -> None:
    assert {c.id for c in all_checks()} >= ISSUE_CHECKS


def test_healthy_node_is_ok_everywhere() -> None:
    settings = Settings()
    settings.gpu.count = 8
    settings.ib.count = 8
    settings.ib.rate_gbps = 400
    findings = run(make_facts(), settings)
    assert problems(findings) == []
    assert {f.check for f in findings} >= ISSUE_CHECKS


# gpu.*

def test_gpu_count_mismatch_fails() -> None:
    settings = Settings()
    settings.gpu.count = 8
    facts = make_facts(gpus=7)
    f = run(facts, settings, check="gpu.count")
    assert worst(f) is Severity.FAIL and "7 GPUs present, 8 expected" in f[0].message


def test_gpu_count_without_nvml_fails_only_when_gpus_expected() -> None:
    facts = make_facts()
    facts.nvml = dataclasses.replace(facts.nvml, available=False, gpus=[], device_count=0,
                                     error="NVIDIA driver not loaded / libnvidia-ml.so.1 not found")
    no_expectation = run(facts, Settings(), check="gpu.count")
    assert worst(no_expectation) is Severity.OK and no_expectation[0].not_applicable
    settings = Settings()
    settings.gpu.count = 8
    expected = run(facts, settings, check="gpu.count")
    assert worst(expected) is Severity.FAIL and "libnvidia-ml.so.1 not found" in expected[0].message
    zero = Settings()
    zero.gpu.count = 0
    assert worst(run(facts, zero, check="gpu.count")) is Severity.OK


def test_gpu_count_requested_gpu_missing() -> None:
    f = run(make_facts(gpus=4), scope=frozenset({2, 6}), check="gpu.count")
    assert worst(f) is Severity.FAIL and "[6]" in f[0].message


def test_gpu_lost_fails_and_other_checks_skip_it() -> None:
    facts = make_facts()
    lost = facts.gpus[5]
    facts.nvml.gpus[5] = dataclasses.replace(type(lost)(index=5), lost=True)
    findings = run(facts)
    lost_findings = [f for f in findings if f.check == "gpu.lost"]
    assert worst(lost_findings) is Severity.FAIL and lost_findings[0].gpu == 5
    assert all(f.gpu != 5 for f in problems(findings) if f.check != "gpu.lost")


def test_gpu_lost_out_of_scope_is_not_reported() -> None:
    facts = make_facts()
    facts.gpus[5].lost = True
    assert problems(run(facts, scope=frozenset({0, 1}), check="gpu.lost")) == []


def test_persistence_off_warns_unless_not_required() -> None:
    facts = make_facts()
    facts.gpus[1].persistence_mode = False
    assert worst(run(facts, check="gpu.persistence")) is Severity.WARN
    settings = Settings()
    settings.gpu.persistence = False
    assert worst(run(facts, settings, check="gpu.persistence")) is Severity.OK


def test_mig_pending_and_mismatch() -> None:
    facts = make_facts()
    facts.gpus[0].mig_pending = True
    assert "pending" in run(facts, check="gpu.mig")[0].message
    facts = make_facts()
    facts.gpus[2].mig_current = facts.gpus[2].mig_pending = True
    assert worst(run(facts, check="gpu.mig")) is Severity.OK  # default "any"
    settings = Settings()
    settings.gpu.mig = "disabled"
    f = run(facts, settings, check="gpu.mig")
    assert worst(f) is Severity.FAIL and f[0].gpu == 2 and "expected disabled" in f[0].message


# pins

@pytest.mark.parametrize(("field", "attr", "value", "check"), [
    ("driver", ("nvml", "driver_version"), "535.104.05", "pin.driver"),
    ("nccl", ("versions", "nccl"), "2.18.1", "pin.nccl"),
    ("cuda", ("versions", "cuda_toolkit"), "12.2.0", "pin.cuda"),
    ("ofed", ("versions", "ofed"), "MLNX_OFED_LINUX-5.8-1.0.1.1", "pin.ofed"),
])
def test_software_pins(field: str, attr: tuple[str, str], value: str, check: str) -> None:
    facts = make_facts()
    current = getattr(getattr(facts, attr[0]), attr[1])
    settings = Settings()
    setattr(settings.pins, field, [current])
    assert worst(run(facts, settings, check=check)) is Severity.OK
    setattr(getattr(facts, attr[0]), attr[1], value)
    f = run(facts, settings, check=check)
    assert worst(f) is Severity.FAIL and value in f[0].message and "off-pin" in f[0].message
    settings.pins.severity = "warn"
    assert worst(run(facts, settings, check=check)) is Severity.WARN


def test_pins_accept_globs_and_minimums() -> None:
    facts = make_facts()
    settings = Settings()
    settings.pins.driver = ["550.*"]
    settings.pins.nccl = [">=2.21"]
    assert problems(run(facts, settings, check="pin.driver")) == []
    assert problems(run(facts, settings, check="pin.nccl")) == []
    facts.versions.nccl = "2.20.3"
    assert worst(run(facts, settings, check="pin.nccl")) is Severity.FAIL


def test_pinned_but_missing_nccl_fails_with_reason() -> None:
    facts = make_facts()
    facts.versions.nccl = None
    facts.versions.errors["nccl"] = "cannot load /opt/nccl/libnccl.so.2"
    settings = Settings()
    settings.pins.nccl = ["2.21.5"]
    f = run(facts, settings, check="pin.nccl")
    assert worst(f) is Severity.FAIL and "/opt/nccl/libnccl.so.2" in f[0].message


def test_unpinned_is_not_applicable() -> None:
    f = run(make_facts(), check="pin.driver")
    assert f[0].not_applicable and f[0].severity is Severity.OK


def test_cuda_driver_pin() -> None:
    settings = Settings()
    settings.pins.cuda_driver = [">=12.6"]
    f = run(make_facts(), settings, check="pin.cuda")
    assert worst(f) is Severity.FAIL and "driver's CUDA version 12.4" in problems(f)[0].message


def test_vbios_pin_and_uniformity() -> None:
    facts = make_facts()
    settings = Settings()
    settings.pins.vbios = ["96.00.99.*"]
    assert problems(run(facts, settings, check="pin.vbios")) == []
    facts.gpus[4].vbios = "96.00.74.00.11"
    f = run(facts, settings, check="pin.vbios")
    sev = {(x.gpu, x.severity) for x in f}
    assert (4, Severity.FAIL) in sev
    assert any(x.severity is Severity.WARN and "different VBIOS" in x.message for x in f)
    # unpinned: mixed versions still warn
    f = run(facts, check="pin.vbios")
    assert worst(f) is Severity.WARN


def test_ib_firmware_pin_per_hca() -> None:
    facts = make_facts()
    facts.ib.hcas[3].fw_ver = "28.36.1010"
    settings = Settings()
    settings.pins.ib_firmware = ["28.39.*"]
    f = run(facts, settings, check="pin.ib_firmware")
    assert [x.subject for x in problems(f)] == ["mlx5_3"]


# ECC and memory

def test_ecc_disabled_and_pending() -> None:
    facts = make_facts()
    facts.gpus[0].ecc_enabled = facts.gpus[0].ecc_pending = False
    assert worst(run(facts, check="ecc.mode")) is Severity.FAIL
    facts = make_facts()
    facts.gpus[1].ecc_pending = False
    assert "pending" in problems(run(facts, check="ecc.mode"))[0].message


def test_uncorrected_ecc_fails_over_threshold() -> None:
    facts = make_facts()
    assert facts.gpus[3].ecc is not None
    facts.gpus[3].ecc.uncorrected_volatile = 2
    f = problems(run(facts, check="ecc.uncorrected"))
    assert f[0].severity is Severity.FAIL and f[0].gpu == 3
    settings = Settings()
    settings.ecc.uncorrected_volatile_max = 2
    assert problems(run(facts, settings, check="ecc.uncorrected")) == []


def test_uncorrected_aggregate_warns_when_configured() -> None:
    facts = make_facts()
    assert facts.gpus[0].ecc is not None
    facts.gpus[0].ecc.uncorrected_aggregate = 5
    assert problems(run(facts, check="ecc.uncorrected")) == []
    settings = Settings()
    settings.ecc.uncorrected_aggregate_max = 1
    assert worst(run(facts, settings, check="ecc.uncorrected")) is Severity.WARN


def test_corrected_ecc_threshold_and_rate() -> None:
    facts = make_facts()
    assert facts.gpus[2].ecc is not None
    facts.gpus[2].ecc.corrected_volatile = 20000
    assert worst(run(facts, check="ecc.corrected")) is Severity.WARN
    # rate: 600 new errors in 30 minutes = 1200/h > 1000/h
    before = make_facts(collected_at=1000.0)
    now = make_facts(collected_at=1000.0 + 1800)
    assert before.gpus[2].ecc is not None and now.gpus[2].ecc is not None
    before.gpus[2].ecc.corrected_volatile = 100
    now.gpus[2].ecc.corrected_volatile = 700
    now.previous = before
    f = problems(run(now, check="ecc.corrected"))
    assert f and f[0].gpu == 2 and "1200/hour" in f[0].message
    # slower: 400 in 30 minutes = 800/h
    now.gpus[2].ecc.corrected_volatile = 500
    assert problems(run(now, check="ecc.corrected")) == []


def test_retired_pages_pending_and_count() -> None:
    facts = make_facts()
    assert run(facts, check="mem.retired_pages")[0].not_applicable
    facts.gpus[0].retired_pages = RetiredPages(single_bit=3, double_bit=1, pending=True)
    f = problems(run(facts, check="mem.retired_pages"))
    assert f[0].severity is Severity.FAIL and "pending" in f[0].message
    facts.gpus[0].retired_pages = RetiredPages(single_bit=50, double_bit=11, pending=False)
    f = problems(run(facts, check="mem.retired_pages"))
    assert f[0].severity is Severity.FAIL and "61 retired pages" in f[0].message


@pytest.mark.parametrize(("change", "needle"), [
    ({"failure": True}, "row remapping failed"),
    ({"pending": True}, "row remap pending"),
    ({"uncorrectable": 9}, "9 rows remapped"),
])
def test_row_remap_faults(change: dict, needle: str) -> None:
    facts = make_facts()
    rows = facts.gpus[6].remapped_rows
    assert rows is not None
    facts.gpus[6].remapped_rows = dataclasses.replace(rows, **change)
    f = problems(run(facts, check="mem.row_remap"))
    assert len(f) == 1 and f[0].severity is Severity.FAIL and f[0].gpu == 6 and needle in f[0].message


def test_row_remap_pending_severity_configurable() -> None:
    facts = make_facts()
    assert facts.gpus[6].remapped_rows is not None
    facts.gpus[6].remapped_rows.pending = True
    settings = Settings()
    settings.memory.pending_severity = "warn"
    assert worst(run(facts, settings, check="mem.row_remap")) is Severity.WARN


# thermal

def test_temperature_margins() -> None:
    facts = make_facts()
    facts.gpus[0].temperature_c = 84  # 3 C below slowdown 87
    assert worst(run(facts, check="thermal.temperature")) is Severity.WARN
    facts.gpus[0].temperature_c = 88
    f = problems(run(facts, check="thermal.temperature"))
    assert f[0].severity is Severity.FAIL and "-1 C below" in f[0].message


@pytest.mark.parametrize(("mask", "expected"), [
    (CLOCKS_EVENT_GPU_IDLE, Severity.OK),
    (CLOCKS_EVENT_SW_POWER_CAP, Severity.OK),
    (CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_THERMAL, Severity.WARN),
    (CLOCKS_EVENT_SW_THERMAL, Severity.WARN),
    (0x80, Severity.WARN),
])
def test_throttle_reasons(mask: int, expected: Severity) -> None:
    facts = make_facts()
    facts.gpus[1].clocks_event_reasons = mask
    assert worst(run(facts, check="thermal.throttle")) is expected


def test_throttle_severity_configurable() -> None:
    facts = make_facts()
    facts.gpus[1].clocks_event_reasons = CLOCKS_EVENT_HW_THERMAL
    settings = Settings()
    settings.thermal.hw_throttle_severity = "fail"
    f = problems(run(facts, settings, check="thermal.throttle"))
    assert f[0].severity is Severity.FAIL and "hw_thermal_slowdown" in f[0].message


# links

def test_pcie_downtrained_width_warns_and_pin_fails() -> None:
    facts = make_facts()
    assert facts.gpus[2].pcie is not None
    facts.gpus[2].pcie.width_current = 8
    f = problems(run(facts, check="pcie.link"))
    assert f[0].severity is Severity.WARN and "x8" in f[0].message
    settings = Settings()
    settings.pcie.width = 16
    assert worst(run(facts, settings, check="pcie.link")) is Severity.FAIL


def test_pcie_low_gen_ignored_when_idle() -> None:
    facts = make_facts()
    assert facts.gpus[0].pcie is not None
    facts.gpus[0].pcie.gen_current = 1
    assert problems(run(facts, check="pcie.link")) == []
    facts.gpus[0].clocks_event_reasons = 0
    assert worst(run(facts, check="pcie.link")) is Severity.WARN


def test_nvlink_down() -> None:
    facts = make_facts()
    assert facts.gpus[7].nvlinks is not None
    facts.gpus[7].nvlinks[11].active = False
    f = problems(run(facts, check="nvlink.state"))
    assert f[0].severity is Severity.FAIL and f[0].gpu == 7 and "[11]" in f[0].message
    settings = Settings()
    settings.nvlink.links = 17
    assert problems(run(facts, settings, check="nvlink.state")) == []


def test_nvlink_not_applicable_without_links() -> None:
    facts = make_facts()
    for g in facts.gpus:
        g.nvlinks = None
    assert run(facts, check="nvlink.state")[0].not_applicable
    settings = Settings()
    settings.nvlink.links = 18
    assert worst(run(facts, settings, check="nvlink.state")) is Severity.FAIL


def test_nvlink_error_counters() -> None:
    facts = make_facts()
    assert facts.gpus[3].nvlinks is not None
    facts.gpus[3].nvlinks[2].crc_data = 500
    f = problems(run(facts, check="nvlink.errors"))
    assert f[0].severity is Severity.WARN and "crc_data 500" in f[0].message and f[0].data["link"] == 2


@pytest.mark.parametrize(("change", "expected"), [
    ({"state": 1}, Severity.FAIL),
    ({"state": 2}, Severity.FAIL),
    ({"status": 5}, Severity.FAIL),
    ({"health_summary": 2}, Severity.FAIL),
    ({"health_summary": 3}, Severity.WARN),
])
def test_fabric_state(change: dict, expected: Severity) -> None:
    facts = make_facts()
    fabric = facts.gpus[0].fabric
    assert fabric is not None
    facts.gpus[0].fabric = dataclasses.replace(fabric, **change)
    assert worst(run(facts, check="fabric.state")) is expected


def test_fabric_not_applicable_on_ampere_unless_required() -> None:
    facts = make_facts()
    for g in facts.gpus:
        g.fabric = None
    assert run(facts, check="fabric.state")[0].not_applicable
    settings = Settings()
    settings.fabric.required = True
    assert worst(run(facts, settings, check="fabric.state")) is Severity.FAIL


# XIDs

@pytest.mark.parametrize(("xid", "expected", "action"), [
    # NVIDIA's catalog, immediate action (tests/test_xid_catalog.py checks every row)
    (13, Severity.OK, "ignore"), (31, Severity.OK, "ignore"), (43, Severity.OK, "ignore"),
    (68, Severity.OK, "ignore"), (63, Severity.OK, "ignore"), (92, Severity.OK, "ignore"),
    (80, Severity.OK, "ignore"),
    (48, Severity.FAIL, "reset"), (62, Severity.FAIL, "reset"), (64, Severity.FAIL, "reset"),
    (74, Severity.FAIL, "reset"), (95, Severity.FAIL, "reset"), (109, Severity.FAIL, "reset"),
    (119, Severity.FAIL, "reset"), (120, Severity.FAIL, "reset"), (79, Severity.FAIL, "reboot"),
    # written deviations, and rows that need the driver's message to decide
    (8, Severity.WARN, "warn"), (38, Severity.WARN, "warn"), (94, Severity.WARN, "warn"),
    (45, Severity.WARN, "warn"), (149, Severity.WARN, "warn"), (154, Severity.WARN, "warn"),
    (9999, Severity.WARN, "warn"),
])
def test_xid_policy_defaults(xid: int, expected: Severity, action: str) -> None:
    facts = make_facts()
    facts.xids = [XidEvent(xid, gpu=1)]
    f = run(facts, check="xid.recent")
    assert f[0].severity is expected and f[0].data["action"] == action


def test_xid_site_override_and_counting() -> None:
    facts = make_facts()
    facts.xids = [XidEvent(94, gpu=1), XidEvent(94, gpu=1), XidEvent(13, gpu=2)]
    settings = Settings()
    settings.xid.overrides = {"94": "drain", "13": "warn"}
    f = problems(run(facts, settings, check="xid.recent"))
    assert {(x.gpu, x.severity) for x in f} == {(1, Severity.FAIL), (2, Severity.WARN)}
    assert any("x2" in x.message and x.data["origin"] == "site override" for x in f)


def test_xid_scoped_to_job_gpus() -> None:
    facts = make_facts()
    facts.xids = [XidEvent(79, gpu=5), XidEvent(48, gpu=None)]
    f = problems(run(facts, scope=frozenset({0, 1}), check="xid.recent"))
    assert [x.data["xid"] for x in f] == [48]  # node-wide XIDs always count


# InfiniBand

def ib_settings(**kw: object) -> Settings:
    s = Settings()
    s.ib.count = 8
    s.ib.rate_gbps = 400
    for k, v in kw.items():
        setattr(s.ib, k, v)
    return s


def test_ib_count_mismatch_and_missing_stack() -> None:
    f = run(make_facts(ib_ports=7), ib_settings(), check="ib.count")
    assert worst(f) is Severity.FAIL and "7 InfiniBand ports present, 8 expected" in f[0].message
    facts = make_facts(ib_ports=0)
    facts.ib.available = False
    facts.ib.error = "no InfiniBand devices"
    assert "no InfiniBand devices" in run(facts, ib_settings(), check="ib.count")[0].message


def test_ib_port_down() -> None:
    facts = make_facts()
    port = facts.ib.hcas[3].ports[0]
    port.state, port.phys_state = "DOWN", "Disabled"
    f = problems(run(facts, ib_settings(), check="ib.port_state"))
    assert f[0].severity is Severity.FAIL and f[0].subject == "mlx5_3/1"


def test_ib_rate_downgraded() -> None:
    facts = make_facts()
    facts.ib.hcas[5].ports[0].rate_gbps = 200.0
    f = problems(run(facts, ib_settings(), check="ib.rate"))
    assert f[0].severity is Severity.FAIL and f[0].subject == "mlx5_5/1"


def test_ib_ethernet_ports_ignored_by_default() -> None:
    facts = make_facts()
    facts.ib.hcas[0].ports[0].link_layer = "Ethernet"
    facts.ib.hcas[0].ports[0].state = "DOWN"
    assert problems(run(facts, ib_settings(count=7), check="ib.port_state")) == []
    assert worst(run(facts, ib_settings(count=7, include_ethernet=True), check="ib.port_state")) is Severity.FAIL


def test_ib_counters_absolute_and_rising() -> None:
    before = make_facts(collected_at=1000.0)
    now = make_facts(collected_at=1015.0)
    now.ib.hcas[2].ports[0].counters["symbol_error"] = 5000
    f = problems(run(now, ib_settings(), check="ib.errors"))
    assert f[0].severity is Severity.WARN and "symbol_error 5000" in f[0].message
    before.ib.hcas[2].ports[0].counters["link_downed"] = 1
    now.ib.hcas[2].ports[0].counters["link_downed"] = 3
    now.previous = before
    f = problems(run(now, ib_settings(), check="ib.errors"))
    assert any("link_downed +2" in x.message for x in f)


# engine behaviour

def test_crashing_check_becomes_unknown_and_others_still_run() -> None:
    facts = make_facts()
    facts.gpus[0].pcie = "garbage"  # type: ignore[assignment]
    findings = run(facts)
    crashed = [f for f in findings if f.check == "pcie.link"]
    assert len(crashed) == 1 and crashed[0].severity is Severity.UNKNOWN
    assert "check crashed" in crashed[0].message
    assert len({f.check for f in findings}) == len(all_checks())
    assert evaluate(facts, Settings()).severity is Severity.UNKNOWN


def test_verdict_is_worst_finding_with_fail_above_unknown() -> None:
    facts = make_facts()
    facts.gpus[0].pcie = "garbage"  # type: ignore[assignment]
    facts.gpus[1].lost = True
    assert evaluate(facts, Settings()).severity is Severity.FAIL


def test_disabled_checks_do_not_run() -> None:
    settings = Settings()
    settings.checks.disabled = ["ib.*", "pin.nccl"]
    ids = {f.check for f in run(make_facts(), settings)}
    assert not any(i.startswith("ib.") for i in ids) and "pin.nccl" not in ids and "pin.driver" in ids


def test_scope_limits_gpu_findings() -> None:
    facts = make_facts()
    facts.gpus[4].temperature_c = 95
    assert problems(run(facts, scope=frozenset({0, 1, 2, 3}), check="thermal.temperature")) == []
    assert problems(run(facts, scope=frozenset({4}), check="thermal.temperature"))


def test_facts_round_trip_json() -> None:
    facts = make_facts()
    facts.xids = [XidEvent(79, 3, 12.5)]
    assert NodeFacts.from_json(facts.to_json()) == facts


def test_ib_firmware_pin_ignores_ethernet_only_nics() -> None:
    facts = make_facts()
    facts.ib.hcas[7].fw_ver = "22.36.1010"
    facts.ib.hcas[7].ports[0].link_layer = "Ethernet"
    settings = ib_settings(count=7)
    settings.pins.ib_firmware = ["28.39.*"]
    assert problems(run(facts, settings, check="pin.ib_firmware")) == []
    settings.ib.include_ethernet = True
    assert [x.subject for x in problems(run(facts, settings, check="pin.ib_firmware"))] == ["mlx5_7"]


def test_ib_rate_skips_ports_that_are_down() -> None:
    facts = make_facts()
    port = facts.ib.hcas[1].ports[0]
    port.state, port.rate_gbps = "DOWN", 10.0
    assert problems(run(facts, ib_settings(), check="ib.rate")) == []
    assert problems(run(facts, ib_settings(), check="ib.port_state"))


def test_ib_counters_rising_between_fixture_trees() -> None:
    """Two real sysfs samples (tests/data/sysfs/ib-counters-rising) through the IB source."""
    from pathlib import Path

    from slurmgpu.sources.infiniband import SysfsIbSource

    root = Path(__file__).parent / "data" / "sysfs" / "ib-counters-rising"
    before = make_facts(collected_at=1000.0)
    before.ib = SysfsIbSource(root / "before").collect()
    now = make_facts(collected_at=1015.0)
    now.ib = SysfsIbSource(root / "after").collect()
    assert problems(run(now, ib_settings(), check="ib.errors")) == []  # absolute values still low
    now.previous = before
    f = problems(run(now, ib_settings(), check="ib.errors"))
    assert [x.subject for x in f] == ["mlx5_2/1"]
    assert {"symbol_error", "link_downed"} <= set(f[0].data["deltas"])


def test_gpu_model_pins_what_nvml_names_the_gpus() -> None:
    facts = make_facts(gpus=2)
    facts.gpus[0].name, facts.gpus[1].name = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    settings = Settings()
    assert [f.message for f in run(facts, settings, check="gpu.model")] == ["GPU model not pinned"]
    settings.gpu.model = ["NVIDIA H100*"]
    (only,) = [f for f in run(facts, settings, check="gpu.model") if f.severity is Severity.FAIL]
    assert only.gpu == 1 and "NVIDIA A100-SXM4-80GB, expected NVIDIA H100*" in only.message
    settings.gpu.model = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    assert worst(run(facts, settings, check="gpu.model")) is Severity.OK


def test_check_all_marks_not_applicable_rows_and_names_what_pin_cuda_judged() -> None:
    """Issue 29 item 7: `check --all` printed OK for not-applicable findings, and two
    pin.cuda rows without saying which CUDA each judged."""
    from slurmgpu.cli.checkrun import render_table

    settings = Settings()
    settings.pins.cuda_driver = ["12.4"]
    table = render_table(evaluate(make_facts(), settings), show_all=True, duration_ms=1)
    rows = {line.split()[1] + " " + line.split(None, 3)[3]: line.split()[0]
            for line in table.splitlines()[1:] if line.startswith(("OK", "N/A"))}
    assert rows["pin.driver NVIDIA driver not pinned"] == "N/A"
    assert rows["pin.cuda CUDA toolkit not pinned"] == "N/A"
    assert rows["pin.cuda driver's CUDA version 12.4"] == "OK"
