"""NVML under a deadline: a hung GPU never hangs a check, a hook or the agent.

``DeadlineNvmlSource`` runs the real source's ``collect`` in a worker thread and waits
while each query answers within ``deadline_s``. When one does not (a GPU stuck in the
driver), the worker is abandoned where it stands, a thread blocked in a C call cannot be
stopped, and the gather returns what it has: the GPUs that answered, the GPU that did
not (``GpuFacts.unresponsive``: the query), and the GPUs not asked after it. While an
abandoned worker is still blocked, later collects start no second one and answer at once
from what the stuck gather had. ``abandoned()`` tells a one-shot command to leave through
``os._exit`` once its result is written.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import threading
import time
from typing import Protocol

from slurmgpu.facts import GpuFacts, NvmlFacts
from slurmgpu.sources.nvml import QueryWatch

_abandoned: list[threading.Thread] = []


def abandoned() -> bool:
    """Whether a worker of this process is still blocked in NVML."""
    return any(t.is_alive() for t in _abandoned)


def leave_if_stuck(code: int) -> None:
    """A one-shot command whose result is written: with a worker still blocked in NVML,
    exit with ``code`` through ``os._exit`` rather than an interpreter shutdown."""
    if abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class WatchedSource(Protocol):
    watch: QueryWatch

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts: ...


class _Worker:
    def __init__(self, source: WatchedSource, gpus: frozenset[int] | None) -> None:
        self.source, self.gpus = source, gpus
        self.result: NvmlFacts | None = None
        self.thread = threading.Thread(target=self._run, name="nvml-gather", daemon=True)

    def _run(self) -> None:
        self.result = self.source.collect(self.gpus)


class DeadlineNvmlSource:
    """``NvmlSource`` whose every query answers within ``deadline_s``, or is left behind."""

    def __init__(self, source: WatchedSource, deadline_s: float) -> None:
        self.source = source
        self.deadline_s = deadline_s
        self._stuck: _Worker | None = None
        self._stuck_facts: NvmlFacts | None = None
        self._lock = threading.Lock()

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        with self._lock:
            if self._stuck is not None and self._stuck.thread.is_alive():
                return _scoped(self._still_stuck(), gpus)
            self._stuck = None
            worker = _Worker(self.source, gpus)
            self.source.watch.at(None, "nvmlInit")
            worker.thread.start()
            while worker.thread.is_alive():
                left = self.source.watch.since + self.deadline_s - time.monotonic()
                if left <= 0:
                    return self._abandon(worker)
                worker.thread.join(min(left, 0.5))
            assert worker.result is not None
            return worker.result

    def _abandon(self, worker: _Worker) -> NvmlFacts:
        self._stuck = worker
        _abandoned.append(worker.thread)
        self._stuck_facts = stuck_facts(self.source.watch, worker.gpus, self.deadline_s)
        return copy.deepcopy(self._stuck_facts)

    def _still_stuck(self) -> NvmlFacts:
        """The stuck gather's facts, worded as when it was left behind: a drain reason the
        same on the warm and the cold path, and the same at every poll."""
        assert self._stuck_facts is not None
        return copy.deepcopy(self._stuck_facts)


def stuck_facts(watch: QueryWatch, wanted: frozenset[int] | None, deadline_s: float) -> NvmlFacts:
    """The facts of a gather stuck where ``watch`` says."""
    what = f"{watch.query} did not answer within {deadline_s:g} s"
    so_far = copy.deepcopy(watch.facts)
    if watch.gpu is None or so_far is None:
        return NvmlFacts(available=False, error=f"NVML not responding: {what}", unresponsive=what)
    done = {g.index for g in so_far.gpus}
    indices = range(so_far.device_count) if wanted is None else sorted(wanted)
    for index in (i for i in indices if i < so_far.device_count and i not in done):
        reason = what if index == watch.gpu else f"not asked: NVML did not answer on GPU {watch.gpu}"
        so_far.gpus.append(GpuFacts(index=index, unresponsive=reason))
    so_far.gpus.sort(key=lambda g: g.index)
    return so_far


def _scoped(facts: NvmlFacts, gpus: frozenset[int] | None) -> NvmlFacts:
    if gpus is None:
        return facts
    return dataclasses.replace(facts, gpus=[g for g in facts.gpus if g.index in gpus])
