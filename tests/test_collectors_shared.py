"""Issue 15: two or more collectors on one PostgreSQL database. Ingest is active/active
and deduplicated across collectors; one collector (the advisory-lock leader) runs the
automation and the checkpoint coordination, for every collector's messages (the leader's
inbox), and reaches agents connected elsewhere (the command outbox). The leader killed
mid-checkpoint: the other takes over, the checkpoint completes, nothing is stored twice,
no node is drained twice."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from slurmgpu import keys
from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.store import coordination as tables
from slurmgpu.wire import (
    ACK,
    COMMAND,
    COMMAND_RESULT,
    EVENT,
    HEARTBEAT,
    REPORT,
    Envelope,
    decode,
    encode,
)
from tests.agenthelpers import free_port, wait_until
from tests.sharedslurm import FileSlurmClient

pytestmark = pytest.mark.postgresql

REPO = Path(__file__).resolve().parent.parent
XID79 = [{"check": "xid.recent", "severity": "FAIL", "gpu": 3, "subject": None,
          "message": "XID 79 GPU has fallen off the bus", "not_applicable": False,
          "data": {"xid": 79, "action": "reset"}}]
# Generous breaker limits: the breaker is not what these tests are about.
AUTOMATION = {"enabled": True, "max_fraction": 1.0, "max_per_hour": 100, "storm_fraction": 1.0,
              "checkpoint_deadline_s": 300.0}


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with queries.snapshot(url) as db:
        return [tuple(r) for r in db.execute(sql, params).fetchall()]


def item(node: str, seq: int, mtype: str = EVENT, epoch: str = "e1") -> tuple[str, Envelope]:
    body: dict[str, Any] = {"verdict": "OK", "findings": []}
    if mtype == EVENT:
        body.update(kind="xid", gpu=0, data=13)
    return node, Envelope(type=mtype, node=node, seq=seq, body=body, epoch=epoch, ts=1000.0 + seq)


# --------------------------------------------------------------------------- the store


def test_dedupe_holds_across_collectors(pg_url: str) -> None:
    """Collector B's memory says n1's spool reached seq 1; collector A stored 2..5 since
    (the agent failed over and back). B gets 3..7 resent: 6 and 7 are new, 3..5 are
    duplicates (acked, not stored again): no constraint error, no rejection."""
    a, b = Store(pg_url), Store(pg_url)
    try:
        assert b.store_batch([item("n1", 1)]) == [("n1", 1)]
        assert a.store_batch([item("n1", s) for s in range(2, 6)]) == [("n1", s) for s in range(2, 6)]
        assert b.store_batch([item("n1", s) for s in range(3, 8)]) == [("n1", 6), ("n1", 7)]
        assert b.conflicts == []
        assert rows(pg_url, "SELECT count(*) FROM events WHERE node = 'n1'") == [(7,)]
        assert rows(pg_url, "SELECT count(*) FROM messages WHERE node = 'n1'") == [(7,)]
        # the same key with another body is still a conflict, across collectors too
        node, env = item("n1", 4)
        env.body["data"] = 99
        assert a.store_batch([(node, env)]) == [] and [c.seq for c in a.conflicts] == [4]
    finally:
        a.close()
        b.close()


class PausedBatch:
    """``store.store_batch(batch)`` in a thread, held after its last statement, before its
    COMMIT, until ``release()`` (or ``fail()``: it rolls back)."""

    def __init__(self, store: Store, batch: list[tuple[str, Envelope]]) -> None:
        self.store, self.at_commit, self.go = store, threading.Event(), threading.Event()
        self.failing = False
        self.result: list[tuple[str, int]] | BaseException | None = None
        insert = store._insert

        def held(*args: Any) -> None:
            insert(*args)
            self.at_commit.set()
            assert self.go.wait(30)
            if self.failing:
                raise RuntimeError("rolled back")

        store._insert = held  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, args=(batch,), daemon=True)
        self.thread.start()
        assert self.at_commit.wait(30), "the batch did not reach its COMMIT"

    def _run(self, batch: list[tuple[str, Envelope]]) -> None:
        try:
            self.result = self.store.store_batch(batch)
        except BaseException as exc:  # (the test reads it)
            self.result = exc

    def release(self, *, fail: bool = False) -> Any:
        self.failing = fail
        self.go.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.result


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def test_batches_of_two_collectors_commit_side_by_side(pg_url: str) -> None:
    """An ingest batch does not wait for another collector's batch in flight (they take the
    write lock shared), but does for an exclusive writer (an operator's breaker release,
    the automation's save), as that one waits for them."""
    a, b, holder = Store(pg_url), Store(pg_url, timeout_s=0.5), Store(pg_url)
    try:
        paused = PausedBatch(a, [item("n1", s) for s in range(1, 4)])
        # (b's lock timeout is 0.5 s: waiting for a's batch would raise, not return)
        assert b.store_batch([item("n2", 1)]) == [("n2", 1)]
        assert paused.release() == [("n1", 1), ("n1", 2), ("n1", 3)]
        with holder.transaction():
            holder.add_job_event("7", 1.0, "detected")
            with pytest.raises(sqlite3.OperationalError):
                b.store_batch([item("n2", 2)])
        assert b.store_batch([item("n2", 2)]) == [("n2", 2)]
        assert rows(pg_url, "SELECT node, count(*) FROM messages GROUP BY node ORDER BY node") == [
            ("n1", 3), ("n2", 2)]
    finally:
        for store in (a, b, holder):
            store.close()


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_key_in_another_collectors_batch_in_flight(pg_url: str, first_commits: bool) -> None:
    """An agent failed over and resent seq 2 to collector B while A's batch holding it is
    not committed yet: B's batch waits for A's. A committed: B stores only seq 3, seq 2 is
    a duplicate (no constraint error, no conflict); A rolled back: B stores both."""
    a, b = Store(pg_url), Store(pg_url)
    try:
        paused = PausedBatch(a, [item("n1", 1), item("n1", 2)])
        thread, out = in_thread(lambda: b.store_batch([item("n1", 2), item("n1", 3)]))
        thread.join(0.3)
        assert thread.is_alive(), "B did not wait for A's batch"
        assert paused.release(fail=not first_commits) == ([("n1", 1), ("n1", 2)] if first_commits
                                                          else paused.result)
        thread.join(30)
        assert out == [[("n1", 3)] if first_commits else [("n1", 2), ("n1", 3)]]
        assert b.conflicts == []
        stored = [1, 2, 3] if first_commits else [2, 3]
        assert rows(pg_url, "SELECT seq FROM messages ORDER BY seq") == [(s,) for s in stored]
        assert rows(pg_url, "SELECT seq FROM events ORDER BY seq") == [(s,) for s in stored]
    finally:
        a.close()
        b.close()


def test_the_inbox_gets_what_the_automation_needs_in_commit_order(pg_url: str) -> None:
    a, b = Store(pg_url), Store(pg_url)
    a.inbox = b.inbox = True
    try:
        report = Envelope(type=REPORT, node="n1", seq=1, epoch="e", body={
            "verdict": "FAIL", "findings": XID79, "facts": {"gpus": ["x" * 1000]}})
        a.store_batch([("n1", report)])
        b.store_batch([item("n2", 1), item("n1", 1, mtype=EVENT, epoch="e")])  # (a duplicate key: not again)
        got = tables.inbox_take(a.db, 10)
        assert [(r.node, r.seq, r.type) for r in got] == [("n1", 1, REPORT), ("n2", 1, EVENT)]
        assert got[0].body == {"verdict": "FAIL", "findings": XID79}  # not the facts
        assert got[1].body["kind"] == "xid"
        tables.inbox_done(a.db, [got[0].id])
        assert [r.node for r in tables.inbox_take(b.db, 10)] == ["n2"]
    finally:
        a.close()
        b.close()


def test_an_inbox_row_committed_late_is_taken_next_time(pg_url: str) -> None:
    """A's batch drew its inbox row's id first and commits after B's: the leader takes B's
    row, deletes it (after A committed), and takes A's at its next turn (deleting ``id <=
    last taken`` would have dropped A's unseen)."""
    a, b = Store(pg_url), Store(pg_url)
    a.inbox = b.inbox = True
    try:
        paused = PausedBatch(a, [item("n1", 1)])
        b.store_batch([item("n2", 1)])
        first = tables.inbox_take(b.db, 10)
        assert [r.node for r in first] == ["n2"]
        paused.release()  # (the deletion's exclusive lock waits for A's batch anyway)
        tables.inbox_done(b.db, [r.id for r in first])
        late = tables.inbox_take(b.db, 10)
        assert [r.node for r in late] == ["n1"] and late[0].id < first[0].id
        tables.inbox_done(b.db, [r.id for r in late])
        assert b.count("leader_inbox") == 0
    finally:
        a.close()
        b.close()


def test_a_store_without_automation_writes_no_inbox(tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    try:
        assert not store.shared
        store.store_batch([item("n1", 1)])
        assert store.count("leader_inbox") == 0
    finally:
        store.close()


# --------------------------------------------------------------------------- the processes


class Agent:
    """A test agent with a list of collectors: a DEALER to one of them; ``fail_over``
    connects to the next and resends everything not acked (as the agent's spool does)."""

    def __init__(self, ctx: zmq.Context[Any], keys_dir: Path, node: str, addresses: list[str],
                 first: int) -> None:
        self.ctx, self.node, self.addresses, self.at = ctx, node, addresses, first
        self.keys = keys.client_keys(keys_dir / "bundles" / node)
        self.epoch = uuid.uuid4().hex[:8]
        self.seq = 0
        self.unacked: dict[int, bytes] = {}
        self.commands: list[Envelope] = []
        self.sent: list[tuple[str, int]] = []  # (type, seq) of every message sent
        self.resent_at = time.monotonic()
        self.sock = self._connect()

    def _connect(self) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = self.keys
        sock.connect(self.addresses[self.at])
        return sock

    def send(self, mtype: str, body: dict[str, Any]) -> int:
        self.seq += 1
        frame = encode(Envelope(type=mtype, node=self.node, seq=self.seq, body=body, epoch=self.epoch))
        self.unacked[self.seq] = frame
        self.sent.append((mtype, self.seq))
        self.sock.send(frame)
        return self.seq

    def report(self, findings: list[dict[str, Any]] | None = None) -> int:
        return self.send(REPORT, {"verdict": "FAIL" if findings else "OK", "findings": findings or [],
                                  "facts": {}})

    def event(self) -> int:
        return self.send(EVENT, {"verdict": "OK", "findings": [], "kind": "xid", "gpu": 0, "data": 13})

    def result(self, command: Envelope, state: str) -> int:
        job = command.body["args"]["job_id"]
        return self.send(COMMAND_RESULT, {"command_id": command.id, "ok": True,
                                          "result": {"job_id": job, "state": state, "acked_at": time.time()}})

    def pump(self) -> None:
        """Read whatever arrived: acks and commands."""
        while self.sock.poll(0):
            env = decode(self.sock.recv())
            if env.type == ACK and env.epoch in ("", self.epoch):
                for seq in env.body["seqs"]:
                    self.unacked.pop(seq, None)
            elif env.type == COMMAND:
                self.commands.append(env)
            elif env.type not in (ACK, HEARTBEAT):
                raise AssertionError(f"unexpected {env.type}")

    def resend_unacked(self, every_s: float = 1.0) -> None:
        """Read what arrived, and send again what is still unacked every ``every_s`` (as the
        agent's spool does: a collector whose store failed acks nothing)."""
        self.pump()
        if self.unacked and time.monotonic() - self.resent_at >= every_s:
            self.resent_at = time.monotonic()
            for frame in self.unacked.values():
                self.sock.send(frame)

    def fail_over(self) -> None:
        self.sock.close(0)
        self.at = (self.at + 1) % len(self.addresses)
        self.sock = self._connect()
        for frame in self.unacked.values():
            self.sock.send(frame)


class CollectorProcess:
    """``python -m tests.sharedslurm SPEC``: a collector as its own process, logging JSON."""

    def __init__(self, tmp: Path, name: str, spec: dict[str, Any]) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        spec_path = tmp / f"{name}.json"
        spec_path.write_text(json.dumps(spec))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.sharedslurm", str(spec_path)],
                                     stdout=self.log_path.open("w"), stderr=subprocess.STDOUT, cwd=REPO)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def said(self, event: str) -> bool:
        return any(e.get("event") == event for e in self.events())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


NODES = [f"n{i:02d}" for i in range(50)]
VICTIM = "n01"  # connected to the follower: its fault reaches the leader through the inbox


def test_leader_killed_mid_checkpoint(tmp_path: Path, pg_url: str, ctx: zmq.Context[Any]) -> None:
    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    for node in NODES:
        keys.add_node(keys_dir, node)
    slurm = FileSlurmClient.create(tmp_path / "slurm.pickle", NODES)
    Store(pg_url).close()  # migrated once, before either starts
    ports = [free_port(), free_port()]
    addresses = [f"tcp://127.0.0.1:{p}" for p in ports]

    def start(name: str, port: int) -> CollectorProcess:
        return CollectorProcess(tmp_path, name, {
            "collector": {"address": f"tcp://127.0.0.1:{port}", "bind": f"tcp://127.0.0.1:{port}",
                          "db": pg_url, "keys_dir": str(keys_dir), "heartbeat_s": 1.0,
                          "leader_timeout_s": 3.0, "slurm_poll_s": 0},
            "automation": AUTOMATION, "slurm": str(slurm.path), "state_dir": str(tmp_path / f"state-{name}")})

    leader = start("a", ports[0])
    follower = None
    agents: list[Agent] = []
    try:
        wait_until(lambda: leader.said("leader_elected"), 30, "collector a leads")
        follower = start("b", ports[1])
        wait_until(lambda: follower.said("collector_listening"), 30, "collector b listens")
        agents = [Agent(ctx, keys_dir, n, addresses, first=i % 2) for i, n in enumerate(NODES)]
        by_node = {a.node: a for a in agents}
        victim = by_node[VICTIM]

        def settled(group: list[Agent]) -> bool:
            for agent in group:
                agent.pump()
            return all(not a.unacked for a in group)

        for agent in agents:
            agent.report()
        wait_until(lambda: settled(agents), 30, "every first report acked")

        # A job on the victim, then a drain-now fault: the leader (a) learns of it through
        # the inbox, signals the job and asks the victim's agent, connected to b, to
        # checkpoint (through the outbox).
        slurm.add_job("77", [VICTIM], user="alice")
        victim.report(XID79)
        wait_until(lambda: settled([victim]) and victim.commands, 30, "the checkpoint command reached n01")
        [command] = victim.commands
        assert command.body["command"] == "checkpoint" and command.body["args"]["job_id"] == "77"
        victim.result(command, "delivered")
        assert [c[0] for c in slurm.snapshot().calls] == ["signal"]

        # Agents on a send an event each; a stores them, and is killed before they read
        # its acks. Those on b send one too.
        on_a = [a for a in agents if a.at == 0]
        for agent in agents:
            agent.event()
        wait_until(lambda: rows(pg_url, "SELECT count(*) FROM events")[0][0] == len(agents),
                   30, "every event stored")
        wait_until(lambda: settled([victim]), 30, "the delivery result acked")
        leader.proc.kill()  # kill -9, mid-checkpoint: requested, delivered, not acked
        killed = time.monotonic()
        leader.proc.wait(10)
        for agent in on_a:
            agent.fail_over()  # resend to b: the events a stored are duplicates now
        wait_until(lambda: follower.said("leader_elected"), 30, "b takes over")
        took_over_s = time.monotonic() - killed
        assert took_over_s <= 3.0 + 10.0, took_over_s  # leader_timeout_s, plus slack for a loaded machine

        # The job acks (to b, the new leader): the checkpoint completes, the node drains once.
        victim.result(command, "acked")
        for agent in agents:
            agent.event()
        wait_until(lambda: settled(agents), 30, "everything acked by b")
        wait_until(lambda: any(c[0] == "drain" for c in slurm.snapshot().calls), 30, "n01 drained")
        time.sleep(1.0)  # (a second drain would come within a loop turn or two)
        calls = slurm.snapshot().calls
        assert [c[:2] for c in calls if c[0] == "drain"] == [("drain", VICTIM)]
        assert [c[:2] for c in calls if c[0] in ("signal", "requeue")] == [("signal", "77"), ("requeue", "77")]
        kinds = [k for (k,) in rows(pg_url, "SELECT kind FROM job_events WHERE job_id = '77' ORDER BY ts, id")]
        assert kinds == ["detected", "signalled", "delivered", "acked", "drained", "requeued"]

        # Every message once: each sent (node, epoch, seq) stored exactly once.
        stored = rows(pg_url, "SELECT node, epoch, seq, count(*) FROM messages GROUP BY node, epoch, seq")
        assert {(n, e, s) for n, e, s, _ in stored} == {(a.node, a.epoch, s) for a in agents for _, s in a.sent}
        assert all(c == 1 for *_, c in stored)
        events = rows(pg_url, "SELECT node, seq, count(*) FROM events GROUP BY node, seq")
        assert sorted((n, s) for n, s, _ in events) == sorted(
            (a.node, s) for a in agents for t, s in a.sent if t == EVENT)
        assert all(c == 1 for *_, c in events)
        assert rows(pg_url, "SELECT count(*) FROM leader_inbox") == [(0,)]
        outbox = rows(pg_url, "SELECT node, sent_by IS NOT NULL FROM command_outbox")
        assert outbox == [(VICTIM, True)]
    finally:
        for agent in agents:
            agent.sock.close(0)
        leader.stop()
        if follower is not None:
            follower.stop()


def test_a_stopped_leader_is_replaced_and_makes_no_slurm_call_when_continued(
        tmp_path: Path, pg_url: str, ctx: zmq.Context[Any]) -> None:
    """Issue 28 item 7: the leading collector process SIGSTOPped (its session and TCP
    keepalives live on): the other ends its session once its lease (leader_timeout_s,
    3 s) ran out and leads; the old leader, SIGCONTed, leads no more and makes no Slurm
    call, while a FAIL report it stores is drained by the new leader."""
    nodes = ["n00", "n01"]
    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    for node in nodes:
        keys.add_node(keys_dir, node)
    slurm = FileSlurmClient.create(tmp_path / "slurm.pickle", nodes)
    Store(pg_url).close()
    ports = [free_port(), free_port()]
    addresses = [f"tcp://127.0.0.1:{p}" for p in ports]

    def start(i: int, name: str) -> CollectorProcess:
        return CollectorProcess(tmp_path, name, {
            "collector": {"address": addresses[i], "bind": addresses[i], "db": pg_url, "keys_dir": str(keys_dir),
                          "heartbeat_s": 1.0, "leader_timeout_s": 3.0, "slurm_poll_s": 0},
            "automation": AUTOMATION, "slurm": str(slurm.path), "state_dir": str(tmp_path / f"state-{name}")})

    collectors = [start(0, "a")]
    old = collectors[0]
    agent = None
    try:
        wait_until(lambda: old.said("leader_elected"), 30, "a leads")
        collectors.append(start(1, "b"))
        new = collectors[1]
        wait_until(lambda: new.said("collector_listening"), 30, "b listens")
        agent = Agent(ctx, keys_dir, "n00", addresses, first=0)  # connected to a, the leader
        agent.report()
        wait_until(lambda: agent.pump() or not agent.unacked, 30, "a acks")
        old.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: new.said("leader_elected"), 3.0 + 10.0, "b takes over")  # (lease + slack)
        assert new.said("stale_leader_ended")
        old.proc.send_signal(signal.SIGCONT)
        agent.report(XID79)  # to a, which stores it; the leader (b) drains n00 from its inbox
        # (a's first store after its session was ended may fail: unacked, it comes again)
        wait_until(lambda: agent.resend_unacked() or any(c[0] == "drain" for c in slurm.snapshot().calls),
                   30, "n00 drained")
        wait_until(lambda: old.said("leader_lost"), 30, "a knows it does not lead")
        time.sleep(1.0)  # (a call of a's would come within a loop turn)
        snapshot = slurm.snapshot()
        assert [c[:2] for c in snapshot.calls] == [("drain", "n00")]
        assert snapshot.callers == [new.proc.pid]
    finally:
        if agent is not None:
            agent.sock.close(0)
        old.proc.send_signal(signal.SIGCONT)
        for collector in collectors:
            collector.stop()


