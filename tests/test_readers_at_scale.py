"""Issue 15 (the readers at fleet size): the fast paths give what the plain ones gave.

* ``[[hosts]]`` matching for many nodes (``HostIndex``: each hostlist expanded once) names
  the sections ``HostSection.matches`` (ClusterShell, per node) names;
* the report model is the same with and without them, with the throttling scan split in
  threads or not, and its XID and throttling numbers are those of the queries it ran before.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.collector.store import Store, queries
from slurmgpu.config.hosts import HostIndex, HostSection
from slurmgpu.config.load import LoadedConfig, parse_config
from slurmgpu.report.model import builder as builder_module
from slurmgpu.report.model import report_from_path
from slurmgpu.sim.seed import seed

END = datetime(2026, 11, 26, 6, tzinfo=UTC).timestamp()
T0 = END - 7 * 86400
HOSTLISTS = ["gpu-a100-[001-010,015]", "gpu-[1-20]", "gpu-[01-20]", "n[1-3,005-010,0100-0102]",
             "a[1-3]b[01-02]", "n[1-100/3]", "node[1-5]!node3", "x[1-9]&x[3-12]", "x[1-9]^x[3-12]",
             "gpu1", "rack[1-2]-n[00-03]", "n.[1-3].x", "A_[1-2]", "n[1-2]0"]
ODD_NAMES = ["", " ", "gpu-[1-2]", "gpu-1,gpu-2", "gpu-1 ", "we\"ird", "back\\slash",
             "new\nline", "ünï", "gpu-1!gpu-2", "@group", "node3", "gpu-01", "gpu-001", "x1"]
# A100s, H100s but one, a second "a100" section overlapping the first (and naming that
# H100), every other H100 from 020: sections that overlap, a name used twice, no name.
CONFIG = """
[pins]
driver = ["550.90.07"]
nccl = [">=2.21"]
[[hosts]]
name = "a100"
nodes = "gpu-a100-[001-012]"
pins.vbios = ["92.00.45.*"]
[[hosts]]
nodes = "gpu-h100-[001-030]!gpu-h100-007"
name = "h100"
pins = { vbios = ["96.00.99.*"] }
[[hosts]]
nodes = "gpu-a100-[010-020],gpu-h100-007"
pins.driver = ["535.183.01"]
name = "a100"
[[hosts]]
nodes = "gpu-h100-[020-040/2]"
ib.count = 4
"""


# --------------------------------------------------------------------------- [[hosts]]


def _candidates() -> list[str]:
    """Every name of the hostlists, each mutated a few ways, random short names and
    names that are not plain node names at all."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    rnd = random.Random(15)
    chars = "an0123456789-_.bxgpuA"
    names = set(ODD_NAMES)
    for hostlist in HOSTLISTS:
        for name in NodeSet(hostlist, resolver=RESOLVER_NOGROUP):
            names.add(name)
            for _ in range(3):
                s = list(name)
                s[rnd.randrange(len(s))] = rnd.choice(chars)
                names.add("".join(s))
                names.add(name[:-1])
                names.add(name + rnd.choice(chars))
    names.update("".join(rnd.choice(chars) for _ in range(rnd.randint(1, 7))) for _ in range(800))
    return sorted(names)


def test_host_index_matches_like_clustershell() -> None:
    hosts = [HostSection(index=i, nodes=h, values={}) for i, h in enumerate(HOSTLISTS)]
    index = HostIndex(hosts)
    names = _candidates()
    matched = 0
    for name in names:
        expected = [h for h in hosts if h.matches(name)]
        assert index.matching(name) == expected, name
        matched += bool(expected)
    assert 100 < matched < len(names) - 100  # (candidates in and out of the hostlists)
    assert HostIndex([]).matching("gpu-1") == []


def test_host_section_names_expand_once() -> None:
    section = HostSection(index=0, nodes="gpu-[001-003]", values={})
    assert section.names() == {"gpu-001", "gpu-002", "gpu-003"}
    assert section.names() is section.names()
    assert section.matches("gpu-002") and not section.matches("gpu-2")


# --------------------------------------------------------------------------- the report


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LoadedConfig]:
    """60 simulated nodes over 7 days, plus XID events the simulator does not write (no
    XID number, no GPU, count ties across nodes)."""
    tmp = tmp_path_factory.mktemp("readers")
    path = tmp / "fleet.db"
    seed(path, nodes=60, days=7, end=END, seed=5)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        rows = [("gpu-a100-001", 9001, END - 3600, "xid", None, None),
                ("gpu-a100-001", 9002, END - 3500, "xid", 1, None),
                ("gpu-h100-002", 9003, END - 3400, "xid", None, 79),
                ("gpu-h100-002", 9004, END - 3300, "xid", 3, 79),
                ("gpu-h100-003", 9005, END - 3200, "xid", 3, 79),
                ("gpu-h100-003", 9006, END - 3100, "xid", 4, 48)]
        db.executemany("INSERT INTO events (node, seq, ts, kind, gpu, data, verdict, body) "
                       "VALUES (?, ?, ?, ?, ?, ?, 'FAIL', x'80')", rows)
    return path, parse_config(CONFIG, path=str(tmp / "cfg.toml"))


def _model(seeded: tuple[Path, LoadedConfig]) -> dict[str, Any]:
    path, config = seeded
    return report_from_path(path, T0, END, config=config, generated_at=END)


