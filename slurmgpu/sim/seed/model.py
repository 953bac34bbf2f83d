"""The seeded fleet's model: its hardware and software stack, its faults and their rates, a
node and a fault episode as the seeder writes them, and the shared decision vocabulary
(``slurmgpu.decision``, ``slurmgpu.result``) in the words the database holds."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.decision import XID_ACTION_SEVERITY, Action, PolicyTable
from slurmgpu.errors import SlurmGpuError
from slurmgpu.result import Finding, Severity

HOUR = 3600.0
DAY = 86400.0
REPORT_S = 15.0  # the agent's interval: 240 reports an hour
REPORTS_PER_HOUR = int(HOUR / REPORT_S)
GPUS = 8
PORTS = ("mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1")

# Pinned stack per model (what etc/report-demo.toml accepts).
MODELS: dict[str, dict[str, Any]] = {
    "a100": {"gpu_model": "NVIDIA A100-SXM4-80GB", "driver": "550.90.07", "cuda": "12.4",
             "nccl": "2.21.5", "vbios": "92.00.45.00.06", "ib_firmware": "20.39.1002",
             "ofed": "24.01-0.3.3", "kernel": "5.15.0-113-generic", "rate_gbps": 200.0,
             "serial": "1323"},
    "h100": {"gpu_model": "NVIDIA H100 80GB HBM3", "driver": "550.90.07", "cuda": "12.4",
             "nccl": "2.21.5", "vbios": "96.00.99.00.01", "ib_firmware": "28.39.1002",
             "ofed": "24.01-0.3.3", "kernel": "5.15.0-113-generic", "rate_gbps": 400.0,
             "serial": "1654"},
}
A100_FRACTION = 0.4
# Drift: (field, check, value per model, message). Values violate etc/report-demo.toml.
DRIFTS: list[tuple[str, str, dict[str, str]]] = [
    ("driver", "pin.driver", {"a100": "535.183.01", "h100": "535.183.01"}),
    ("vbios", "pin.vbios", {"a100": "92.00.36.00.02,92.00.45.00.06", "h100": "96.00.74.00.0b"}),
    ("ib_firmware", "pin.ib_firmware", {"a100": "20.37.1014", "h100": "28.37.1014"}),
    ("nccl", "pin.nccl", {"a100": "2.18.3", "h100": "2.18.3"}),
]
UPGRADE_FROM = "535.183.01"  # the mid-month upgrade: this driver -> the pinned one

# Application XIDs (say nothing about the node): code -> weight.
APP_XIDS = {13: 30, 31: 40, 43: 25, 45: 4, 68: 1}
# Hardware XID episodes per model: code -> weight (48 and 63/64 come with ECC/remap episodes).
HW_XIDS = {"a100": {74: 8, 79: 5, 94: 3, 95: 2, 119: 0, 63: 5},
           "h100": {74: 6, 79: 4, 94: 6, 95: 3, 119: 7, 63: 5}}
# Fault episode kinds: weight.
FAULTS = {"xid": 45, "ecc": 10, "remap": 10, "remap-failure": 2, "thermal": 8, "ib": 12}
FAULT_RATE = 0.15  # fault episodes per node per 30 days
OPERATORS = ("alice", "bob", "carol")
MAINTENANCE = ("maintenance: BMC firmware update", "maintenance: replace PSU",
               "maintenance: OS reimage", "maintenance: NVSwitch tray swap",
               "maintenance: cable reseat (ticket OPS-{n})", "maintenance: rack power work")
USERS = ("u1021", "u2203", "u3117", "u4410", "u5062", "u6634", "u7718")

# Severities as the database holds them (``Severity.name``: findings, verdicts, event bodies).
OK, WARN, FAIL = Severity.OK.name, Severity.WARN.name, Severity.FAIL.name
# Reports in a row before a thermal.throttle WARN drains (``[automation] strikes``).
THERMAL_STRIKES = 3


class SeedError(SlurmGpuError):
    """The database already holds a fleet (seed only an empty file)."""


# A finding row: (check, severity name, gpu, subject, message).
Row = tuple[Any, ...]


@dataclass
class Node:
    name: str
    model: str
    index: int
    versions: dict[str, str]
    # standing findings: (check, severity, gpu, subject, message, valid_from, valid_to)
    standing: list[tuple[str, str, int | None, str | None, str, float, float]] = field(default_factory=list)
    fails: list[tuple[float, float]] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    throttle: list[tuple[float, float, float]] = field(default_factory=list)
    chronic: float = 0.0  # share of HW slowdown reports in a throttling hour
    noise: float = 0.0  # probability of an hour with a few HW slowdown reports
    verdict: str = OK
    worst: tuple[str, str, str, int | None] | None = None
    unreachable_since: float | None = None
    last_seen: float = 0.0


@dataclass
class Episode:
    """A fault episode being written: what its onset found, what the automation then does."""
    kind: str
    gpu: int
    t0: float  # its first report
    t_fix: float  # when it is repaired (> end: still open)
    action: Action = Action.DRAIN
    trigger: str = ""
    severity: str = FAIL
    bad: list[Row] = field(default_factory=list)
    ckpt_deadline: float = 0.0


def finding(row: Row) -> Finding:
    """A finding row as a ``Finding`` (for the shared drain reasons)."""
    check, severity, gpu, subject, message = row
    return Finding(check, Severity[severity], message, gpu, subject)


@functools.cache
def _policy() -> PolicyTable:
    from slurmgpu.config.schema import AutomationSettings

    return PolicyTable(AutomationSettings())


def xid_action(xid: int, catalog_action: str) -> Action:
    """What the automation does about a hardware XID: ``decision.PolicyTable``'s rule for the
    agent's ``xid.recent`` finding (severity ``XID_ACTION_SEVERITY``) under the default
    ``[automation]`` settings: ``DRAIN_NOW_XIDS`` drain at once, ``XID_POLICY`` otherwise,
    a reboot (not allowed) a drain, an ignored XID nothing."""
    data = {"xid": xid, "action": catalog_action}
    return _policy().action(Finding("xid.recent", XID_ACTION_SEVERITY[catalog_action], "", data=data))


def catalog_names() -> dict[int, tuple[str, str]]:
    from slurmgpu.xid import catalog

    return {code: (rule.name, rule.action) for code, rule in catalog().items()}


def weighted(rng: random.Random, table: dict[Any, int]) -> Any:
    keys = [k for k, w in table.items() if w > 0]
    return rng.choices(keys, weights=[table[k] for k in keys])[0]


def message_seq(start: float, ts: float, event: bool = False) -> int:
    """A node's message seq at ``ts`` (one report every 15 s; events take odd numbers)."""
    return int(max(0.0, ts - start) / REPORT_S) * 2 + (3 if event else 2)
