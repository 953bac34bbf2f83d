"""``Actions.reboot``: the drain rules, applied to ``scontrol reboot ASAP nextstate=RESUME``
(FakeSlurmClient; the client's argv and the real cluster are in test_slurm_client.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurmgpu.actions import Actions
from slurmgpu.slurm import SlurmError, SlurmUnreachable
from slurmgpu.testing import FakeSlurmClient


def make(tmp_path: Path, nodes: list[str] | None = None) -> tuple[Actions, FakeSlurmClient]:
    client = FakeSlurmClient(nodes or ["gpu-n1", "gpu-n2"])
    return Actions(client, tmp_path), client


def test_reboot_idle_node(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    result = actions.reboot("gpu-n1", "xid 79 GPU 2 fell off the bus")
    assert (result.action, result.reason) == ("reboot-requested", "slurmgpu: xid 79 GPU 2 fell off the bus")
    assert result.changed
    assert client.calls == [("reboot", "gpu-n1", "slurmgpu: xid 79 GPU 2 fell off the bus")]
    st = client.states["gpu-n1"]
    assert st.drained and st.rebooting and st.owned_by_slurmgpu
    assert st.flags == frozenset({"DRAIN", "REBOOT_REQUESTED"})


def test_reboot_keeps_prefix_once(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    assert actions.reboot("gpu-n1", "slurmgpu: gpu.lost  GPU 3\n").reason == "slurmgpu: gpu.lost GPU 3"
    assert client.calls == [("reboot", "gpu-n1", "slurmgpu: gpu.lost GPU 3")]


def test_reboot_keeps_operator_drain(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    client.states["gpu-n1"] = dataclasses.replace(
        client.states["gpu-n1"], flags=frozenset({"DRAIN"}), reason="alice: swapping PSU")
    result = actions.reboot("gpu-n1", "gpu.lost")
    assert (result.action, result.reason) == ("operator-drain-kept", "alice: swapping PSU")
    assert not result.changed and client.calls == []
    assert client.states["gpu-n1"].reason == "alice: swapping PSU"


def test_reboot_operator_drain_wins_over_operator_reboot(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    client.states["gpu-n1"] = dataclasses.replace(
        client.states["gpu-n1"], flags=frozenset({"DRAIN", "REBOOT_REQUESTED"}), reason="bob: firmware")
    assert actions.reboot("gpu-n1", "x").action == "operator-drain-kept"
    assert client.calls == []


@pytest.mark.parametrize("flags", [{"REBOOT_REQUESTED"}, {"DRAIN", "REBOOT_ISSUED"}])
def test_reboot_already_rebooting(tmp_path: Path, flags: set[str]) -> None:
    actions, client = make(tmp_path)
    client.states["gpu-n1"] = dataclasses.replace(
        client.states["gpu-n1"], flags=frozenset(flags), reason="slurmgpu: earlier : reboot issued")
    result = actions.reboot("gpu-n1", "again")
    assert (result.action, result.reason) == ("already-rebooting", "slurmgpu: earlier : reboot issued")
    assert not result.changed and client.calls == []


def test_reboot_twice_is_already_rebooting(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    assert actions.reboot("gpu-n1", "one").action == "reboot-requested"
    assert actions.reboot("gpu-n1", "two").action == "already-rebooting"
    assert [c[0] for c in client.calls] == ["reboot"]


def test_reboot_upgrades_a_slurmgpu_drain(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    assert actions.drain("gpu-n1", "ecc.uncorrected GPU 0").action == "drained"
    result = actions.reboot("gpu-n1", "xid.recent GPU 0 Xid 79")
    assert result.action == "reboot-requested"
    assert client.calls[-1] == ("reboot", "gpu-n1", "slurmgpu: xid.recent GPU 0 Xid 79")
    assert client.states["gpu-n1"].rebooting
    # A drain of a node slurmgpu is rebooting is "already-drained": nothing overrides it.
    assert actions.drain("gpu-n1", "other").action == "already-drained"
    # ...and the resume paths leave it alone.
    assert actions.resume("gpu-n1").action == "rebooting-left-alone"


def test_reboot_unknown_node_raises_and_journals_nothing(tmp_path: Path) -> None:
    actions, _ = make(tmp_path)
    with pytest.raises(SlurmError, match="no such node"):
        actions.reboot("gpu-nX", "x")
    assert not actions.journal.exists()


def test_reboot_refused_propagates_not_journaled(tmp_path: Path) -> None:
    actions, client = make(tmp_path)

    def refuse(node: str, reason: str) -> None:
        raise SlurmError("cannot reboot gpu-n1: Slurm has no RebootProgram configured")

    client.reboot = refuse  # type: ignore[method-assign]
    with pytest.raises(SlurmError, match="RebootProgram"):
        actions.reboot("gpu-n1", "x")
    assert not actions.journal.exists()


def test_unreachable_reboot_is_journaled_and_replayed_as_reboot(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    client.unreachable = True
    with pytest.raises(SlurmUnreachable):
        actions.reboot("gpu-n1", "gpu.lost GPU 3")
    with pytest.raises(SlurmUnreachable):
        actions.drain("gpu-n2", "ecc GPU 1")
    entries = [json.loads(line) for line in actions.journal.read_text().splitlines()]
    assert [(e["action"], e["node"], e["reason"]) for e in entries] == [
        ("reboot", "gpu-n1", "slurmgpu: gpu.lost GPU 3"),
        ("drain", "gpu-n2", "slurmgpu: ecc GPU 1"),
    ]

    # Still unreachable: both kept, once each.
    assert actions.replay_pending() == []
    assert len(actions.journal.read_text().splitlines()) == 2

    client.unreachable = False
    results = actions.replay_pending()
    assert [(r.node, r.action) for r in results] == [("gpu-n1", "reboot-requested"),
                                                     ("gpu-n2", "drained")]
    assert client.calls == [("reboot", "gpu-n1", "slurmgpu: gpu.lost GPU 3"),
                            ("drain", "gpu-n2", "slurmgpu: ecc GPU 1")]
    assert not actions.journal.exists()


def test_replay_old_entries_without_action_are_drains(tmp_path: Path) -> None:
    actions, client = make(tmp_path)
    actions.journal.write_text(json.dumps({"node": "gpu-n1", "reason": "slurmgpu: old", "time": 1.0}) + "\n")
    [result] = actions.replay_pending()
    assert result.action == "drained" and client.calls == [("drain", "gpu-n1", "slurmgpu: old")]


def test_replayed_reboot_respects_rules(tmp_path: Path) -> None:
    """An operator drained the node while slurmctld was away: the journaled reboot yields."""
    actions, client = make(tmp_path)
    client.unreachable = True
    with pytest.raises(SlurmUnreachable):
        actions.reboot("gpu-n1", "gpu.lost")
    client.unreachable = False
    client.states["gpu-n1"] = dataclasses.replace(
        client.states["gpu-n1"], flags=frozenset({"DRAIN"}), reason="carol: RMA")
    [result] = actions.replay_pending()
    assert result.action == "operator-drain-kept" and client.calls == []
    assert not actions.journal.exists()


def test_actor_tag_fits_and_is_kept() -> None:
    from slurmgpu.actions import MAX_REASON, with_actor
    from slurmgpu.slurm import reason_actor

    client = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3"])
    actions = Actions(client, "/nonexistent")  # (journal only when Slurm is unreachable)
    long = "ecc.uncorrected GPU 0 " + "x" * 400
    result = actions.drain("gpu-n1", long, actor="epilog")
    assert len(result.reason or "") == MAX_REASON and (result.reason or "").endswith("… [by epilog]")
    assert reason_actor(result.reason) == ("epilog", None)
    # no actor (the automation's drains): the reason as before
    assert actions.drain("gpu-n2", "gpu.lost GPU 1").reason == "slurmgpu: gpu.lost GPU 1"
    # a reason that already names its actor keeps it (a journaled drain replayed later)
    assert with_actor("slurmgpu: a [by prolog]", "healthcheck") == "slurmgpu: a [by prolog]"
    assert actions.drain("gpu-n3", "maint", actor="operator", user="al ice").reason == \
        "slurmgpu: maint [by operator]"  # not a login: left out


def test_journaled_hook_drain_keeps_its_actor_when_replayed(tmp_path: Path) -> None:
    client = FakeSlurmClient(["gpu-n1"])
    client.unreachable = True
    actions = Actions(client, tmp_path)
    with pytest.raises(SlurmUnreachable):
        actions.drain("gpu-n1", "gpu.lost GPU 3", actor="prolog")
    client.unreachable = False
    [result] = actions.replay_pending()  # by a later healthcheck, say
    assert result.action == "drained"
    assert client.states["gpu-n1"].reason == "slurmgpu: gpu.lost GPU 3 [by prolog]"


def test_tagged_reason_reads_back_from_scontrol_text() -> None:
    """`scontrol -o show node` ends the reason with ``[user@time]``: the actor tag before it
    is still the reason's (and found after Slurm's `` : reboot issued``)."""
    from slurmgpu.slurm import reason_actor
    from slurmgpu.slurm.cli import parse_node_text

    n = parse_node_text("NodeName=gpu-n1 State=IDLE+DRAIN ThreadsPerCore=1 Reason=slurmgpu: gpu.lost "
                        "GPU 3 lost [by prolog] [root@2026-11-26T02:20:07] Comment=(null)")
    assert (n.reason, n.reason_user, n.owned_by_slurmgpu) == (
        "slurmgpu: gpu.lost GPU 3 lost [by prolog]", "root", True)
    assert reason_actor(n.reason) == ("prolog", None)
    n = parse_node_text("NodeName=gpu-n1 State=IDLE+DRAIN Reason=slurmgpu: a [by operator alice] : "
                        "reboot issued [root@2026-11-26T02:20:07]")
    assert reason_actor(n.reason) == ("operator", "alice")
    assert reason_actor("maint [by operator bob]") is None  # not slurmgpu's: no actor
