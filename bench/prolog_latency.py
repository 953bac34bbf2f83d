#!/usr/bin/env python3
"""Prolog wall time added per job, on the real Slurm mini-cluster.

Runs each node's Prolog hook exactly as slurmd does (the generated hook wrapper ->
prolog/slurmgpu-prolog -> `slurmgpu prolog`, no PATH, slurmd's job variables, 8
simulated GPUs per node with 2 given to the job) and times the whole process,
including the drain decision's `scontrol show node` call when there is something
to decide. It also times real jobs end to end (submit -> COMPLETED).

    python bench/prolog_latency.py [--runs 50] [--json]

Target (issue 3): cold path p50 <= 400 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _lost_gpu0() -> dict:
    from slurmgpu.sim.scenario import load_scenario

    data = load_scenario("h100-sxm-8")
    data["gpus"][0]["lost"] = True
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=5, help="end-to-end jobs to time")
    parser.add_argument("--dir", default=None, help="cluster dir (default: a bench cluster in /tmp)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from slurmgpu.sim.cluster import SimCluster

    cluster = SimCluster(args.dir or "/tmp/slurmgpu-bench-cluster")
    cluster.up(nodes=2, gpus=8, agents=False)  # the cold (direct) path; bench/warm_prolog.py times the agent path
    try:
        samples = []
        for i in range(args.runs + 3):
            env = {"SLURM_JOB_ID": str(900000 + i), "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
                   "SLURM_JOB_USER": "bench", "SLURM_JOB_UID": "0"}
            start = time.perf_counter()
            proc = cluster.run_hook("prolog", cluster.nodes[0], env)
            elapsed = (time.perf_counter() - start) * 1000
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            if i >= 3:
                samples.append(elapsed)
        # The FAIL path: GPU 0 of the second node lost; each run drains it (timed), then the
        # node is resumed (not timed).
        bad = cluster.nodes[1]
        cluster.inject(bad, _lost_gpu0())
        fail_samples = []
        for i in range(max(args.runs // 5, 5)):
            env = {"SLURM_JOB_ID": str(910000 + i), "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_USER": "bench"}
            start = time.perf_counter()
            proc = cluster.run_hook("prolog", bad, env)
            fail_samples.append((time.perf_counter() - start) * 1000)
            if proc.returncode != 1:
                print(proc.stderr, file=sys.stderr)
                return 1
            cluster.scontrol("update", f"nodename={bad}", "state=resume")
        cluster.inject(bad, "h100-sxm-8")
        jobs = []
        for _ in range(args.jobs):
            start = time.perf_counter()
            job = cluster.sbatch("#!/bin/sh\ntrue\n", "--gres=gpu:2")
            state = cluster.wait_job(job, timeout=120)
            jobs.append((time.perf_counter() - start) * 1000)
            if state != "COMPLETED":
                print(f"job {job} ended {state}", file=sys.stderr)
                return 1
        result = {
            "prolog_runs": args.runs, "prolog_p50_ms": round(statistics.median(samples), 1),
            "prolog_p99_ms": round(pct(samples, 0.99), 1), "prolog_max_ms": round(max(samples), 1),
            "fail_runs": len(fail_samples), "fail_drain_p50_ms": round(statistics.median(fail_samples), 1),
            "fail_drain_max_ms": round(max(fail_samples), 1),
            "jobs": args.jobs, "job_submit_to_complete_p50_ms": round(statistics.median(jobs), 1),
            "gpus_per_node": 8, "job_gpus": 2,
        }
    finally:
        if not args.keep:
            cluster.down()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:>32}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
