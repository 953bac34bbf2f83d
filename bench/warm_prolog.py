#!/usr/bin/env python3
"""Warm prolog path: whole-process wall time of `slurmgpu-quickgate prolog` against a live
agent-side server (slurmgpu.agent.local) holding the facts of 8 simulated H100s (the fake
libnvidia-ml.so.1, scenario h100-sxm-8), and of the fallback when no agent answers
(quickgate -> exec `slurmgpu prolog`, the full path, on the same simulated GPUs).

    python bench/warm_prolog.py [--runs 200] [--fallback-runs 20] [--json]
    python bench/warm_prolog.py --goals [--runs 100]
    python bench/warm_prolog.py --server-side 400

``--goals``: issue 38's two hook goals only, each interleaved with its baseline in the
same run: the warm prolog through the shipped wrapper against ``/usr/bin/python3 -I -S
-c pass`` (goal: <= 3x) and the cold prolog (`slurmgpu prolog`, no agent) against
``python -c "import pynvml"`` (goal: <= +100 ms); the full run times them the same way.

``--server-side N``: the agent's side of a warm prolog alone, in this process (one real
Agent, ``LocalService.hook``), N times each way, interleaved so a loaded machine slows both
alike: the job's GPUs read afresh (as shipped) and the agent's cached facts (its
``[agent] max_age_s``: the warm path before issue 36).

The server runs in its own process: slurmgpu.agent.core.Agent when it can be built from
Settings, else a minimal agent here (engine.gather over the system sources, cached, the
job's GPUs refreshed when older than max_age_s). Drains go to an in-memory Slurm.

Targets: warm p50 <= 50 ms, p99 <= 100 ms; issue 38's ratios above.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NODE = "bench-n1"
CONFIG = """\
[gpu]
count = 8
[checks]
disabled = ["ib.*", "pin.*"]
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# ----------------------------------------------------------------- server side


class MiniAgent:
    """The Agent members the local server uses, over engine.gather."""

    def __init__(self, settings: Any, node: str) -> None:
        from slurmgpu.engine import system_sources

        self.settings = settings
        self.node = node
        self.sources = system_sources(settings)
        self.lock = threading.Lock()
        self._latest: Any = None
        self.refresh(None)

    def refresh(self, gpus: frozenset[int] | None) -> Any:
        from slurmgpu.engine import evaluate, gather

        facts = gather(self.sources, node=self.node, scope=gpus)
        if gpus is None:
            self._latest = (facts, evaluate(facts, self.settings), time.time())
        return facts

    def latest(self) -> Any:
        return self._latest

    def sweep_soon(self) -> None:
        pass  # (no job directories here)

    def bookkeeping_failed(self, errors: list[str]) -> None:
        print(f"bookkeeping failed: {errors}", file=sys.stderr)

    def prolog_blocked(self, job_id: str | None, record: dict[str, Any]) -> None:
        pass  # (no collector here)

    def facts_for(self, gpus: frozenset[int] | None, max_age_s: float) -> Any:
        with self.lock:
            facts = self._latest[0]
            if time.time() - facts.collected_at > max_age_s:
                return self.refresh(gpus)
            if gpus is None:
                return facts
            out = copy.copy(facts)
            out.nvml = copy.copy(facts.nvml)
            out.nvml.gpus = [g for g in facts.nvml.gpus if g.index in gpus]
            return out


def serve(path: str, config: str) -> int:
    from slurmgpu.agent.local import serve_local
    from slurmgpu.config.load import load_config
    from slurmgpu.testing import FakeSlurmClient

    settings = load_config(config).settings_for(NODE)
    agent: Any
    try:
        from slurmgpu.agent.core import Agent

        agent = Agent(settings, NODE)
        agent.poll()  # the first poll fills the cache, as the running agent's loop does
        kind = "Agent"
    except Exception as exc:  # keep the bench usable if the agent cannot be built here
        print(f"real Agent unavailable ({exc}); using MiniAgent", file=sys.stderr)
        agent, kind = MiniAgent(settings, NODE), "MiniAgent"
    print(json.dumps({"agent": kind, "verdict": agent.latest()[1].severity.name}), flush=True)
    client = FakeSlurmClient([NODE])
    stop = threading.Event()
    serve_local(agent, path, stop, client_factory=lambda env: client)
    return 0


