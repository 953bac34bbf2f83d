"""The fleet collector: agents' reports, events and command results into SQLite.

``Store`` is the database (the ``store`` package). The collector process is
``transport.py`` (the ZeroMQ CURVE server: sockets, acks, heartbeats, commands),
``fleet.py`` (what a message does: store, automation, checkpoints, Slurm polling) and
``app.py``, where ``build_collector`` puts them together (imported lazily so reading the
store does not load zmq).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmgpu.collector.store import SCHEMA_VERSION, Store, StoreError

if TYPE_CHECKING:
    from slurmgpu.collector.app import Collector, CollectorError, build_collector

__all__ = ["SCHEMA_VERSION", "Collector", "CollectorError", "Store", "StoreError", "build_collector"]


def __getattr__(name: str) -> Any:
    if name in ("Collector", "CollectorError", "build_collector"):
        from slurmgpu.collector import app

        return getattr(app, name)
    raise AttributeError(name)
