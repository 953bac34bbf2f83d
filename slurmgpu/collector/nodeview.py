"""The per-node ``/metrics`` families kept between scrapes (issue 15, part 3): ``NodeView``.

A 10,000-node scrape that read every node's row and every node's current findings, then
formatted ~34,000 lines, took 100-160 ms. A ``NodeView`` keeps each node's row, the label
part of each of its lines and its current findings, and after a commit reads only the nodes
written since its last reading (schema 12: ``node_version`` and ``nodes.changed``,
``nodes.history_changed``; ``queries.node_changes``, ``queries.current_findings_since``).
``metrics.FleetMetrics`` turns it into families; what it writes is byte for byte what a
whole reading writes (``FleetMetrics._families``).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from slurmgpu.collector.exposition import NodeFamily
from slurmgpu.collector.store import queries
from slurmgpu.result import Severity

# Gauge value of a verdict / a finding's severity (its exit code: OK 0, WARN 1, FAIL 2, UNKNOWN 3).
VERDICT_CODE = {s.name: s.exit_code for s in Severity}
# A severity's rank (as the store orders them: OK < WARN < UNKNOWN < FAIL) -> its code.
RANK_CODE = {s.rank: s.exit_code for s in Severity}
# At most this many per-GPU series per node (label cardinality from what nodes send).
MAX_GPU_SERIES_PER_NODE = 128

# A scrape reads every node again (not only those written since the last reading) at
# least this often (a bound on what a write outside the collector, which sets no
# ``nodes.changed``, could leave unseen); and every node's current findings when the
# history of more than 1/FULL_READ_SHARE of them changed (one query is then cheaper).
FULL_READ_S = 300.0
FULL_READ_SHARE = 4


def verdict_name(verdict: str | None) -> str:
    name = str(verdict).upper() if verdict else Severity.UNKNOWN.name
    return name if name in VERDICT_CODE else Severity.UNKNOWN.name


class _GpuRows(NamedTuple):
    """One node's ``slurmgpu_gpu_verdict`` samples."""

    gpus: list[str]
    codes: list[int]
    prefixes: list[str]
    dropped: int  # series over MAX_GPU_SERIES_PER_NODE


