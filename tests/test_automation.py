"""The collector's automation policy: drains, breaker, resume hysteresis, lemons, dry run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.collector.policy import Automation, Decision, PolicyTable
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.result import Finding, Severity
from slurmgpu.testing import FakeClock, FakeSlurmClient
from slurmgpu.wire import decode_finding

NODES = [f"gpu-{i:03d}" for i in range(1, 101)]


def finding(check: str, severity: str = "FAIL", message: str = "broken", gpu: int | None = 0,
            **data: Any) -> Finding:
    """A finding as the collector has it: decoded from what an agent sends."""
    return decode_finding({"check": check, "severity": severity, "gpu": gpu, "subject": None,
                           "message": message, "not_applicable": False, "data": data})


FAIL = [finding("ecc.uncorrected", message="3 volatile uncorrected ECC errors")]
THROTTLE = [finding("thermal.throttle", "WARN", "HW slowdown active")]


def make(tmp_path: Path, nodes: int = 40, **kw: Any) -> tuple[Automation, FakeSlurmClient, FakeClock]:
    client = FakeSlurmClient(NODES[:nodes])
    clock = FakeClock()
    auto = Automation(AutomationSettings(**kw), client, tmp_path, clock, store=Store(tmp_path / "fleet.db"))
    auto.fleet_size(nodes)
    return auto, client, clock


def drains(client: FakeSlurmClient) -> list[str]:
    return [c[1] for c in client.calls if c[0] == "drain"]


def ok(auto: Automation, node: str, clock: FakeClock) -> list[Decision]:
    return auto.on_report(node, Severity.OK, [], clock.time())


def test_fail_drains_once(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    [d] = auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    assert (d.action, d.result, d.held, d.trigger) == ("drain", "drained", False, "ecc.uncorrected")
    assert client.states["gpu-001"].reason == "slurmgpu: ecc.uncorrected GPU 0 3 volatile uncorrected ECC errors"
    clock.advance(15)
    assert auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time()) == []
    assert drains(client) == ["gpu-001"]


def test_thermal_warn_then_drain_after_strikes(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, strikes=3)
    for _ in range(2):
        [d] = auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
        assert (d.action, d.result) == ("warn", "recorded")
        clock.advance(15)
    [d] = auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
    assert (d.action, d.result) == ("drain", "drained")
    assert "(3 reports)" in (client.states["gpu-002"].reason or "")


def test_strikes_reset_by_a_clean_report(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, strikes=2)
    auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
    ok(auto, "gpu-002", clock)
    [d] = auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
    assert d.action == "warn" and drains(client) == []


def test_xid_actions(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    [d] = auto.on_report("gpu-003", Severity.FAIL, [finding("xid.recent", message="XID 79", xid=79, action="drain")],
                         clock.time())
    assert (d.action, d.result) == ("drain-now", "drained")
    assert client.states["gpu-003"].reason == "slurmgpu: xid.recent GPU 0 XID 79"
    decisions = []
    for _ in range(4):  # an XID drain is sticky: healthy reports do not resume it
        clock.advance(300)
        decisions += ok(auto, "gpu-003", clock)
    assert [d.result for d in decisions] == ["sticky-drain-kept"] and client.states["gpu-003"].drained
    table = PolicyTable(AutomationSettings())
    assert table.action(finding("xid.recent", "WARN", xid=13, action="warn")) == "warn"
    assert table.action(finding("xid.recent", "OK", xid=1, action="ignore")) == "none"
    assert table.action(finding("xid.recent", xid=48, action="reset")) == "drain"
    assert table.action(finding("xid.recent", xid=154, action="reboot")) == "drain"
    allowed = PolicyTable(AutomationSettings(reboot_allowed=True))
    assert allowed.action(finding("xid.recent", xid=154, action="reboot")) == "reboot"


def test_row_remap_pending_checkpoint_then_drain(tmp_path: Path) -> None:
    table = PolicyTable(AutomationSettings())
    pending = finding("mem.row_remap", message="row remap pending: GPU reset needed")
    assert table.action(pending, 1) == "checkpoint"
    assert table.action(pending, 2) == "drain"


def test_site_overrides(tmp_path: Path) -> None:
    table = PolicyTable(AutomationSettings(policy={"ecc.uncorrected": "drain-now",
                                                   "thermal.throttle:WARN": "none"}))
    assert table.action(FAIL[0]) == "drain-now"
    assert table.action(THROTTLE[0], 10) == "none"
    assert table.action(finding("thermal.throttle", "FAIL")) == "drain"
    with pytest.raises(ValueError, match="severity"):
        PolicyTable(AutomationSettings(policy={"x:BAD": "warn"}))


def test_storm_trips_breaker_and_caps_fraction(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=40)
    pin = [finding("pins.driver", message="driver 550.54 not in pins", gpu=None)]
    decisions = []
    for node in NODES[:30]:
        decisions += auto.on_report(node, Severity.FAIL, pin, clock.time())
        clock.advance(5)
    assert len(drains(client)) == 4  # 10 % of 40
    assert sum(d.held for d in decisions) == 26
    status = auto.status()
    assert status["breaker_open"] and len(status["held"]) == 26
    assert status["why"].startswith("fraction")


def test_storm_alone_trips_breaker(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=40, max_fraction=0.9, max_per_hour=100)
    pin = [finding("pins.driver", gpu=None)]
    for node in NODES[:12]:
        auto.on_report(node, Severity.FAIL, pin, clock.time())
    assert len(drains(client)) == 9
    assert auto.status()["why"].startswith("storm: pins.driver failing on 10 of 40")


def test_storm_window_expires(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=40, max_fraction=0.9, max_per_hour=100)
    pin = [finding("pins.driver", gpu=None)]
    for node in NODES[:12]:
        auto.on_report(node, Severity.FAIL, pin, clock.time())
        clock.advance(60)  # never 10 within 300 s
    assert len(drains(client)) == 12 and not auto.status()["breaker_open"]


def test_per_hour_cap_and_release(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=100)
    checks = ["ecc.uncorrected", "mem.retired_pages", "nvlink.state", "pcie.link", "fabric.state",
              "gpu.count", "ib.rate"]
    for node, check in zip(NODES, checks, strict=False):
        auto.on_report(node, Severity.FAIL, [finding(check)], clock.time())
        clock.advance(60)
    assert len(drains(client)) == 5
    assert auto.status()["why"].startswith("rate: 5 drains")
    assert [h["node"] for h in auto.status()["held"]] == NODES[5:7]
    clock.advance(3600)  # the hour has passed, but the breaker stays open until released
    [d] = auto.on_report(NODES[5], Severity.FAIL, [finding(checks[5])], clock.time())
    assert d.held
    auto.release()
    assert not auto.status()["breaker_open"] and auto.status()["held"] == []
    [d] = auto.on_report(NODES[5], Severity.FAIL, [finding(checks[5])], clock.time())
    assert (d.held, d.result) == (False, "drained")


def test_auto_resume_hysteresis(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    for _ in range(3):  # 3 OK reports but only 400 s
        clock.advance(200)
        assert ok(auto, "gpu-001", clock) == []
    clock.advance(200)  # 4th report: the streak now spans 600 s
    [d] = ok(auto, "gpu-001", clock)
    assert (d.action, d.result) == ("resume", "resumed")
    assert client.calls[-1] == ("resume", "gpu-001")
    assert ok(auto, "gpu-001", clock) == []


def test_unhealthy_report_resets_streak(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    for _ in range(2):
        clock.advance(400)
        ok(auto, "gpu-001", clock)
    clock.advance(400)
    auto.on_report("gpu-001", Severity.WARN, THROTTLE, clock.time())
    for _ in range(2):
        clock.advance(400)
        assert ok(auto, "gpu-001", clock) == []
    assert ("resume", "gpu-001") not in client.calls


def test_operator_drained_node_never_resumed(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    client.states["gpu-001"] = dataclasses.replace(client.states["gpu-001"], reason="bob: replacing DIMM")
    decisions = []
    for _ in range(4):
        clock.advance(300)
        decisions += ok(auto, "gpu-001", clock)
    assert ("resume", "gpu-001") not in client.calls
    assert [d.result for d in decisions] == ["operator-drain-kept"]
    assert "gpu-001" not in auto.status()["drained"]
    # an operator drain found at drain time is kept too
    client.states["gpu-002"] = dataclasses.replace(client.states["gpu-002"], flags=frozenset({"DRAIN"}),
                                                   reason="alice: maintenance")
    [d] = auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())
    assert d.result == "operator-drain-kept" and client.states["gpu-002"].reason == "alice: maintenance"


def test_lemon_stays_drained(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path)
    for _ in range(3):
        auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
        for _ in range(4):
            clock.advance(300)
            ok(auto, "gpu-001", clock)
    assert drains(client) == ["gpu-001"] * 3
    assert auto.status()["lemons"]["gpu-001"]["why"].startswith("3 drains within 7 days, last: ")
    assert client.states["gpu-001"].drained
    assert [c for c in client.calls if c[0] == "resume"] == [("resume", "gpu-001")] * 2
    auto.clear_lemon("gpu-001")
    assert auto.status()["lemons"] == {}


def test_dry_run_records_without_calls(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, dry_run=True)
    [d] = auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    assert (d.action, d.dry_run, d.result) == ("drain", True, "dry-run")
    assert auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time()) == []
    decisions = []
    for _ in range(4):
        clock.advance(300)
        decisions += ok(auto, "gpu-001", clock)
    assert [(d.action, d.result) for d in decisions] == [("resume", "dry-run")]
    assert client.calls == []


def test_state_survives_restart(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=100)
    for i, node in enumerate(NODES[:6]):
        auto.on_report(node, Severity.FAIL, [finding(f"check.{i}")], clock.time())
    auto.on_report("gpu-050", Severity.WARN, THROTTLE, clock.time())
    again = Automation(AutomationSettings(), client, tmp_path, clock, store=Store(tmp_path / "fleet.db"))
    status = again.status()
    assert status["breaker_open"] and [h["node"] for h in status["held"]] == ["gpu-006"]
    assert status["drained"] == NODES[:5]
    assert again.on_report("gpu-001", Severity.FAIL, FAIL, clock.time()) == []  # still drained: idempotent
    again.on_report("gpu-050", Severity.WARN, THROTTLE, clock.time())
    [d] = again.on_report("gpu-050", Severity.WARN, THROTTLE, clock.time())
    assert d.action == "drain" and d.held  # third strike counted across the restart


def test_settings_in_config(tmp_path: Path) -> None:
    from slurmgpu.config.load import load_config

    path = tmp_path / "s.toml"
    path.write_text('[automation]\ndry_run = true\n[automation.policy]\n"thermal.throttle:WARN" = "none"\n')
    cfg = load_config(str(path), environ={})
    assert cfg.settings_for("gpu-001").automation.policy == {"thermal.throttle:WARN": "none"}


def test_reboot_action_when_allowed(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, reboot_allowed=True)
    [d] = auto.on_report("gpu-001", Severity.FAIL, [finding("xid.recent", xid=154, action="reboot")], clock.time())
    assert (d.action, d.result) == ("reboot", "reboot-requested")
    assert [c[0] for c in client.calls] == ["reboot"]
    assert client.states["gpu-001"].rebooting and client.states["gpu-001"].reason.startswith("slurmgpu: xid.recent")


def test_refused_reboot_drains_instead(tmp_path: Path) -> None:
    from slurmgpu.slurm import SlurmError

    auto, client, clock = make(tmp_path, reboot_allowed=True)

    def refuse(node: str, reason: str) -> None:
        raise SlurmError("cannot reboot: Slurm has no RebootProgram configured")

    client.reboot = refuse  # type: ignore[method-assign]
    [d] = auto.on_report("gpu-001", Severity.FAIL, [finding("xid.recent", xid=154, action="reboot")], clock.time())
    assert (d.action, d.result) == ("reboot", "drained") and drains(client) == ["gpu-001"]


def test_automation_refuses_to_start_without_a_writable_state_dir(tmp_path: Path) -> None:
    """Issue 12 item 10: before, it started and drained but recorded no decision."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="not writable"):
        Automation(AutomationSettings(), FakeSlurmClient(["n1"]), blocker / "state",
                   store=Store(tmp_path / "fleet.db"))


