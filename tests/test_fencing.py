"""Issue 15, several collectors: fencing the leader's Slurm calls. A leader polls its lock
every second; one cut off since its last poll would still drain, resume or signal on
stale state. ``FencedSlurm`` checks the lock (one query) right before each call that
changes Slurm, so such a leader does not act: the decision says why, and the new leader
decides from the stored state."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.collector.coordination import Coordination, FencedSlurm, NotLeader
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.result import Severity
from slurmgpu.testing import FakeClock, FakeSlurmClient
from tests.test_automation import FAIL, NODES


class Lock:
    """Stands in for ``Leadership``: what each poll answers (``held``), and how many."""

    def __init__(self) -> None:
        self.held = True
        self.leader = False  # (as a shared database's: not leading before the first poll)
        self.polls = 0
        self.ended: int | None = None  # (a stale leader's session ended by a poll: none here)

    def poll(self) -> bool:
        self.polls += 1
        return self.held

    def release(self) -> None:
        self.held = False


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Coordination, Lock, FakeSlurmClient, Store]]:
    lock = Lock()
    with contextlib.closing(Store(tmp_path / "fleet.db")) as store:
        coordination = Coordination(store, lock)  # type: ignore[arg-type]
        assert coordination.leading() == (True, True)
        yield coordination, lock, FakeSlurmClient(NODES[:10]), store


def test_changes_are_fenced_reads_are_not(parts: tuple[Coordination, Lock, FakeSlurmClient, Store]) -> None:
    coordination, lock, client, _ = parts
    fenced = FencedSlurm(client, coordination)
    fenced.drain(NODES[0], "slurmgpu: test")
    assert client.calls == [("drain", NODES[0], "slurmgpu: test")] and lock.polls == 2  # one check per change
    lock.held = False  # the session was lost since the last poll
    assert fenced.node(NODES[1]).name == NODES[1]  # reads pass, unchecked
    for call, args in (("drain", (NODES[1], "r")), ("resume", (NODES[0],)), ("reboot", (NODES[1], "r")),
                       ("signal_job", ("17",)), ("requeue", ("17",))):
        with pytest.raises(NotLeader, match=f"not the leader any more: {call} {args[0]}"):
            getattr(fenced, call)(*args)
    assert client.calls == [("drain", NODES[0], "slurmgpu: test")]
    assert not coordination.leader


def test_a_fresh_check_never_takes_the_lead(parts: tuple[Coordination, Lock, FakeSlurmClient, Store]) -> None:
    """Leading again is ``leading``'s, which reports it as new (the state is read back)."""
    coordination, lock, _, _ = parts
    lock.held = False
    assert not coordination.still_leading()
    lock.held = True
    assert not coordination.still_leading() and not coordination.leader
    coordination._next_poll = 0.0
    assert coordination.leading() == (True, True)


def test_a_cut_off_leader_decides_but_does_not_drain(
        tmp_path: Path, parts: tuple[Coordination, Lock, FakeSlurmClient, Store]) -> None:
    coordination, lock, client, store = parts
    clock = FakeClock()
    auto = Automation(AutomationSettings(), FencedSlurm(client, coordination),  # type: ignore[arg-type]
                      tmp_path / "state", clock, store=store)
    auto.fleet_size(10)
    lock.held = False
    [decision] = auto.on_report(NODES[2], Severity.FAIL, FAIL, clock.time())
    assert decision.action == "drain" and decision.result.startswith("error: not the leader any more: drain")
    assert client.calls == []
    assert NODES[2] not in auto.status()["drained"]  # the new leader drains it from the stored state
