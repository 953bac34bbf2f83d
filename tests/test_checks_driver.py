"""Issue 10 checks over pure-Python facts (logic tests): NVML errors, the driver's recovery
action, clock brake, HBM temperature, PCIe replays, SRAM ECC, fabric health from the mask."""

from __future__ import annotations

import copy
import dataclasses

from slurmgpu.config.schema import AutomationSettings, Settings
from slurmgpu.decision import PolicyTable
from slurmgpu.engine import evaluate
from slurmgpu.facts import FabricInfo, NodeFacts
from slurmgpu.result import Severity
from slurmgpu.testing import make_facts


def found(facts: NodeFacts, check: str, settings: Settings | None = None) -> list[tuple[str, int | None]]:
    verdict = evaluate(facts, settings or Settings())
    return [(f.severity.name, f.gpu) for f in verdict.findings
            if f.check == check and f.severity is not Severity.OK]


def with_previous(facts: NodeFacts, prev: NodeFacts, dt: float = 15.0) -> NodeFacts:
    prev.collected_at = facts.collected_at - dt
    facts.previous = prev
    return facts


def test_one_unconfirmed_error_is_unknown_and_a_repeat_fails() -> None:
    facts = make_facts()
    facts.gpus[2].errors = {"temperature": "Unknown Error"}
    facts.gpus[2].error_codes = {"temperature": 999}
    assert found(facts, "gpu.nvml_errors") == [("UNKNOWN", 2)]
    prev = copy.deepcopy(facts)  # the agent's previous poll had the same error
    assert found(with_previous(facts, prev), "gpu.nvml_errors") == [("FAIL", 2)]


def test_an_error_that_persisted_through_the_retry_fails() -> None:
    facts = make_facts()
    facts.gpus[1].errors, facts.gpus[1].error_codes = {"ecc.uncorrected_volatile": "Timeout"}, {
        "ecc.uncorrected_volatile": 10}
    facts.gpus[1].retried = True
    assert found(facts, "gpu.nvml_errors") == [("FAIL", 1)]


def test_reset_required_fails_at_once_and_no_permission_never_does() -> None:
    facts = make_facts()
    facts.gpus[0].errors, facts.gpus[0].error_codes = {"sm_clock": "GPU requires restart"}, {"sm_clock": 16}
    facts.gpus[5].errors, facts.gpus[5].error_codes = {"serial": "Insufficient Permissions"}, {"serial": 4}
    facts.gpus[5].retried = True
    assert found(facts, "gpu.nvml_errors") == [("FAIL", 0), ("UNKNOWN", 5)]


def test_an_error_that_answered_on_the_retry_warns() -> None:
    facts = make_facts()
    facts.gpus[3].retried = True
    facts.gpus[3].transient_errors = {"power": "Unknown Error"}
    assert found(facts, "gpu.nvml_errors") == [("WARN", 3)]


def test_recovery_action_fails_and_maps_to_the_policy() -> None:
    facts = make_facts()
    for gpu in facts.gpus:
        gpu.recovery_action = 0
    facts.gpus[4].recovery_action = 2  # NODE_REBOOT
    verdict = evaluate(facts, Settings())
    (f,) = [f for f in verdict.findings if f.check == "gpu.recovery_action" and f.severity is Severity.FAIL]
    assert f.gpu == 4 and "NODE_REBOOT" in f.message and f.data["action"] == "reboot"
    assert PolicyTable(AutomationSettings(reboot_allowed=True)).action(f) == "reboot"
    assert PolicyTable(AutomationSettings()).action(f) == "drain"
    reset = dataclasses.replace(f, data={"recovery_action": "GPU_RESET", "action": "reset"})
    assert PolicyTable(AutomationSettings(reboot_allowed=True)).action(reset) == "drain"


def test_recovery_action_not_reported_is_not_applicable() -> None:
    verdict = evaluate(make_facts(), Settings())
    (f,) = [f for f in verdict.findings if f.check == "gpu.recovery_action"]
    assert f.not_applicable


def braked(facts: NodeFacts, gpus: range, *, board_ns: int = 0) -> NodeFacts:
    for i in gpus:
        g = facts.gpus[i]
        g.clocks_event_reasons, g.sm_clock_mhz, g.sm_clock_max_mhz = 0x88, 86, 1980
        g.throttle_ns = {"power": 0, "thermal": 0, "board_limit": board_ns, "reliability": 0}
    return facts