# ---- breaker release: the held drains proceed once; would it trip again, and why


def test_release_lets_the_held_drains_proceed_once(tmp_path: Path) -> None:
    """The admin's 3-node cluster: a release used to close the breaker and drop the held
    drain, which the next report held again at once (max_fraction re-tripped)."""
    auto, client, clock = make(tmp_path, nodes=3, max_fraction=0.34, min_nodes=1)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    [held] = auto.on_report("gpu-002", Severity.FAIL, [finding("nvlink.state")], clock.time())
    assert held.held and auto.status()["why"] == (
        "fraction: 1 of 3 nodes drained, gpu-002 would make 2; max_fraction = 0.34 trips at 2 nodes")
    before = auto.forecast(clock.time())
    assert before["would_trip"] and before["coming"] == ["gpu-002"]

    clock.advance(60)
    [released] = auto.release(by="alice")
    assert (released["node"], released["action"], released["released_by"]) == ("gpu-002", "drain", "alice")
    status = auto.status()
    assert not status["breaker_open"] and status["held"] == []
    assert [r["node"] for r in status["released"]] == ["gpu-002"]
    forecast = auto.forecast(clock.time())
    fraction = forecast["rules"][0]
    assert (fraction["rule"], fraction["setting"], fraction["count"], fraction["trips_at"]) == (
        "fraction", "automation.max_fraction", 2, 2)
    assert fraction["text"].startswith("2 of 3 nodes (67%) would be drained; max_fraction = 0.34 trips at 2 nodes")
    assert forecast["would_trip"] and fraction["trips_again"] and forecast["why"] == [fraction["text"]]

    # The next report comes first (before the collector's loop turn): the drain proceeds.
    clock.advance(15)
    [d] = auto.on_report("gpu-002", Severity.FAIL, [finding("nvlink.state")], clock.time())
    assert (d.held, d.result, d.released_by) == (False, "drained", "alice")
    assert d.reason.endswith("(held by the breaker, released by alice)")
    assert client.states["gpu-002"].reason.startswith("slurmgpu: nvlink.state GPU 0 broken")  # as ever
    assert auto.run_released(clock.time()) == [] and auto.status()["released"] == []
    assert auto.on_report("gpu-002", Severity.FAIL, [finding("nvlink.state")], clock.time()) == []  # once
    # ... and, as forecast, the next new drain trips the breaker again.
    [d] = auto.on_report("gpu-003", Severity.FAIL, FAIL, clock.time())
    assert d.held and drains(client) == ["gpu-001", "gpu-002"]