def server_side(env: dict[str, str], config: str, rounds: int) -> dict[str, Any]:
    """Median and p99 of ``LocalService.hook("prolog")``, fresh GPUs vs cached facts."""
    from slurmgpu.agent.core import Agent
    from slurmgpu.agent.local import CachedFacts, LocalService
    from slurmgpu.config.load import load_config
    from slurmgpu.testing import FakeSlurmClient

    os.environ.update(env)
    settings = load_config(config).settings_for(NODE)
    agent = Agent(settings, NODE)
    agent.poll()
    client = FakeSlurmClient([NODE])

    class Cached(LocalService):
        def cached_facts(self, env: Any) -> CachedFacts:
            return CachedFacts(self.agent, env.get("SLURMGPU_KMSG", ""), settings.agent.max_age_s)

    services = {"fresh": LocalService(agent, lambda e: client), "cached": Cached(agent, lambda e: client)}
    times: dict[str, list[float]] = {name: [] for name in services}
    job = {k: v for k, v in env.items() if k.startswith("SLURM")}
    for i in range(rounds + 5):
        for name, service in services.items():
            start = time.perf_counter()
            reply = service.hook("prolog", {**job, "SLURM_JOB_ID": str(600000 + i)})
            if i >= 5:
                times[name].append((time.perf_counter() - start) * 1000)
            assert reply["exit"] == 0, reply
    return {name: summary(samples) for name, samples in times.items()}


# ----------------------------------------------------------------- client side


def one_run(cmd: list[str], env: dict[str, str], job: int) -> tuple[float, int]:
    """Wall time (ms) and exit code of one run of ``cmd`` as job ``job``."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env={**env, "SLURM_JOB_ID": str(job)}, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr.decode(errors="replace"))
    return elapsed, proc.returncode


def time_runs(cmd: list[str], env: dict[str, str], runs: int, warmup: int = 5) -> tuple[list[float], set[int]]:
    samples, codes = [], set()
    for i in range(runs + warmup):
        elapsed, code = one_run(cmd, env, 500000 + i)
        codes.add(code)
        if i >= warmup:
            samples.append(elapsed)
    return samples, codes


def time_pair(cmd: list[str], baseline: list[str], env: dict[str, str], runs: int,
              warmup: int = 5) -> dict[str, Any]:
    """``cmd`` and its ``baseline`` alternately, so load from elsewhere slows both alike:
    each one's summary, the ratio and the difference of the medians."""
    samples: list[float] = []
    floor: list[float] = []
    codes: set[int] = set()
    for i in range(runs + warmup):
        elapsed, code = one_run(cmd, env, 700000 + i)
        base_elapsed, _ = one_run(baseline, env, 700000 + i)
        codes.add(code)
        if i >= warmup:
            samples.append(elapsed)
            floor.append(base_elapsed)
    mine, base = summary(samples), summary(floor)
    return {**mine, "exit_codes": sorted(codes), "baseline": " ".join(baseline), "baseline_p50_ms": base["p50_ms"],
            "ratio_p50": round(mine["p50_ms"] / base["p50_ms"], 2),
            "difference_p50_ms": round(mine["p50_ms"] - base["p50_ms"], 1)}


#: The floor of a warm prolog: the system interpreter started as the wrapper starts it.
BARE_INTERPRETER = ["/usr/bin/python3", "-I", "-S", "-c", "pass"]