class NodeView:
    """The per-node families kept between scrapes (issue 15): each node's row, the label
    part of its lines, its current findings. A store read brings it up to date from the
    nodes written since the last one's snapshot (``queries.node_changes``: schema 12's
    ``nodes.changed``), and their findings only when their history was written
    (``nodes.history_changed``); a scrape then formats the values (its last-seen ages
    are its own) and joins the kept lines.

    Everything is read again (``_full``) on any doubt: the first read, a connection
    opened again (a restart, a failover, another database), a counter missing (an older
    schema) or gone back, a node count that the changed rows do not explain (a node
    deleted), and every ``FULL_READ_S``; the findings of every node when the history
    changed without a node marked (a prune marks them all) or that of many nodes did.
    A read that fails may leave it half-applied: the caller ``reset()``s it. One user at
    a time (``FleetMetrics``' store lock)."""

    def __init__(self) -> None:
        self.full_reads = 0  # (tests)
        self.partial_reads = 0
        self.findings_reads = 0  # whole readings of the current findings
        self.reset()

    def reset(self) -> None:
        self.opened = -1  # the reader's connection (``Reader.opened``) the rows came from
        self.version = -1  # node_version of the last reading
        self.history_version = -1
        self.read_at = -float("inf")  # (monotonic) of the last full reading
        self.order: list[str] = []  # every node, in the store's order (``queries.node_changes``)
        self.keys: dict[str, Any] = {}  # node -> its place in that order
        self.index: dict[str, int] = {}
        self.last_seen: list[float] = []
        self.reachable: list[int] = []
        self.codes: list[int] = []  # verdict codes
        self.names: list[str] = []  # verdict names
        self.by_verdict: dict[str, int] = dict.fromkeys(VERDICT_CODE, 0)
        self._prefixes: dict[str, list[str]] = {}  # family -> its lines' label part, by ``order``
        self._drained: tuple[frozenset[str], list[str], list[int], list[str]] | None = None
        self.findings: dict[str, list[queries.FindingCount]] = {}
        self.per_check: dict[tuple[str, str], int] = {}
        self.gpu: dict[str, _GpuRows] = {}
        self.dropped = 0
        self._gpu_family: tuple[list[str], list[str], list[int], list[str]] | None = None

    # ------------------------------------------------------------------ reading

    def refresh(self, db: queries.Connection, opened: int) -> None:
        version, history_version = queries.node_version(db), queries.history_version(db)
        if (version < 0 or history_version < 0 or self.version < 0 or opened != self.opened
                or version < self.version or time.monotonic() - self.read_at >= FULL_READ_S):
            self._full(db, opened, version, history_version)
            return
        changes = queries.node_changes(db, self.version)
        cols = changes.columns
        added = {n: k for n, k in zip(cols.nodes, changes.keys, strict=True) if n not in self.index}
        if changes.total != len(self.order) + len(added):  # (a node deleted)
            self._full(db, opened, version, history_version)
            return
        history = set(changes.history)
        whole = ((history_version != self.history_version and not history)  # (a write that marks none)
                 or len(history) * FULL_READ_SHARE > changes.total)
        findings = (queries.current_findings(db) if whole
                    else queries.current_findings_since(db, self.version) if history else [])
        self.partial_reads += 1
        self._set_rows(cols, added)
        if whole:
            self._replace_findings(findings)
        else:
            per_node: dict[str, list[queries.FindingCount]] = {n: [] for n in history}
            for row in findings:
                per_node.setdefault(row.node, []).append(row)
            for node, rows in per_node.items():
                self._set_findings(node, rows)
        self.version, self.history_version = version, history_version

    def _full(self, db: queries.Connection, opened: int, version: int, history_version: int) -> None:
        changes = queries.node_changes(db, -1)
        cols = changes.columns
        findings = (queries.current_findings(db)
                    if history_version < 0 or history_version != self.history_version
                    or opened != self.opened or self.version < 0
                    else None)  # (unchanged history, the same connection: kept)
        kept = self.findings, self.per_check, self.gpu, self.dropped, self._gpu_family
        self.reset()
        self.full_reads += 1
        self.opened, self.version, self.history_version = opened, version, history_version
        self.read_at = time.monotonic()
        self._set_rows(cols, dict(zip(cols.nodes, changes.keys, strict=True)))
        if findings is None:
            self.findings, self.per_check, self.gpu, self.dropped, self._gpu_family = kept
        else:
            self._replace_findings(findings)

    def _replace_findings(self, findings: list[queries.FindingCount]) -> None:
        """Every node's current findings (a whole reading)."""
        self.findings_reads += 1
        self.findings, self.per_check, self.gpu, self.dropped, self._gpu_family = {}, {}, {}, 0, None
        per_node: dict[str, list[queries.FindingCount]] = {}
        for row in findings:
            per_node.setdefault(row.node, []).append(row)
        for node, rows in per_node.items():
            self._set_findings(node, rows)

    def _set_rows(self, cols: queries.NodeVerdictColumns, added: dict[str, Any]) -> None:
        """The rows of these nodes (``added``: those not in ``order`` yet, with their keys)."""
        if added:  # a new node: the lists in the new order
            old = dict(zip(self.order, zip(self.last_seen, self.reachable, self.names, strict=True),
                           strict=True))
            self.keys.update(added)
            self.order = sorted([*self.order, *added], key=self.keys.__getitem__)
            self.index = {n: i for i, n in enumerate(self.order)}
            self.last_seen, self.reachable, self.names = (
                [0.0] * len(self.order), [0] * len(self.order), [Severity.UNKNOWN.name] * len(self.order))
            for node, (seen, reachable, name) in old.items():
                i = self.index[node]
                self.last_seen[i], self.reachable[i], self.names[i] = seen, reachable, name
            self.by_verdict = dict.fromkeys(VERDICT_CODE, 0)
            for name in self.names:
                self.by_verdict[name] += 1
            self.codes = [VERDICT_CODE[n] for n in self.names]
            self._prefixes = {}
            self._drained = None
        index, by_verdict = self.index, self.by_verdict
        for node, seen, reachable, verdict in zip(*cols, strict=True):
            i = index[node]
            name = verdict_name(verdict)
            if name != self.names[i]:
                by_verdict[self.names[i]] -= 1
                by_verdict[name] += 1
                self.names[i], self.codes[i] = name, VERDICT_CODE[name]
            self.last_seen[i], self.reachable[i] = seen, reachable

    def _set_findings(self, node: str, rows: list[queries.FindingCount]) -> None:
        """The node's current findings (none: ``rows`` empty)."""
        per_check = self.per_check
        for row in self.findings.pop(node, ()):
            key = (str(row.check), str(row.severity))
            per_check[key] -= row.n
            if not per_check[key]:
                del per_check[key]
        ranks: dict[int, int] = {}
        for row in rows:
            key = (str(row.check), str(row.severity))
            per_check[key] = per_check.get(key, 0) + row.n
            if row.gpu is not None and row.rank > ranks.get(row.gpu, 0):
                ranks[row.gpu] = row.rank
        if rows:
            self.findings[node] = rows
        old = self.gpu.pop(node, None)
        if old is not None:
            self.dropped -= old.dropped
        if ranks or old is not None:
            self._gpu_family = None
        if ranks:
            items = sorted(ranks.items())
            kept = items[:MAX_GPU_SERIES_PER_NODE]
            gpus = [str(g) for g, _ in kept]
            prefixes = NodeFamily("slurmgpu_gpu_verdict", "", ["node", "gpu"],
                                  [[str(node)] * len(gpus), gpus]).prefixes()
            self.gpu[node] = _GpuRows(gpus, [RANK_CODE[r] for _, r in kept], prefixes, len(items) - len(kept))
            self.dropped += len(items) - len(kept)

    # ------------------------------------------------------------------ families

    def prefixes(self, name: str) -> list[str]:
        """The label part of each node's line of family ``name`` (kept until a node is added)."""
        kept = self._prefixes.get(name)
        if kept is None:
            kept = self._prefixes[name] = NodeFamily(name, "", ["node"], [self.order]).prefixes()
        return kept

    def drained(self, drained: set[str]) -> tuple[list[str], list[int], list[str]]:
        """``slurmgpu_node_drained``'s nodes, values and prefixes (kept while the drained
        set and the nodes are)."""
        if self._drained is None or self._drained[0] != drained:
            gone = drained.difference(self.index)
            known = sorted([*self.order, *gone] if gone else self.order)
            self._drained = (frozenset(drained), known, [1 if name in drained else 0 for name in known],
                             NodeFamily("slurmgpu_node_drained", "", ["node"], [known]).prefixes())
        return self._drained[1], self._drained[2], self._drained[3]

    def gpu_family(self) -> tuple[list[str], list[str], list[int], list[str]]:
        """``slurmgpu_gpu_verdict``'s node and GPU columns, codes and prefixes, by node and GPU."""
        if self._gpu_family is None:
            nodes: list[str] = []
            gpus: list[str] = []
            codes: list[int] = []
            prefixes: list[str] = []
            for node in sorted(self.gpu):
                rows = self.gpu[node]
                nodes += [str(node)] * len(rows.gpus)
                gpus += rows.gpus
                codes += rows.codes
                prefixes += rows.prefixes
            self._gpu_family = (nodes, gpus, codes, prefixes)
        return self._gpu_family