def test_release_then_the_next_report_drains(tmp_path: Path) -> None:
    """2 nodes, one drained at a time: the held drain used to be dropped by the release
    and held again at the node's next report."""
    auto, client, clock = make(tmp_path, nodes=2)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    assert auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())[0].held
    auto.release()
    clock.advance(15)
    [d] = auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())
    assert (d.held, d.result) == (False, "drained") and drains(client) == ["gpu-001", "gpu-002"]
    assert "released by operator" in d.reason


def test_release_carried_out_by_run_released(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=3, max_fraction=0.34, min_nodes=1)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())
    # Another process (`slurmgpu breaker release`) releases it through the database.
    other = Automation(AutomationSettings(max_fraction=0.34, min_nodes=1), client, tmp_path, clock,
                       store=Store(tmp_path / "fleet.db"), read_only=True)
    other.release(by="bob")
    assert auto.refresh()  # what the collector does at each loop turn: the version moved
    [d] = auto.run_released(clock.time())
    assert (d.node, d.action, d.result, d.held, d.released_by) == ("gpu-002", "drain", "drained", False, "bob")
    assert auto.run_released(clock.time()) == []
    assert drains(client) == ["gpu-001", "gpu-002"] and "gpu-002" in auto.status()["drained"]


def test_released_drain_dropped_when_the_node_is_healthy_again(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=3, max_fraction=0.34, min_nodes=1)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())
    auto.release(by="carol")
    ok(auto, "gpu-002", clock)
    assert auto.run_released(clock.time()) == [] and drains(client) == ["gpu-001"]


