"""The collector's SQLite store (``Store``): its schema and migrations (``schema``), its
writes (``ingest``), its named reads (``queries``) and the automation's state
(``automation``). docs/fleet-db.md describes every table."""

from __future__ import annotations

from slurmgpu.collector.store.automation import AutomationRecord, AutomationState
from slurmgpu.collector.store.core import Store
from slurmgpu.collector.store.ingest import (
    DECISION_SLACK_S,
    MAX_HIGH_WATER,
    BatchItem,
    Conflict,
    MessageKey,
    Transaction,
)
from slurmgpu.collector.store.schema import MIGRATIONS, SCHEMA_VERSION, StoreError

__all__ = ["DECISION_SLACK_S", "MAX_HIGH_WATER", "MIGRATIONS", "SCHEMA_VERSION", "AutomationRecord",
           "AutomationState", "BatchItem", "Conflict", "MessageKey", "Store", "StoreError", "Transaction"]
