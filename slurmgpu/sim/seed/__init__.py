"""A deterministic month of fleet history, for the fleet report's demo, tests and benchmark.

Design notes: docs/design-notes.md (``slurmgpu/sim/seed/__init__.py``).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from pathlib import Path
from typing import Any

from .episodes import Seeder
from .model import DAY, HOUR, SeedError
from .plan import (
    SHOWCASE,
    Plan,
    application_xids,
    counters,
    lay_out,
    make_fleet,
    plan_episodes,
    set_versions,
)
from .write import write

__all__ = ["SeedError", "seed"]


def seed(db_path: str | Path, nodes: int = 1000, days: float = 30, *, end: float | None = None,
         seed: int = 0) -> dict[str, Any]:
    """Fill the (empty) fleet database at ``db_path`` with ``days`` of history for ``nodes``
    nodes ending at ``end`` (default: the current hour), the automation's state (the two
    lemons, the nodes it drained) included. Returns a summary (row counts, notable nodes)."""
    if nodes < 1 or days <= 0:
        raise SeedError("nodes must be >= 1 and days > 0")
    began = time.perf_counter()
    end = float(math.floor(time.time() / HOUR) * HOUR) if end is None else float(end)
    start = end - days * DAY
    hours = math.ceil((end - start) / HOUR)
    rng = random.Random(seed)
    sd = Seeder(rng, start, end)
    fleet = make_fleet(nodes, end)

    # Showcase nodes: every kind of trouble appears at least once, even in a small fleet.
    order = rng.sample(range(nodes), nodes)
    pick = itertools.cycle(order)
    showcase = {role: fleet[next(pick)] for role in SHOWCASE}
    plan: Plan = {n.name: [] for n in fleet}
    scale = days / 30.0
    drifted, up = set_versions(sd, fleet, showcase, plan, scale)
    counters(sd, fleet, order)
    plan_episodes(sd, fleet, showcase, plan, scale)
    lemons = lay_out(sd, fleet, plan)
    application_xids(sd, fleet, scale)
    counts = write(db_path, sd, fleet, hours)
    return {
        "db": str(db_path), "nodes": nodes, "days": days, "seed": seed, "start": start, "end": end,
        "rows": counts, "lemons": sorted(set(lemons)), "drifted": sorted(drifted), "upgraded": up.name,
        "drained_at_end": sorted(sd.drained), "seconds": round(time.perf_counter() - began, 3),
    }