def test_forecast_names_the_setting_that_decides(tmp_path: Path) -> None:
    auto, _client, clock = make(tmp_path, nodes=4)  # defaults: min_nodes = 2
    forecast = auto.forecast(clock.time())
    fraction, rate, storm = forecast["rules"]
    assert (fraction["setting"], fraction["limit"], fraction["count"], fraction["trips_again"]) == (
        "automation.min_nodes", 2, 0, False)
    assert fraction["text"] == "0 of 4 nodes (0%) would be drained; min_nodes = 2 trips at 3 nodes"
    assert (rate["setting"], rate["limit"], rate["trips_again"]) == ("automation.max_per_hour", 5, False)
    assert (storm["setting"], storm["trips_at"]) == ("automation.min_nodes", 3)
    assert not forecast["would_trip"] and forecast["why"] == []
    big, _, _ = make(tmp_path / "big", nodes=100)
    assert [r["setting"] for r in big.forecast()["rules"]] == [
        "automation.max_fraction", "automation.max_per_hour", "automation.storm_fraction"]


def test_forecast_storm_trips_again_while_the_drained_nodes_still_fail(tmp_path: Path) -> None:
    auto, _client, clock = make(tmp_path, nodes=40, max_fraction=0.9, max_per_hour=100)
    pin = [finding("pins.driver", gpu=None)]
    for node in NODES[:12]:
        auto.on_report(node, Severity.FAIL, pin, clock.time())
    assert auto.status()["why"].startswith("storm: pins.driver failing on 10 of 40")
    assert len(auto.release(by="dan")) == 3
    forecast = auto.forecast(clock.time())
    storm = forecast["rules"][2]
    assert (storm["check"], storm["count"], storm["trips_at"], storm["trips_again"]) == ("pins.driver", 12, 10, True)
    assert "storm_fraction = 0.25 trips when one check fails on 10 nodes within 300 s" in storm["text"]
    assert forecast["would_trip"]


