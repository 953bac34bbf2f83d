"""The fleet end to end on a real Slurm mini-cluster: 2 nodes x 8 simulated GPUs, one
`slurmgpu agent` per node and one collector (the ``fleet`` fixture). Run with `pytest -m slurm`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from slurmgpu import wire
from slurmgpu.sim.cluster import SimCluster
from slurmgpu.sim.scenario import load_scenario
from tests.agenthelpers import query_db, spool_rows, wait_until

pytestmark = pytest.mark.slurm




def query(fleet: SimCluster, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return query_db(fleet.collector_db(), sql, *params)


def records(fleet: SimCluster, node: str) -> list[dict[str, Any]]:
    path = fleet.state_dir(node) / "gate.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def node_line(fleet: SimCluster, node: str) -> str:
    return fleet.scontrol("show", "node", "-o", node)


def spool_messages(fleet: SimCluster, node: str) -> list[tuple[float, wire.Envelope]]:
    """(when it was spooled, the message) for each message in the node's agent spool: what
    the collector has not acked yet."""
    rows = query_db(fleet.agent_spool(node) / "spool.db", "SELECT created, frame FROM messages ORDER BY seq")
    return [(created, wire.decode(frame)) for created, frame in rows]


def spooled_xids(fleet: SimCluster, node: str) -> set[tuple[int, int]]:
    """(GPU, XID) of each XID event in the node's agent spool."""
    return {(env.body.get("gpu"), env.body.get("data")) for _, env in spool_messages(fleet, node)
            if env.type == wire.EVENT and env.body.get("kind") == "xid"}


def test_xid_reaches_the_collector_db_within_2s(fleet: SimCluster) -> None:
    start = time.time()
    fleet.inject_xid("gpu-n2", 3, 79)
    rows = wait_until(lambda: query(fleet, "SELECT kind, gpu, data, verdict FROM events "
                                  "WHERE node = 'gpu-n2' AND ts >= ?", start),
                    timeout=2, what="the XID event row", interval=0.01)
    assert rows[0] == ("xid", 3, 79, "FAIL")


def test_prolog_takes_the_agent_path_and_falls_back_without_it(fleet: SimCluster) -> None:
    job = fleet.sbatch("", "--gres=gpu:2", "-w", "gpu-n1", "--wrap", "echo gpus=$CUDA_VISIBLE_DEVICES")
    assert fleet.wait_job(job) == "COMPLETED"
    assert "gpus=0,1" in fleet.job_output(job)
    prolog = [r for r in records(fleet, "gpu-n1") if r["phase"] == "prolog" and r["job"] == job]
    assert prolog and prolog[-1]["path"] == "agent" and prolog[-1]["verdict"] == "OK"

    fleet.kill_agent("gpu-n1")
    assert not fleet.agent_status("gpu-n1")["ok"]
    job2 = fleet.sbatch("", "--gres=gpu:2", "-w", "gpu-n1", "--wrap", "true")
    assert fleet.wait_job(job2) == "COMPLETED"
    prolog = [r for r in records(fleet, "gpu-n1") if r["phase"] == "prolog" and r["job"] == job2]
    assert prolog and prolog[-1].get("path") != "agent" and prolog[-1]["verdict"] == "OK"


def test_lost_gpu_drains_through_the_agent_and_requeues(fleet: SimCluster) -> None:
    data = load_scenario("h100-sxm-8")
    for gpu in data["gpus"]:
        gpu["lost"] = True
    fleet.inject("gpu-n1", data)
    wait_until(lambda: fleet.agent_status("gpu-n1").get("verdict") == "FAIL", 30,
             "the agent to see the lost GPUs")
    job = fleet.sbatch("", "--gres=gpu:2", "-w", "gpu-n1", "--wrap", "true")
    wait_until(lambda: "DRAIN" in node_line(fleet, "gpu-n1"), 60, "gpu-n1 drained")
    assert "Reason=slurmgpu: gpu.lost GPU 0" in node_line(fleet, "gpu-n1")
    prolog = wait_until(lambda: [r for r in records(fleet, "gpu-n1")
                               if r["phase"] == "prolog" and r["job"] == job], 30, "gate record")
    assert prolog[-1]["path"] == "agent" and prolog[-1]["verdict"] == "FAIL"
    # Requeued (not failed), and pending: its only allowed node is drained.
    wait_until(lambda: fleet.job(job)["JobState"] == "PENDING", 60, "job requeued")
    assert int(fleet.job(job).get("Restarts", "0")) >= 1