def test_inbox_body_is_small(pg_url: str) -> None:
    """A report's inbox row carries its verdict and findings only: a 16 KB report costs the
    inbox a few dozen bytes."""
    store = Store(pg_url)
    store.inbox = True
    try:
        facts = {"gpus": [{"uuid": "GPU-" + "0" * 36, "serial": "1" * 13}] * 100}
        report = Envelope(type=REPORT, node="n1", seq=1, body={"verdict": "OK", "findings": [], "facts": facts})
        store.store_batch([("n1", report)])
        [(size,)] = rows(pg_url, "SELECT length(body) FROM leader_inbox")
        assert size < 40 and msgpack.packb({"verdict": "OK", "findings": []}) is not None
    finally:
        store.close()


def test_only_a_node_not_connected_here_goes_to_the_outbox(pg_url: str) -> None:
    """The leader's send queues a command for another collector only when the node is not
    connected here; any other failure (a bad command) is the caller's error, not queued."""
    from slurmgpu.collector.coordination import Coordination
    from slurmgpu.collector.store import Leadership
    from slurmgpu.collector.transport import CollectorError

    store = Store(pg_url)
    coordination = Coordination(store, Leadership(pg_url))
    try:
        def not_here(node: str, command: str, args: dict[str, Any], *, command_id: str) -> str:
            raise CollectorError(f"node {node} is not connected")

        def broken(node: str, command: str, args: dict[str, Any], *, command_id: str) -> str:
            raise ValueError("not a valid command")

        command_id = coordination.sender(not_here)("n1", "checkpoint", {"job_id": "7"})
        assert rows(pg_url, "SELECT node, command_id FROM command_outbox") == [("n1", command_id)]
        with pytest.raises(ValueError):
            coordination.sender(broken)("n2", "checkpoint", {"job_id": "8"})
        assert rows(pg_url, "SELECT count(*) FROM command_outbox") == [(1,)]
    finally:
        coordination.close()
        store.close()