# ---- the breaker's floor on small fleets (min_nodes)


def test_breaker_limits_table() -> None:
    from slurmgpu.collector.breaker import fraction_limit, storm_threshold

    s = AutomationSettings()  # max_fraction 0.1, storm_fraction 0.25, min_nodes 2
    assert [fraction_limit(s, n) for n in (1, 2, 3, 4, 19, 20, 30, 100)] == [
        (1, "max_fraction"), (1, "max_fraction"), (2, "min_nodes"), (2, "min_nodes"), (2, "min_nodes"),
        (2, "max_fraction"), (3, "max_fraction"), (10, "max_fraction")]
    assert [storm_threshold(s, n) for n in (1, 2, 3, 4, 8, 12, 40)] == [
        (2, "storm_fraction"), (2, "storm_fraction"), (3, "min_nodes"), (3, "min_nodes"), (3, "min_nodes"),
        (3, "storm_fraction"), (10, "storm_fraction")]
    old = AutomationSettings(min_nodes=1)  # the fractions alone, as before min_nodes
    assert [fraction_limit(old, n)[0] for n in (1, 3, 4, 40)] == [1, 1, 1, 4]
    assert [storm_threshold(old, n)[0] for n in (3, 4, 40)] == [2, 2, 10]


@pytest.mark.parametrize("nodes", [3, 4])
def test_small_fleet_defaults_allow_a_second_drain(tmp_path: Path, nodes: int) -> None:
    """On 3-4 nodes the default max_fraction (0.1) allowed a single drained node: the
    second one tripped the breaker, which then held every later drain."""
    auto, client, clock = make(tmp_path, nodes=nodes)
    xid79 = [finding("xid.recent", message="XID 79", xid=79, action="reset")]
    assert auto.on_report("gpu-001", Severity.FAIL, xid79, clock.time())[0].result == "drained"
    clock.advance(60)
    assert auto.on_report("gpu-002", Severity.FAIL, xid79, clock.time())[0].result == "drained"
    assert not auto.status()["breaker_open"]
    # A third node failing the same check is a storm on this fleet: held.
    clock.advance(60)
    [d] = auto.on_report("gpu-003", Severity.FAIL, xid79, clock.time())
    assert d.held and auto.status()["breaker_open"]
    assert drains(client) == ["gpu-001", "gpu-002"]