def goals(env: dict[str, str], work: Path, runs: int) -> dict[str, Any]:
    """Issue 38's two hook goals, each interleaved with its baseline: the warm prolog
    through the shipped wrapper against a bare interpreter start (goal: <= 3x), and the
    cold prolog (`slurmgpu prolog`, no agent) against `import pynvml` (goal: <= +100 ms)."""
    shipped = [str(REPO / "prolog" / "slurmgpu-prolog")]
    cold_env = {**env, "SLURMGPU_AGENT_SOCKET": str(work / "down.sock")}
    direct = os.environ.get("SLURMGPU_BIN", "").split() or [sys.executable, "-m", "slurmgpu"]
    return {"load_average": os.getloadavg(),
            "warm_shipped_wrapper": time_pair(shipped, BARE_INTERPRETER, env, runs),
            "cold_prolog": time_pair([*direct, "prolog"], [sys.executable, "-c", "import pynvml"], cold_env,
                                     max(runs // 4, 10), warmup=3)}


def summary(samples: list[float]) -> dict[str, float]:
    return {"runs": len(samples), "p50_ms": round(statistics.median(samples), 1),
            "p99_ms": round(pct(samples, 0.99), 1), "max_ms": round(max(samples), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--fallback-runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--server-side", type=int, metavar="N", default=0,
                        help="time the agent's side alone, N runs each way (see above)")
    parser.add_argument("--goals", action="store_true",
                        help="only issue 38's goals: the shipped wrapper against a bare interpreter, "
                             "`slurmgpu prolog` (no agent) against `import pynvml`, each interleaved")
    parser.add_argument("--serve", nargs=2, metavar=("SOCKET", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(*args.serve)

    from slurmgpu.sim.build import build_library
    from slurmgpu.sim.scenario import resolve_scenario

    work = Path(tempfile.mkdtemp(prefix="sgwb-", dir="/tmp"))
    sock = str(work / "agent.sock")
    config = work / "slurmgpu.toml"
    config.write_text(CONFIG)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "SLURMGPU_NVML_LIBRARY": str(build_library()),
           "SLURMGPU_SIM_SCENARIO": str(resolve_scenario("h100-sxm-8")),
           "SLURMGPU_CONFIG": str(config), "SLURMD_NODENAME": NODE,
           "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_USER": "bench",
           "SLURMGPU_STATE_DIR": str(work / "state"), "SLURMGPU_KMSG": str(work / "kmsg"),
           "SLURMGPU_JOBS_DIR": str(work / "jobs"),
           "SLURMGPU_AGENT_SOCKET": sock}
    if args.server_side:
        result = server_side(env, str(config), args.server_side)
        shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(result, indent=2))
        return 0
    server = subprocess.Popen([sys.executable, __file__, "--serve", sock, str(config)], env=env,
                              stdout=subprocess.PIPE, text=True)
    result: dict[str, Any] = {"gpus_per_node": 8, "job_gpus": 2}
    try:
        assert server.stdout is not None
        result["server"] = json.loads(server.stdout.readline())
        deadline = time.monotonic() + 20
        while not os.path.exists(sock):
            if time.monotonic() > deadline or server.poll() is not None:
                print("agent-side server did not start", file=sys.stderr)
                return 1
            time.sleep(0.05)
        if args.goals:
            result.update(goals(env, work, args.runs))
            return report(result, args.json)
        quick_m = [sys.executable, "-m", "slurmgpu.quickgate", "prolog"]
        samples, codes = time_runs(quick_m, env, args.runs)
        result["warm_python_m"] = {**summary(samples), "exit_codes": sorted(codes)}
        quick_file = [sys.executable, "-I", "-S", str(REPO / "slurmgpu" / "quickgate.py"), "prolog"]
        samples, codes = time_runs(quick_file, env, args.runs)
        result["warm_python_IS_file"] = {**summary(samples), "exit_codes": sorted(codes)}
        hook = work / "hook.sh"  # the sim cluster's shape: sh wrapper -> quick client
        hook.write_text(f'#!/bin/sh\nexport SLURMGPU_QUICKGATE="{" ".join(quick_file[:-1])}"\n'
                        f'exec {REPO / "prolog" / "slurmgpu-prolog"} "$@"\n')
        hook.chmod(0o755)
        samples, codes = time_runs([str(hook)], env, args.runs)
        result["warm_hook_wrapper_IS"] = {**summary(samples), "exit_codes": sorted(codes)}
        # As shipped: prolog/slurmgpu-prolog -> prolog/slurmgpu-quickgate (shebang
        # `env -S python3 -I -S`, the system python3), no overrides in the environment.
        shipped = {k: v for k, v in env.items() if k != "SLURMGPU_QUICKGATE"}
        result["warm_shipped_wrapper"] = time_pair([str(REPO / "prolog" / "slurmgpu-prolog")],
                                                   BARE_INTERPRETER, shipped, args.runs)
        script = shutil.which("slurmgpu-quickgate") or str(Path(sys.executable).parent / "slurmgpu-quickgate")
        if os.access(script, os.X_OK):
            samples, codes = time_runs([script, "prolog"], env, args.runs)
            result["warm_console_script"] = {**summary(samples), "exit_codes": sorted(codes)}
        else:
            result["warm_console_script"] = "not installed"
        down = {**env, "SLURMGPU_AGENT_SOCKET": str(work / "down.sock")}
        samples, codes = time_runs(quick_m, down, args.fallback_runs, warmup=2)
        result["fallback_agent_down"] = {**summary(samples), "exit_codes": sorted(codes)}
        direct = os.environ.get("SLURMGPU_BIN", "").split() or [sys.executable, "-m", "slurmgpu"]
        result["direct_full_path"] = time_pair([*direct, "prolog"], [sys.executable, "-c", "import pynvml"],
                                               down, args.fallback_runs, warmup=2)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return report(result, args.json)


def report(result: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
