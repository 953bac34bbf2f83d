#!/usr/bin/env python3
"""Checkpoint fan-out latency: from the triggering event to the checkpoint signal
delivered to every node of a 256-node job.

    python bench/checkpoint_fanout.py [--rounds 30] [--nodes 256] [--slurm|--no-slurm] [--json]

One process: a real collector (CURVE, SQLite store in a temporary directory) with a real
automation and checkpoint coordinator, served by a thread (``serve_once(10)`` in a loop,
logging at info as JSON to a file), and ``--nodes`` simulated agents (one CURVE DEALER
socket each, ``bench/automation_rig.py``), each of which said hello first.

The automation's Slurm client is a stand-in for a cluster running one ``--nodes``-node
job: ``jobs_on_node(trigger)`` returns a synthetic RUNNING job (a fresh job id each round)
spanning every simulated node; drains/requeues are in memory. Its ``signal_job`` is the
real thing with ``--slurm`` (the default as root with slurmctld installed): the bench
brings up a 1-node simulated Slurm cluster (``SimCluster``, no agents, hooks off) with one
long batch job whose shell traps USR1 and appends ``date +%s.%N`` to a file, and each
round's ``signal_job`` runs the real ``scancel --signal=USR1 --batch JOBID`` through
``CliSlurmClient``. Without ``--slurm`` the call is only timed.

Each round a fresh node (round i -> node i) sends an EVENT with an XID 79 finding (t0 =
just before the send). The automation decides drain-now; the coordinator looks the job
up, signals it, stores the request and sends a ``checkpoint`` command to each of the
job's nodes. The round ends when every simulated agent has received its command (t_all,
stamped on receipt) and, with --slurm, the trap's line is in the file (t_sig = the
trap's own timestamp). Fan-out latency = max(t_all, t_sig) - t0. The agents then answer
each command with a ``delivered`` command-result (outside the timed part: in one process
they would compete with their own receiving) and the next round starts once every
result is acked. The checkpoint deadline is an hour, so no drain or requeue runs in
between. Also reported, from t0: the automation called (ingest: transport, CURVE,
decode, SQLite commit, ack), the signal call returned, the first and the last command
sent.

Target (issue 5): p99 <= 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from automation_rig import (
    Agents,
    Rig,
    automation_settings,
    exit_on_sigterm,
    fmt,
    rounded,
    sim_cluster,
    slurm_available,
    summary,
    temp_root,
    xid_event,
)

from slurmgpu import keys
from slurmgpu.sim import fleet as simfleet
from slurmgpu.slurm import JobInfo
from slurmgpu.testing import FakeSlurmClient

TARGET_S = 2.0
JOB_BASE = 900_000
TRAP_SCRIPT = """#!/bin/bash
f={file}
trap 'date +%s.%N >> "$f"' USR1
echo ready >> "$f"
sleep 100000 & p=$!
while :; do kill -0 $p 2>/dev/null || {{ sleep 100000 & p=$!; }}; wait $p; done
"""


class FanoutSlurm(FakeSlurmClient):
    """In-memory Slurm with one synthetic job per trigger node; ``signal_job`` is timed
    and, given a real client and job, really signals that job."""

    def __init__(self, names: list[str], real: Any = None, real_job: str | None = None) -> None:
        super().__init__(names)
        self.names = tuple(names)
        self.trigger: dict[str, str] = {}  # node -> synthetic job id
        self.real, self.real_job = real, real_job
        self.signalled: dict[str, tuple[float, float]] = {}  # job id -> (call, return)

    def jobs_on_node(self, node: str) -> list[Any]:
        jid = self.trigger.get(node)
        if jid is None:
            return []
        return [JobInfo(jid, "RUNNING", user="bench", nodes=self.names, batch_host=self.names[0])]

    def signal_job(self, job_id: str, signal: str = "USR1", *, full: bool = False) -> None:
        start = time.time()
        if self.real is not None:
            self.real.signal_job(self.real_job, signal, full=full)
        self.signalled[job_id] = (start, time.time())


def _trap_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return []


def run(rounds: int, n: int, use_slurm: bool, log_level: str) -> dict[str, Any]:
    simfleet.raise_fd_limit(4 * n + 256)
    rows: list[dict[str, Any]] = []
    with temp_root("sgb-ckpt-") as root, contextlib.ExitStack() as stack:
        real = real_job = sigfile = None
        if use_slurm:
            from slurmgpu.slurm.cli import CliSlurmClient

            cluster = stack.enter_context(sim_cluster(1))
            sigfile = cluster.dir / "jobs" / "usr1.log"
            real_job = cluster.sbatch(TRAP_SCRIPT.format(file=sigfile), "-N1", "-J", "ckpt-bench")
            deadline = time.monotonic() + 60
            while "ready" not in _trap_lines(sigfile):
                if time.monotonic() > deadline:
                    raise SystemExit(f"batch job {real_job} never started: {cluster.job(real_job)}")
                time.sleep(0.1)
            real = CliSlurmClient(env=cluster.env())
        keys.init(root / "keys")
        nodes = simfleet.make_nodes(root / "keys", n)
        names = [x.name for x in nodes]
        client = FanoutSlurm(names, real, real_job)
        rig = stack.enter_context(Rig(root, client, automation_settings(checkpoint_deadline_s=3600.0),
                                      log_level=log_level))
        # Timestamps inside the collector thread: automation called, commands sent.
        auto_at: dict[str, float] = {}
        sends: dict[str, list[float]] = {}
        on_report = rig.automation.on_report

        def timed_on_report(node: str, *a: Any, **kw: Any) -> Any:
            auto_at.setdefault(node, time.time())
            return on_report(node, *a, **kw)

        rig.automation.on_report = timed_on_report  # type: ignore[method-assign]
        checkpoints = rig.collector.checkpoints
        assert checkpoints is not None and checkpoints.send is not None
        send = checkpoints.send

        def timed_send(node: str, command: str, args: dict[str, Any]) -> str:
            start = time.time()
            cid = send(node, command, args)
            sends.setdefault(str(args.get("job_id")), []).extend((start, time.time()))
            return cid

        checkpoints.send = timed_send
        agents = stack.enter_context(Agents(rig.address, rig.server_key, nodes))
        agents.hello(120)
        for r in range(rounds):
            trigger = r % n
            jid = str(JOB_BASE + r)
            client.trigger[names[trigger]] = jid
            sig_before = len(_trap_lines(sigfile)) if sigfile else 0
            got: dict[int, tuple[float, str]] = {}
            t_sig: float | None = None
            t0 = agents.send_event(trigger, xid_event())
            give_up = t0 + 60
            while len(got) < n or (use_slurm and t_sig is None):
                for c in agents.poll(2):
                    if c.command == "checkpoint" and c.args.get("job_id") == jid:
                        got.setdefault(c.node, (c.at, c.command_id))
                if sigfile is not None and t_sig is None:
                    lines = _trap_lines(sigfile)
                    if len(lines) > sig_before:
                        t_sig = float(lines[sig_before])
                if time.time() > give_up:
                    raise SystemExit(f"round {r}: {len(got)}/{n} commands, signal "
                                     f"{'seen' if t_sig else 'not seen'} after 60 s; see {root}/collector.log")
                rig.check()
            t_all = max(at for at, _ in got.values())
            for i, (_, cid) in sorted(got.items()):
                agents.reply(i, cid, {"job_id": jid, "state": "delivered", "file": "/x"})
            if not agents.wait_acks(60):
                raise SystemExit(f"round {r}: {agents.pending_acks()} messages never acked")
            sig_call, sig_ret = client.signalled[jid]
            if t_sig is None:
                t_sig = sig_ret  # no Slurm: the call returned
            sent = sends.get(jid) or [float("nan")]
            row = {"round": r, "node": names[trigger], "job_id": jid,
                   "fanout_s": max(t_all, t_sig) - t0, "all_commands_s": t_all - t0,
                   "signal_s": t_sig - t0, "automation_called_s": auto_at[names[trigger]] - t0,
                   "signal_call_s": sig_ret - sig_call, "first_send_s": min(sent) - t0,
                   "last_send_s": max(sent) - t0, "commands": len(sent) // 2}
            rows.append(row)
            time.sleep(0.1)
    out: dict[str, Any] = {"cpus": os.cpu_count(), "nodes": n, "rounds": rounds,
                           "mode": "slurm" if use_slurm else "no-slurm", "target_p99_s": TARGET_S}
    for key in ("fanout_s", "all_commands_s", "signal_s", "automation_called_s", "signal_call_s",
                "first_send_s", "last_send_s"):
        out[key.removesuffix("_s")] = summary([row[key] for row in rows])
    p99 = out["fanout"]["p99_ms"]
    out["pass"] = p99 is not None and p99 <= TARGET_S * 1000
    out["rows"] = rounded(rows)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--slurm", action=argparse.BooleanOptionalAction, default=None,
                        help="signal a real batch job on a simulated Slurm cluster "
                             "(default: when root with slurmctld installed)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="the collector's log level (JSON lines to a file; default info)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    exit_on_sigterm()
    use_slurm = slurm_available() if args.slurm is None else args.slurm
    if not args.json:
        print(f"mode: {'slurm (real scancel --signal=USR1 --batch to a batch job)' if use_slurm else 'no-slurm (signal call timed only)'}, "
              f"{args.nodes} nodes, {args.rounds} rounds", flush=True)
    out = run(args.rounds, args.nodes, use_slurm, args.log_level)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"fan-out (event -> all {args.nodes} commands received and signal delivered): "
              f"{fmt(out['fanout'])}")
        for label, key in (("  automation called", "automation_called"),
                           ("  signal call (scancel)", "signal_call"),
                           ("  signal delivered", "signal"),
                           ("  first command sent", "first_send"),
                           ("  last command sent", "last_send"),
                           ("  all commands received", "all_commands")):
            print(f"{label:<26} {fmt(out[key])}")
        print(f"target p99 <= {TARGET_S:g} s: {'PASS' if out['pass'] else 'FAIL'}")
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