def test_spooled_messages_survive_kill_9_and_arrive_once(fleet: SimCluster) -> None:
    node = "gpu-n2"
    collector = fleet.collector_pid()
    assert collector is not None
    os.kill(collector, signal.SIGSTOP)  # nothing is acked: the agent's messages stay spooled
    stopped = time.time()
    try:
        for xid in (13, 31, 43):
            fleet.inject_xid(node, 1, xid)
        # Kill the agent once the three XID events and a periodic report made after the
        # stop are in its spool (not after a fixed time: a slow agent may not be there yet).
        wait_until(lambda: {(1, 13), (1, 31), (1, 43)} <= spooled_xids(fleet, node)
                   and any(env.type == wire.REPORT and created >= stopped
                           for created, env in spool_messages(fleet, node)),
                   60, "the XID events and a report in the agent's spool", interval=0.1)
        fleet.kill_agent(node)
        spooled = [seq for seq, _ in spool_rows(fleet.agent_spool(node))]
        assert len(spooled) >= 3, spooled
    finally:
        os.kill(collector, signal.SIGCONT)
    fleet.restart_agent(node)
    wait_until(lambda: {s for (s,) in query(fleet, "SELECT seq FROM messages WHERE node = ?", node)}
             >= set(spooled), 60, "every spooled message in the collector DB")
    for table in ("messages", "events", "report_history"):
        total, distinct = query(fleet, f"SELECT count(*), count(DISTINCT seq) FROM {table} "
                                "WHERE node = ?", node)[0]
        assert total == distinct, f"{table}: a (node, seq) stored twice"
    # The killed agent's XID events, from its spool. (The restarted agent reports them again
    # under new seqs: the fake NVML hands a new event set every event still in the file.)
    xids = [d for s, d in query(fleet, "SELECT seq, data FROM events WHERE node = ? AND "
                                "kind = 'xid'", node) if s in set(spooled)]
    assert sorted(xids) == [13, 31, 43]


def test_fleet_json_lists_both_nodes(fleet: SimCluster) -> None:
    env = {**os.environ, **fleet.env()}
    env.pop("SLURMGPU_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "fleet", "--json", "--db",
                           str(fleet.collector_db())], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert doc["pending_checkpoints"] == []
    assert set(rows) == {"gpu-n1", "gpu-n2"}
    for row in rows.values():
        assert row["verdict"] in ("OK", "WARN", "FAIL", "UNKNOWN") and row["reachable"]


def test_a_key_not_on_the_allow_list_cannot_report(fleet: SimCluster, tmp_path: Path) -> None:
    public, secret = zmq.auth.load_certificate(
        zmq.auth.create_certificates(str(tmp_path), "intruder")[1])
    server, _ = zmq.auth.load_certificate(str(fleet.keys_dir / "collector.key"))
    seq = 10**9
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    # The CURVE handshake's outcome (the collector's ZAP handler accepting or refusing the
    # key), seen from this side: proof that the collector has dealt with the key before the
    # checks below that nothing was answered or stored.
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
        sock.connect(fleet.collector_address)
        for node in ("gpu-n1", "intruder"):
            report = wire.Envelope(type=wire.REPORT, node=node, seq=seq,
                                   body={"verdict": "FAIL", "findings": [], "facts": {}})
            sock.send(wire.encode(report), flags=zmq.NOBLOCK)
        assert monitor.poll(60_000), "no CURVE handshake with the collector within 60 s"
        event = recv_monitor_message(monitor)
        assert (event["event"], event["value"]) == (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400), event
        assert not sock.poll(1500), "the collector answered an unlisted key"
    except zmq.Again:
        pass  # never connected: nothing could be sent at all
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    assert query(fleet, "SELECT node, seq FROM messages WHERE seq = ? OR node = 'intruder'",
                 seq) == []
    assert {n for (n,) in query(fleet, "SELECT node FROM nodes")} <= {"gpu-n1", "gpu-n2"}