def test_clock_brake_warns_once_and_fails_when_sustained() -> None:
    facts = braked(make_facts(), range(8))
    assert found(facts, "thermal.clock_brake") == [("WARN", i) for i in range(8)]
    sustained = with_previous(braked(make_facts(), range(8)), braked(make_facts(), range(8)))
    assert found(sustained, "thermal.clock_brake") == [("FAIL", i) for i in range(8)]


def test_clock_brake_fails_on_throttle_time_since_the_last_poll() -> None:
    prev = make_facts()  # not braked when sampled...
    for g in prev.gpus:
        g.throttle_ns = {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0}
    facts = with_previous(braked(make_facts(), range(1), board_ns=12 * 10**9), prev)
    assert found(facts, "thermal.clock_brake") == [("FAIL", 0)]  # ...but 12 s braked since


def test_sw_power_cap_and_full_clocks_are_no_brake() -> None:
    facts = make_facts()
    g = facts.gpus[0]
    g.clocks_event_reasons, g.sm_clock_mhz, g.sm_clock_max_mhz = 0x4, 1755, 1980  # SW power cap
    g.throttle_ns = {"power": 10**12, "thermal": 0, "board_limit": 0, "reliability": 0}
    h = facts.gpus[1]
    h.clocks_event_reasons, h.sm_clock_mhz, h.sm_clock_max_mhz = 0x8, 1800, 1980  # flag at full clock
    assert found(facts, "thermal.clock_brake") == []


def test_hbm_temperature_margins() -> None:
    facts = make_facts()
    facts.gpus[0].memory_temp_c, facts.gpus[0].memory_max_temp_c = 91, 95
    facts.gpus[1].memory_temp_c, facts.gpus[1].memory_max_temp_c = 96, 95
    facts.gpus[2].memory_temp_c, facts.gpus[2].memory_max_temp_c = 40, 95
    assert found(facts, "thermal.memory_temperature") == [("WARN", 0), ("FAIL", 1)]


def test_pcie_replay_rate_needs_two_samples() -> None:
    facts = make_facts()
    for g in facts.gpus:
        g.pcie_replay = 500
    assert found(facts, "pcie.replay") == []  # one sample: a lifetime count says nothing
    prev = copy.deepcopy(facts)
    facts.gpus[6].pcie_replay = 500 + 300  # 300 in 15 s = 1,200/min
    facts.gpus[5].pcie_replay = 500 + 1
    assert found(with_previous(facts, prev), "pcie.replay") == [("WARN", 6)]


def test_sram_threshold() -> None:
    facts = make_facts()
    for g in facts.gpus:
        g.sram_threshold_exceeded = False
    facts.gpus[7].sram_threshold_exceeded = True
    assert found(facts, "ecc.sram") == [("FAIL", 7)]
    settings = Settings()
    settings.ecc.sram_threshold_severity = "warn"
    assert found(facts, "ecc.sram", settings) == [("WARN", 7)]


def test_fabric_health_from_the_v2_mask() -> None:
    facts = make_facts()
    ok_mask = 0b10101010  # every field FALSE / NONE
    for g in facts.gpus:
        g.fabric = FabricInfo(state=3, status=0, health_mask=ok_mask, struct_version=2)
    facts.gpus[1].fabric = FabricInfo(state=3, status=0, health_mask=ok_mask & ~0x30 | 0x10, struct_version=2)
    facts.gpus[2].fabric = FabricInfo(state=3, status=0, health_mask=ok_mask & ~0x3 | 0x1, struct_version=2)
    facts.gpus[3].fabric = FabricInfo(state=3, status=0, health_mask=ok_mask | (2 << 8), struct_version=2)
    assert found(facts, "fabric.state") == [("FAIL", 1), ("WARN", 2), ("FAIL", 3)]


def test_a_persistent_error_on_a_side_query_alone_is_unknown() -> None:
    facts = make_facts()
    g = facts.gpus[2]
    g.errors, g.error_codes, g.retried = {"throttle_time.power": "Unknown Error"}, {"throttle_time.power": 999}, True
    assert found(facts, "gpu.nvml_errors") == [("UNKNOWN", 2)]
    g.errors["temperature"], g.error_codes["temperature"] = "Unknown Error", 999  # now a core query too
    assert found(facts, "gpu.nvml_errors") == [("FAIL", 2), ("UNKNOWN", 2)]


def test_a_brake_seen_only_while_idle_never_fails() -> None:
    def idle_braked() -> NodeFacts:
        facts = braked(make_facts(), range(1))
        facts.gpus[0].clocks_event_reasons = 0x1 | 0x88  # idle and HW slowdown
        return facts

    assert found(with_previous(idle_braked(), idle_braked()), "thermal.clock_brake") == [("WARN", 0)]
