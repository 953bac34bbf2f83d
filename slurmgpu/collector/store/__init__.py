"""The collector's store (``Store``), on SQLite or PostgreSQL (``backend``, ``postgres``):
its schema and migrations (``schema``), its writes (``ingest``), its named reads
(``queries``), the automation's state (``automation``), which collector leads
(``leader``), the tables several collectors share (``coordination``) and the copy of
a SQLite database into PostgreSQL (``copy``, `slurmgpu db copy`). docs/fleet-db.md
describes every table; docs/postgresql.md the second
backend."""

from __future__ import annotations

from slurmgpu.collector.store.automation import AutomationState
from slurmgpu.collector.store.core import Store
from slurmgpu.collector.store.leader import Leadership
from slurmgpu.collector.store.schema import SCHEMA_VERSION, StoreError

__all__ = ["SCHEMA_VERSION", "AutomationState", "Leadership", "Store", "StoreError"]
