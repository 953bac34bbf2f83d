"""A deterministic month of fleet history, for the fleet report's demo, tests and benchmark.

``seed(db_path, nodes=1000, days=30)`` fills an empty fleet database (the collector's
schema, docs/fleet-db.md) with what a collector would have recorded for a fleet of
8-GPU A100 (40 %) and H100 (60 %) nodes: hourly samples for every node, fault episodes
(XIDs, ECC, row remaps, thermal throttling, IB link flaps) with their report history,
findings, events, the automation's decisions and Slurm drains / resumes with who drained
(the automation; the epilog for uncorrected ECC errors), checkpointed and requeued jobs,
jobs the prolog refused, operators' maintenance drains, unreachable spells, GPU / IB counters
and software versions (a few nodes off the pins of ``etc/report-demo.toml``, one
upgraded mid-month), two lemon nodes. Same arguments, same rows.

Everything is written in one transaction with ``executemany`` (1,000 nodes x 30 days,
~0.8 M rows, in a few seconds). ``slurmgpu sim report-seed`` is the command line.

The modules: ``model`` (the fleet's hardware, faults and rates; a node, an episode; the
shared decision vocabulary as the database holds it), ``rows`` (the rows collected and the
writes episodes are made of), ``episodes`` (faults, the automation's answers, maintenance,
unreachable spells), ``plan`` (the fleet and its month, laid out in time), ``write`` (the
database).
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
