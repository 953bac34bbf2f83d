"""Where facts come from. Each source is a small Protocol with a real
implementation (``nvml.py``, ``infiniband.py``, ``versions.py``) and a fake
(``slurmgpu.testing``) for logic tests; ``kmsg.py`` (XIDs in the kernel log: /dev/kmsg,
or the simulator's regular file in its record format) and ``procs.py`` (processes holding
device files) are read by path."""


from __future__ import annotations

import time
from typing import Protocol

from slurmgpu.facts import IbFacts, NvmlFacts, SoftwareVersions


class NvmlSource(Protocol):
    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        """Facts for every GPU, or only the GPUs (NVML indices) in ``gpus``."""
        ...


class IbSource(Protocol):
    def collect(self) -> IbFacts: ...


class VersionSource(Protocol):
    def collect(self) -> SoftwareVersions: ...


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
