"""The fleet collector: agents' reports, events and command results into SQLite.

``Store`` is the database (the ``store`` package); ``Collector`` the ZeroMQ CURVE server
(``server.py``, imported lazily so reading the store does not load zmq).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmgpu.collector.store import SCHEMA_VERSION, Store, StoreError

if TYPE_CHECKING:
    from slurmgpu.collector.server import Collector, CollectorError

__all__ = ["SCHEMA_VERSION", "Collector", "CollectorError", "Store", "StoreError"]


def __getattr__(name: str) -> Any:
    if name in ("Collector", "CollectorError"):
        from slurmgpu.collector import server

        return getattr(server, name)
    raise AttributeError(name)
