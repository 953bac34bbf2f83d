"""Where the agent's resident memory goes: RSS after each stage of what `slurmgpu agent`
loads, in the order it loads it, then the process's mappings grouped by file.

    python bench/agent_rss_breakdown.py [--json]      # the real driver (or SLURMGPU_NVML_LIBRARY)

On a real GPU node this separates what slurmgpu's Python costs from what the NVIDIA
driver's libnvidia-ml.so.1 maps and allocates at nvmlInit (issue 10's ≤ 50 MB target was
measured on the fake library). Stages: bare interpreter; the agent's imports (the CLI,
the agent core, pyzmq, structlog); nvmlInit; one full NVML gather of every GPU; an NVML
event set registered for the events the agent watches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict
from typing import Any


def status_kb() -> dict[str, int]:
    wanted = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize")
    values: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in wanted:
                values[key] = int(rest.split()[0])
    return values


def mappings_by_file(top: int = 20) -> list[dict[str, Any]]:
    """/proc/self/smaps summed per backing file ([heap], [anon] and the like included)."""
    rss: dict[str, int] = defaultdict(int)
    current = "[anon]"
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
    with open("/proc/self/smaps") as f:
        for line in f:
            if header.match(line):
                parts = line.split(None, 5)
                current = parts[5].strip() if len(parts) > 5 and parts[5].strip() else "[anon]"
            elif line.startswith("Rss:"):
                rss[current] += int(line.split()[1])
    ranked = sorted(rss.items(), key=lambda item: -item[1])[:top]
    return [{"mapping": name, "rss_kb": kb} for name, kb in ranked]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    stages: list[dict[str, Any]] = []

    def stage(name: str, started: float) -> None:
        stages.append({"stage": name, "ms": round((time.perf_counter() - started) * 1000, 1), **status_kb()})

    t = time.perf_counter()
    stage("interpreter", t)

    t = time.perf_counter()
    import structlog  # noqa: F401  (the agent's logging)
    import zmq  # noqa: F401

    import slurmgpu.agent.core
    import slurmgpu.agent.events
    import slurmgpu.cli
    stage("imports (cli, agent core, events, zmq, structlog)", t)

    import ctypes

    import pynvml

    from slurmgpu.config.env import setting_value

    t = time.perf_counter()
    library = setting_value("nvml.library", None, os.environ)  # (the simulator), else the driver's
    if library:
        pynvml.nvmlLib = ctypes.CDLL(library)
    pynvml.nvmlInit()
    stage("nvmlInit", t)

    t = time.perf_counter()
    source = slurmgpu.agent.events.PynvmlSource(library)
    facts = source.collect()
    stage(f"gather ({len(facts.gpus)} GPUs)", t)

    t = time.perf_counter()
    event_set = pynvml.nvmlEventSetCreate()
    registered = 0
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            mask = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            registered += 1
        except pynvml.NVMLError as exc:
            print(f"GPU {index}: events not registered: {exc}", file=sys.stderr)
    stage(f"event set ({registered} GPUs)", t)

    result = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "pid": os.getpid(),
        "stages": stages,
        "top_mappings": mappings_by_file(),
    }
    pynvml.nvmlEventSetFree(event_set)
    pynvml.nvmlShutdown()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"Python {result['python']}, driver {result['driver']}")
    print(f"{'stage':<52} {'ms':>8} {'VmRSS MB':>9} {'anon MB':>8} {'file MB':>8}")
    for s in stages:
        print(f"{s['stage']:<52} {s['ms']:>8} {s['VmRSS'] / 1024:>9.1f} {s.get('RssAnon', 0) / 1024:>8.1f} "
              f"{s.get('RssFile', 0) / 1024:>8.1f}")
    print("largest mappings:")
    for m in result["top_mappings"]:
        print(f"  {m['rss_kb'] / 1024:>7.1f} MB  {m['mapping']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
