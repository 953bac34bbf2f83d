"""When a drained node comes back (issue 29 item 5): `slurmgpu fleet` and `slurmgpu nodes`
say "auto-resume after HH:MM (resume_after_s)" or "stays drained: <why>; `slurmgpu resume NODE`"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmgpu.cli import fleet_cmd, slurm_cmds
from slurmgpu.cli.outlook import Resumers, outlook, slurm_healthcheck
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings, Settings
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import NodeState
from slurmgpu.testing import FakeClock, FakeSlurmClient

DRAIN = frozenset({"DRAIN"})


def drained(name: str, reason: str) -> NodeState:
    return NodeState(name, "idle", DRAIN, reason)


def hooks(interval: int | None, **automation: Any) -> Resumers:
    return Resumers(Settings(), automation or None, interval, True, "/etc/slurm/slurm.conf")


@pytest.mark.parametrize(("node", "resumers", "says"), [
    (NodeState("gpu-n1", "idle"), hooks(300), None),
    (drained("gpu-n3", "slurmgpu: pin.driver driver 535.104.05 is off-pin [by prolog]"), hooks(0),
     "stays drained: HealthCheckInterval=0 in /etc/slurm/slurm.conf: the healthcheck never runs to "
     "resume the prolog's drain; `slurmgpu resume gpu-n3`"),
    (drained("gpu-n3", "slurmgpu: pin.driver off-pin [by prolog]"), hooks(300),
     "auto-resume by the healthcheck once gpu-n3 checks OK (HealthCheckInterval = 300 s)"),
    (drained("gpu-n1", "slurmgpu: xid.recent GPU 0 XID 79 (needs a reboot)"), hooks(300),
     "stays drained: xid.recent drains wait for an admin to look; `slurmgpu resume gpu-n1`"),
    (drained("gpu-n4", "fan"), hooks(300), "stays drained: drained outside slurmgpu; `slurmgpu resume gpu-n4` "
     "(or `--force`)"),
    (drained("gpu-n2", "slurmgpu: mem.row_remap GPU 2 pending"), hooks(0, drained=["gpu-n2"]),
     "auto-resume 600 s after it reports OK again (resume_after_s = 600)"),
    (drained("gpu-n2", "slurmgpu: mem.row_remap GPU 2 pending"),
     hooks(0, drained=["gpu-n2"], lemons={"gpu-n2": {"why": "3 drains within 7 days"}}),
     "stays drained: a lemon (3 drains within 7 days); `slurmgpu lemon clear gpu-n2` first; "
     "`slurmgpu resume gpu-n2`"),
    (NodeState("gpu-n2", "idle", frozenset({"DRAIN", "REBOOT_REQUESTED"}), "slurmgpu: x"), hooks(0),
     "comes back after its reboot (nextstate=RESUME)"),
])
def test_outlook(node: NodeState, resumers: Resumers, says: str | None) -> None:
    assert outlook(node, resumers) == says


def test_auto_resume_names_the_time(tmp_path: Path) -> None:
    first = time.time()
    resumers = hooks(0, drained=["gpu-n2"], healthy={"gpu-n2": [1, first]})
    at = time.strftime("%H:%M", time.localtime(first + 600))
    assert outlook(drained("gpu-n2", "slurmgpu: mem.row_remap x"), resumers) == \
        f"auto-resume after {at} (resume_after_s = 600; 1 of 3 OK reports so far)"


def test_healthcheck_interval_from_slurm_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("HealthCheckProgram=/usr/libexec/slurmgpu/slurmgpu-healthcheck\nHealthCheckInterval=0\n")
    assert slurm_healthcheck({"SLURM_CONF": str(conf)}) == (0, True, str(conf))
    conf.write_text("ClusterName=x\n")
    assert slurm_healthcheck({"SLURM_CONF": str(conf)}) == (0, False, str(conf))


def test_fleet_says_when_each_drained_node_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3"])
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: client)
    conf = tmp_path / "slurm.conf"
    conf.write_text("HealthCheckProgram=/x/slurmgpu-healthcheck\nHealthCheckInterval=0\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    clock = FakeClock()
    store = Store(tmp_path / "fleet.db")
    auto = Automation(AutomationSettings(), client, tmp_path / "state", clock, store=store)
    auto.fleet_size(3)
    auto.on_report("gpu-n2", Severity.FAIL, [Finding("ecc.uncorrected", Severity.FAIL, "3 errors", gpu=0)],
                   clock.time())
    auto.on_report("gpu-n2", Severity.OK, [], clock.time())  # healthy again: the streak starts now
    store.close()
    client.drain("gpu-n3", "slurmgpu: pin.driver off-pin [by prolog]")
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{tmp_path / "fleet.db"}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    at = time.strftime("%H:%M", time.localtime(clock.time() + 600))
    assert f"gpu-n2: auto-resume after {at} (resume_after_s = 600; 1 of 3 OK reports so far)" in result.output
    assert (f"gpu-n3: stays drained: HealthCheckInterval=0 in {conf}: the healthcheck never runs to resume "
            "the prolog's drain; `slurmgpu resume gpu-n3`") in result.output
    result = CliRunner().invoke(slurm_cmds.nodes, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[lines.index(next(x for x in lines if x.startswith("gpu-n2 "))) + 1].strip() == \
        f"-> auto-resume after {at} (resume_after_s = 600; 1 of 3 OK reports so far)"
