#!/usr/bin/env python3
"""Cost of finding the ``slurmgpu.checks`` entry points on the cold path.

Each run is a fresh interpreter that first imports what `slurmgpu check` has imported
by the time it evaluates (so shared modules are not counted), then times:

* ``scan``: ``slurmgpu.checks.plugins.discover()``, slurmgpu's own reading of the
  ``entry_points.txt`` files on sys.path (what the prolog pays with ``[checks] plugins
  = true``, the default);
* ``importlib``: ``import importlib.metadata`` plus ``entry_points(group=...)``, the
  standard way, for comparison.

    python bench/plugin_scan.py [--runs 20] [--plugin] [--dists N] [--json]

``--plugin`` puts one tiny plugin distribution on PYTHONPATH (then the scan also reads
its METADATA); ``--dists N`` adds N distributions with console scripts and no plugin (a
system's dist-packages has a few hundred). Bytecode is cached as an installed package has it (a temporary
PYTHONPYCACHEPREFIX, filled by two warm-up runs). The issue's budget for the scan: ~5 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, sys, time
import click, slurmgpu.cli.checks, slurmgpu.config.load, slurmgpu.engine  # the cold path so far
t0 = time.perf_counter()
from slurmgpu.checks import plugins
found = plugins.discover()
t1 = time.perf_counter()
from importlib.metadata import entry_points
theirs = entry_points(group=plugins.GROUP)
t2 = time.perf_counter()
assert [e.name for e in found] == [e.name for e in theirs]
dists = sum(1 for p in sys.path if __import__("os").path.isdir(p or ".")
            for c in __import__("os").listdir(p or ".") if c.endswith((".dist-info", ".egg-info")))
print(json.dumps({"scan": (t1 - t0) * 1e3, "importlib": (t2 - t1) * 1e3, "found": len(found),
                  "dists": dists}))
"""


def fake_dist(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--plugin", action="store_true", help="with one plugin distribution installed")
    ap.add_argument("--dists", type=int, default=0, help="add N distributions without a plugin")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        for i in range(args.dists):
            fake_dist(Path(tmp), f"filler_{i}", f"[console_scripts]\nfiller-{i} = filler_{i}:main\n")
        if args.plugin:
            fake_dist(Path(tmp), "acme_bench", "[slurmgpu.checks]\nacme = acme_bench\n")
        paths.insert(0, tmp)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths)),
               "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        runs = [json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                                          text=True, check=True).stdout) for _ in range(args.runs + 2)][2:]
    result = {key: round(statistics.median(r[key] for r in runs), 2) for key in ("scan", "importlib")}
    result.update(runs=args.runs, found=runs[0]["found"], dists=runs[0]["dists"], python=sys.version.split()[0])
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['dists']} distributions on sys.path, {result['found']} slurmgpu.checks entry points, "
          f"median of {args.runs} fresh interpreters:")
    print(f"  slurmgpu scan (discover):                   {result['scan']:6.2f} ms")
    print(f"  import importlib.metadata + entry_points(): {result['importlib']:6.2f} ms")


if __name__ == "__main__":
    main()