def test_collector_killed_under_load_loses_nothing(fleet: SimCluster) -> None:
    """kill -9 the collector while agents keep producing events; after a restart every
    event and every node's latest report is in the database exactly once."""
    since = time.time()
    address = fleet.collector_address
    fleet.kill_collector(signal.SIGKILL)
    injected = {"gpu-n1": [(0, 31), (1, 48), (2, 94)], "gpu-n2": [(3, 63), (4, 92), (5, 13)]}
    for node, xids in injected.items():
        for gpu, xid in xids:
            fleet.inject_xid(node, gpu, xid)
            time.sleep(0.2)
    # Agents spool while the collector is gone: start it once every event is spooled (not
    # after a fixed time, which a slow agent may need more than).
    wait_until(lambda: all(set(xids) <= spooled_xids(fleet, node) for node, xids in injected.items()),
               60, "every injected XID in its agent's spool", interval=0.1)
    fleet.start_collector()

    def all_there() -> bool:
        rows = query(fleet, "SELECT node, gpu, data FROM events WHERE kind = 'xid' AND ts >= ?", since)
        return all((node, gpu, xid) in rows for node, xids in injected.items() for gpu, xid in xids)

    assert fleet.collector_address == address  # agents reconnect to the same place
    try:
        wait_until(all_there, timeout=60, what="every spooled event after the collector restart")
    except AssertionError:
        print(query(fleet, "SELECT node, gpu, data, ts FROM events WHERE ts >= ?", since - 60), since)
        print(query(fleet, "SELECT node, max(seq) FROM messages GROUP BY node"))
        raise
    dupes = query(fleet, "SELECT node, gpu, data, count(*) FROM events WHERE kind = 'xid' AND ts >= ? "
                         "GROUP BY node, gpu, data HAVING count(*) > 1", since)
    assert dupes == []
    assert query(fleet, "SELECT count(*) FROM messages GROUP BY node, seq HAVING count(*) > 1") == []
    latest = dict(query(fleet, "SELECT node, ts FROM reports"))
    assert set(latest) == {"gpu-n1", "gpu-n2"}
    wait_until(lambda: all(ts >= since for ts in dict(query(fleet, "SELECT node, ts FROM reports")).values()),
             timeout=60, what="a fresh report from every node")


def test_history_and_report_from_real_agents(fleet: SimCluster) -> None:
    """The agents' report summaries reach the history tables, and `slurmgpu report`
    runs on what the real collector stored."""
    db = fleet.collector_db()
    wait_until(lambda: query(fleet, "SELECT count(DISTINCT node) FROM gpu_counters")[0][0] == 2, 60,
               "GPU counters from both nodes")
    per_node = dict(query(fleet, "SELECT node, count(DISTINCT gpu) FROM gpu_counters GROUP BY node"))
    assert per_node == {"gpu-n1": 8, "gpu-n2": 8}
    # Each node's latest versions (the history also holds what earlier tests injected, e.g.
    # a node whose GPUs were all lost reports no model: which rows exist depends on timing).
    latest = ("SELECT DISTINCT driver, gpu_model FROM node_versions v "
              "WHERE ts = (SELECT max(ts) FROM node_versions WHERE node = v.node)")
    wait_until(lambda: len(query(fleet, latest)) == 1, 60, "both nodes' healthy versions")
    [(driver, model)] = query(fleet, latest)
    assert driver == load_scenario("h100-sxm-8")["driver_version"] and "H100" in model
    env = {**os.environ, **fleet.env()}
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "report", "--db", str(db), "--since", "1h",
                           "--format", "json"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "slurmgpu.report/1" and report["summary"]["nodes"] == 2