def test_report_same_with_and_without_the_fast_paths(seeded: tuple[Path, LoadedConfig],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _model(seeded)
    assert {s["name"] for s in fast["availability"]["host_sets"]} >= {"a100", "h100", "hosts[3]"}
    assert fast["pin-drift"]["nodes_off_pin"] > 0

    monkeypatch.setattr(builder_module.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(builder_module, "THROTTLE_PARTS", 3)
    assert _model(seeded) == fast  # the scan in three node ranges

    def per_node(self: HostIndex, node: str) -> list[HostSection]:
        return [h for h in self.hosts if h.matches(node)]

    monkeypatch.setattr(HostIndex, "matching", per_node)
    monkeypatch.setattr(builder_module.Builder, "start_throttling", lambda self: None)
    assert _model(seeded) == fast  # ClusterShell per node, the scan in this thread


def test_report_xids_are_the_per_query_counts(seeded: tuple[Path, LoadedConfig]) -> None:
    """The one pass over the XID events counts what the three queries it replaced did."""
    path, _ = seeded
    model = _model(seeded)["xids"]
    w = (T0, END)
    with contextlib.closing(sqlite3.connect(path)) as db:
        nodes_of: dict[Any, list[dict[str, Any]]] = {}
        for code, node, count in db.execute(
                "SELECT data, node, count(*) FROM events WHERE kind = 'xid' AND ts > ? AND ts <= ? "
                "GROUP BY data, node ORDER BY count(*) DESC, node", w):
            nodes_of.setdefault(code, []).append({"node": node, "count": count})
        codes = [(code, count, nodes, gpus, nodes_of[code][:10]) for code, count, nodes, gpus in db.execute(
            "SELECT data, count(*), count(DISTINCT node), count(DISTINCT node || '/' || "
            "coalesce(gpu, '')) FROM events WHERE kind = 'xid' AND ts > ? AND ts <= ? "
            "GROUP BY data ORDER BY count(*) DESC, data", w)]
        nodes = db.execute("SELECT count(DISTINCT node) FROM events WHERE kind = 'xid' AND "
                           "ts > ? AND ts <= ?", w).fetchone()[0]
    assert [(c["xid"], c["count"], c["nodes"], c["gpus"], c["top_nodes"]) for c in model["codes"]] == codes
    assert model["nodes"] == nodes and model["total"] == sum(c[1] for c in codes)
    assert None in {c[0] for c in codes}  # (the events without an XID number are in)


def test_report_throttling_is_the_plain_scan(seeded: tuple[Path, LoadedConfig]) -> None:
    path, _ = seeded
    model = _model(seeded)["throttling"]
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT n.node, sum(s.reports), sum(s.hw_slowdown_reports), "
                          "sum(s.sw_thermal_reports) FROM nodes n CROSS JOIN node_samples s "
                          "ON s.node = n.node AND s.ts > ? AND s.ts <= ? GROUP BY n.node",
                          (T0, END)).fetchall()
    throttled = {r[0]: r[1:] for r in rows if r[1] and (r[2] or r[3])}
    assert (model["reports"], model["hw_slowdown_reports"], model["sw_thermal_reports"]) == \
        tuple(sum(r[i] for r in rows) for i in (1, 2, 3))
    assert model["nodes_sampled"] == len(rows) == 60
    assert model["nodes_throttled"] == len(throttled) > 0
    for leader in model["leaders_hw"] + model["leaders_sw"]:
        assert throttled[leader["node"]] == (leader["reports"], leader["hw_slowdown_reports"],
                                             leader["sw_thermal_reports"])


def test_chart_buckets_add_as_bucket_by_bucket() -> None:
    """``_Buckets.add`` adds whole buckets in one step: the same floats, bit for bit, as
    stepping bucket by bucket (the report's JSON does not move)."""
    from slurmgpu.report.model.common import CATEGORIES, _Buckets

    def stepwise(buckets: _Buckets, a: float, b: float, category: str) -> None:
        i = int((a - buckets.base) // buckets.size)
        while a < b and i < len(buckets.seconds):
            edge = min(b, buckets.base + (i + 1) * buckets.size)
            buckets.seconds[i][category] += edge - a
            a, i = edge, i + 1

    rnd = random.Random(15)
    for _ in range(500):
        t1 = END + rnd.choice([0.0, 0.5, 123.456])
        t0 = t1 - rnd.choice([7200, 86400, 2 * 86400, 30 * 86400, 90 * 86400 + 0.3])
        fast, slow = _Buckets(t0, t1), _Buckets(t0, t1)
        for _ in range(rnd.randint(1, 40)):
            a = rnd.choice([t0, t0 + rnd.random() * (t1 - t0), fast.base + rnd.randint(0, 95) * fast.size])
            b = rnd.choice([t1, a, a + fast.size, a + rnd.random() * (t1 - t0), t1 + 5000,
                            fast.base + rnd.randint(0, 95) * fast.size])
            category = rnd.choice(CATEGORIES)
            fast.add(a, b, category)
            stepwise(slow, a, b, category)
        assert [[repr(v) for v in s.values()] for s in fast.seconds] == \
            [[repr(v) for v in s.values()] for s in slow.seconds]


def test_current_findings_finds_the_latest_state_from_its_index(tmp_path: Path) -> None:
    """``/metrics``' findings query finds each node's latest state change in the index
    ``report_history_node_seq_ts`` alone (it read every history row before: ~1.7x the time
    at 30 history rows a node)."""
    store = Store(tmp_path / "m.db")
    plan = [str(row[3]) for row in store.db.execute("EXPLAIN QUERY PLAN " + queries.CURRENT_FINDINGS_SQL)]
    store.close()
    history = [step for step in plan if "report_history" in step]
    assert history and all("COVERING INDEX report_history_node_seq_ts" in step for step in history), plan
