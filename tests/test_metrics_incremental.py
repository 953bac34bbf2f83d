"""Issue 15: the incremental ``/metrics`` scrape (``metrics.NodeView``, schema 12's
``node_version``): after every kind of write, a scrape that read only the nodes written
since the last one writes what a whole reading of the store writes."""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator

import pytest

from slurmgpu.collector import metrics as metrics_module
from slurmgpu.collector.counters import Counters
from slurmgpu.collector.exposition import _Families, generate
from slurmgpu.collector.metrics import FleetMetrics, StoreReads
from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.store.backend import is_postgres
from slurmgpu.wire import HELLO, REPORT, Envelope

NOW = 1.9e9
NODES = [f"n{i:02d}" for i in range(12)]


def report(node: str, seq: int, verdict: str, gpus: tuple[int, ...] = ()) -> tuple[str, Envelope]:
    findings = [{"check": "ecc.uncorrected", "severity": verdict, "gpu": g, "message": "m"} for g in gpus]
    return node, Envelope(type=REPORT, node=node, seq=seq, ts=NOW - 1000 + seq,
                          body={"verdict": verdict, "findings": findings, "facts": {}})


class Scrapes:
    """A FleetMetrics over ``store`` and the reference: the same families from a whole reading."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.drained: set[str] = {"n00", "not-heard-from"}
        status = types.SimpleNamespace(status=lambda: {"drained": sorted(self.drained)})
        self.fleet = FleetMetrics(types.SimpleNamespace(  # type: ignore[arg-type]
            counters=Counters(), allowed={}, store=store, log=None, automation=status))
        clock = types.SimpleNamespace(time=lambda: NOW, monotonic=time.monotonic,
                                      perf_counter=time.perf_counter)
        monkeypatch.setattr(metrics_module, "time", clock)

    def check(self, *, partial: bool) -> bytes:
        """One scrape, compared with the reference; ``partial``: it read only what changed."""
        view = self.fleet._view
        before = view.partial_reads, view.full_reads
        body = generate(_Families(self.fleet._store(set(self.drained)) or []))
        reference = generate(_Families(self.fleet._families(StoreReads.read(self.store.db), set(self.drained))))
        if is_postgres(self.store.path):  # (PostgreSQL: the reference is in the heap's order)
            assert sorted(body.splitlines()) == sorted(reference.splitlines())
        else:
            assert body == reference
        assert (view.partial_reads, view.full_reads) == (
            (before[0] + 1, before[1]) if partial else (before[0], before[1] + 1))
        return body


@pytest.fixture
def scrapes(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scrapes]:
    store = Store(store_url)
    store.store_batch([report(n, 1, "FAIL" if i % 3 == 0 else "OK", (1, 5) if i % 3 == 0 else ())
                       for i, n in enumerate(NODES)], received_at=NOW - 100)
    s = Scrapes(store, monkeypatch)
    s.check(partial=False)  # (the first reading is whole)
    try:
        yield s
    finally:
        s.fleet.close()
        store.close()


def lines(body: bytes, node: str) -> list[bytes]:
    return sorted(line for line in body.splitlines() if f'node="{node}"'.encode() in line)


def test_a_state_change_is_read_for_that_node_only(scrapes: Scrapes) -> None:
    scrapes.store.store_batch([report("n00", 2, "OK")], received_at=NOW - 10)  # FAIL -> OK
    body = scrapes.check(partial=True)
    assert b'slurmgpu_node_verdict{node="n00"} 0.0' in body
    assert b'slurmgpu_gpu_verdict{gpu="1",node="n00"}' not in body
    scrapes.store.store_batch([report("n01", 2, "WARN", (3,))], received_at=NOW - 5)  # OK -> WARN
    body = scrapes.check(partial=True)
    assert b'slurmgpu_gpu_verdict{gpu="3",node="n01"} 1.0' in body
    assert b'slurmgpu_findings{check="ecc.uncorrected",severity="WARN"} 1.0' in body
    scrapes.store.store_batch([report("n01", 3, "WARN", (3,))], received_at=NOW - 2)  # the same state
    body = scrapes.check(partial=True)
    assert b'slurmgpu_node_last_seen_seconds{node="n01"} 2.0' in body
    before = scrapes.fleet.store_reads  # nothing committed since: nothing read
    body2 = generate(_Families(scrapes.fleet._store(set(scrapes.drained)) or []))
    assert body2 == body and scrapes.fleet.store_reads == before


def test_a_new_node_and_a_silent_one(scrapes: Scrapes) -> None:
    scrapes.store.store_batch([("a-new", Envelope(type=HELLO, node="a-new", seq=1, ts=NOW,
                                                  body={"version": "1", "gpus": 8, "interval_s": 15.0}))],
                              received_at=NOW - 100)
    body = scrapes.check(partial=True)
    assert lines(body, "a-new") == sorted([
        b'slurmgpu_node_drained{node="a-new"} 0.0', b'slurmgpu_node_last_seen_seconds{node="a-new"} 100.0',
        b'slurmgpu_node_reachable{node="a-new"} 1.0', b'slurmgpu_node_verdict{node="a-new"} 3.0'])
    assert b"slurmgpu_fleet_nodes 13.0" in body
    reads = scrapes.fleet._view.findings_reads
    scrapes.store.store_batch([report(n, 5, "OK") for n in NODES[1:]], received_at=NOW)  # (3 FAIL -> OK)
    assert scrapes.store.mark_unreachable(NOW, 50) == ["a-new", "n00"]  # (silent for 100 s)
    scrapes.check(partial=True)  # (every node written: their rows, and the findings of the 3)
    assert scrapes.fleet._view.findings_reads == reads
    scrapes.store.store_batch([report("n00", 6, "OK")], received_at=NOW)  # back
    body = scrapes.check(partial=True)
    assert b'slurmgpu_node_reachable{node="n00"} 1.0' in body
    assert b'slurmgpu_node_reachable{node="a-new"} 0.0' in body


def test_a_drained_set_change_and_a_removed_node(scrapes: Scrapes) -> None:
    scrapes.drained = {"n03", "n04"}
    body = generate(_Families(scrapes.fleet._store(set(scrapes.drained)) or []))  # (nothing committed)
    assert b'slurmgpu_node_drained{node="n03"} 1.0' in body
    assert b'slurmgpu_node_drained{node="n00"} 0.0' in body and b"not-heard-from" not in body
    scrapes.store.store_batch([report("n05", 2, "OK")], received_at=NOW)
    assert scrapes.check(partial=True) and scrapes.fleet._view.findings_reads == 1  # (the first)
    with scrapes.store.transaction() as db:  # (nothing in slurmgpu deletes a node: by hand)
        db.execute("DELETE FROM nodes WHERE node = 'n07'")
        db.execute("DELETE FROM reports WHERE node = 'n07'")
    body = scrapes.check(partial=False)  # (a node count the changed rows do not explain)
    assert b'node="n07"' not in body and b"slurmgpu_fleet_nodes 11.0" in body


def test_pruned_history_and_a_new_connection_read_everything(scrapes: Scrapes) -> None:
    scrapes.store.store_batch([report("n02", 2, "FAIL", (4,))], received_at=NOW)
    scrapes.check(partial=True)
    reads = scrapes.fleet._view.findings_reads
    assert scrapes.store.prune(0.0, now=NOW + 10**6) > 0  # (every node's current state is history)
    body = scrapes.check(partial=True)
    assert scrapes.fleet._view.findings_reads == reads + 1  # (the prune marks every node)
    assert b"slurmgpu_gpu_verdict{" not in body
    scrapes.store.store_batch([report("n02", 3, "FAIL", (4,))], received_at=NOW)  # recorded again
    body = scrapes.check(partial=True)
    assert b'slurmgpu_gpu_verdict{gpu="4",node="n02"} 2.0' in body
    assert scrapes.fleet._reader is not None
    scrapes.fleet._reader.close()  # (a restart, a failover: another connection)
    scrapes.store.store_batch([report("n02", 4, "OK")], received_at=NOW)
    scrapes.check(partial=False)


def test_node_changes_and_the_findings_of_changed_nodes(store_url: str) -> None:
    """The store side: ``node_version`` and ``nodes.changed``/``history_changed``."""
    with contextlib.closing(Store(store_url)) as store:
        store.store_batch([report(n, 1, "FAIL", (2,)) for n in NODES[:3]], received_at=NOW)
        v = queries.node_version(store.db)
        store.store_batch([report("n01", 2, "FAIL", (2,)), ("n02", Envelope(
            type=HELLO, node="n02", seq=9, ts=NOW, body={"version": "2"}))], received_at=NOW)
        changes = queries.node_changes(store.db, v)
        assert sorted(changes.columns.nodes) == ["n01", "n02"] and changes.history == [] and changes.total == 3
        assert queries.current_findings_since(store.db, v) == []
        store.store_batch([report("n01", 3, "WARN", (6,))], received_at=NOW)
        changes = queries.node_changes(store.db, v)
        assert changes.history == ["n01"]
        assert [(f.node, f.gpu, f.severity) for f in queries.current_findings_since(store.db, v)] == [
            ("n01", 6, "WARN")]
        assert len(queries.node_changes(store.db, -1).columns.nodes) == 3