def test_small_fleet_floor_never_covers_the_whole_fleet(tmp_path: Path) -> None:
    auto, _client, clock = make(tmp_path, nodes=2)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    [d] = auto.on_report("gpu-002", Severity.FAIL, [finding("nvlink.state")], clock.time())
    assert d.held and auto.status()["why"].startswith("fraction: 1 of 2 nodes drained")


def test_min_nodes_one_is_the_old_breaker(tmp_path: Path) -> None:
    auto, _client, clock = make(tmp_path, nodes=4, min_nodes=1)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    [d] = auto.on_report("gpu-002", Severity.FAIL, [finding("nvlink.state")], clock.time())
    assert d.held and auto.status()["why"].endswith("max_fraction = 0.1 trips at 2 nodes")


def test_storm_of_many_nodes_still_trips_on_a_mid_size_fleet(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=12, max_fraction=1.0, max_per_hour=100)
    pin = [finding("pins.driver", gpu=None)]
    for node in NODES[:5]:
        auto.on_report(node, Severity.FAIL, pin, clock.time())
    assert len(drains(client)) == 2  # 3 of 12 failing one check is a storm (storm_fraction 0.25)
    assert auto.status()["why"].startswith("storm: pins.driver failing on 3 of 12 nodes")


# ---- drain reasons people can read (issue 29 item 6)


def test_a_drain_after_a_long_hold_names_no_report_count(tmp_path: Path) -> None:
    """A FAIL drains at once: the reports that came while the breaker held it are no part
    of why (they used to leak into Slurm's reason as "(10 reports)")."""
    auto, client, clock = make(tmp_path, nodes=2)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    for _ in range(9):
        assert auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())[0].held
        clock.advance(15)
    auto.release(by="alice")
    auto.on_report("gpu-002", Severity.FAIL, FAIL, clock.time())
    assert client.states["gpu-002"].reason == "slurmgpu: ecc.uncorrected GPU 0 3 volatile uncorrected ECC errors"


def test_a_warn_that_drains_on_repeats_names_the_repeats_it_needed(tmp_path: Path) -> None:
    auto, client, clock = make(tmp_path, nodes=2, strikes=3)
    auto.on_report("gpu-001", Severity.FAIL, FAIL, clock.time())
    for _ in range(5):
        auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
    auto.release()
    auto.on_report("gpu-002", Severity.WARN, THROTTLE, clock.time())
    assert client.states["gpu-002"].reason == "slurmgpu: thermal.throttle GPU 0 HW slowdown active (3 reports)"


@pytest.mark.parametrize(("allowed", "says"), [
    (False, "slurmgpu: xid.recent GPU 0 XID 79: GPU has fallen off the bus (needs a reboot)"),
    (True, "slurmgpu: xid.recent GPU 0 XID 79: GPU has fallen off the bus -> reboot"),
])
def test_a_reboot_is_named_only_where_one_is_done(tmp_path: Path, allowed: bool, says: str) -> None:
    auto, client, clock = make(tmp_path, reboot_allowed=allowed)
    xid = finding("xid.recent", message="XID 79: GPU has fallen off the bus -> reboot", xid=79, action="reboot")
    auto.on_report("gpu-001", Severity.FAIL, [xid], clock.time())
    assert client.states["gpu-001"].reason == says
    assert [c[0] for c in client.calls] == (["reboot"] if allowed else ["drain"])
