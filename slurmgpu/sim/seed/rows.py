"""The rows the seeder collects, table by table, and the writes every episode is made of: a
report and its findings, an event, a decision, a node state, a counters sample."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgpack

from slurmgpu.decision import Action
from slurmgpu.result import Severity, worst

from .model import OK, Node, Row, catalog_names, message_seq

# The counters a sample changes, after its first two fields (serial, model / state, rate).
GPU_COUNTERS = ("ecc_corrected", "ecc_uncorrected", "remap_corrected", "remap_uncorrected",
                "remap_pending", "remap_failure")
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")


class Recorder:
    def __init__(self, rng: random.Random, start: float, end: float) -> None:
        self.rng, self.start, self.end = rng, start, end
        self.xids = catalog_names()
        self.history: list[tuple[Any, ...]] = []
        self.findings: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.decisions: list[tuple[Any, ...]] = []
        self.states: list[tuple[Any, ...]] = []
        self.gpu: list[tuple[Any, ...]] = []
        self.ib: list[tuple[Any, ...]] = []
        self.versions: list[tuple[Any, ...]] = []
        self.checkpoints: list[tuple[Any, ...]] = []
        self.job_events: list[tuple[Any, ...]] = []
        self.lemons: dict[str, dict[str, Any]] = {}
        self.drained: dict[str, dict[str, Any]] = {}
        self.job = 4_180_000
        self.ticket = 4100
        # counters' current values: (node, gpu) -> list; (node, port) -> list
        self.gpu_now: dict[tuple[str, int], list[Any]] = {}
        self.ib_now: dict[tuple[str, str], list[Any]] = {}

    def standing(self, node: Node, ts: float) -> list[Row]:
        return [(c, s, g, subj, m) for c, s, g, subj, m, a, b in node.standing if a <= ts < b]

    def report(self, node: Node, ts: float, bad: list[Row]) -> None:
        """A report_history row (and its findings): ``bad`` plus the standing findings."""
        rows = bad + self.standing(node, ts)
        verdict = worst(Severity[row[1]] for row in rows).name
        seq = message_seq(self.start, ts)
        self.history.append((node.name, seq, ts, verdict))
        self.findings.extend((node.name, seq, ts, *row) for row in rows)
        if ts <= self.end:
            node.verdict = verdict
            first = next((r for r in rows if r[1] == verdict), None)
            node.worst = None if first is None else (first[0], first[1], first[4], first[2])

    def event(self, node: Node, ts: float, kind: str, gpu: int | None, data: int | None,
              verdict: str, bad: list[Row], extra: dict[str, Any] | None = None) -> None:
        seq = message_seq(self.start, ts, event=True)
        body: dict[str, Any] = {"kind": kind, "gpu": gpu, "data": data, "verdict": verdict,
                                "findings": [{"check": c, "severity": s, "gpu": g, "subject": subj,
                                              "message": m} for c, s, g, subj, m in bad]}
        body.update(extra or {})
        self.events.append((node.name, seq, ts, kind, gpu, data, verdict,
                            msgpack.packb(body, use_bin_type=True)))
        self.findings.extend((node.name, seq, ts, *row) for row in bad if row[1] != OK)

    def decision(self, ts: float, node: Node, action: Action, reason: str, trigger: str,
                 result: str) -> None:
        self.decisions.append((ts, node.name, action, reason, 0, 0, trigger, result))

    def node_state(self, ts: float, node: Node, kind: str, reason: str | None, actor: str | None,
                   by: str | None = None) -> None:
        """A node_states row; ``by``: who drained it (drained_by, for ``drained`` rows)."""
        self.states.append((node.name, ts, kind, reason, actor, by))

    def set_gpu(self, node: Node, gpu: int, ts: float, **changes: int) -> None:
        self._sample(self.gpu_now, self.gpu, (node.name, gpu), GPU_COUNTERS, ts, changes)

    def set_ib(self, node: Node, port: str, ts: float, **changes: int) -> None:
        self._sample(self.ib_now, self.ib, (node.name, port), IB_COUNTERS, ts, changes)

    @staticmethod
    def _sample(now: Mapping[Any, list[Any]], rows: list[tuple[Any, ...]], key: tuple[str, Any],
                names: tuple[str, ...], ts: float, changes: dict[str, int]) -> None:
        """A counters row: the current values (two fields, then ``names``) with ``changes``."""
        cur = now[key]
        for name, value in changes.items():
            cur[2 + names.index(name)] = value
        rows.append((*key, ts, *cur))
