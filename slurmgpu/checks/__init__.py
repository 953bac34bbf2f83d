"""Every check module, imported once so each registers itself (see registry.py).

Also the API a site plugin writes its checks with (docs/adding-a-check.md)::

    from slurmgpu.checks import CheckContext, Finding, Severity, check, ok, problem
"""

from slurmgpu.checks.registry import (
    CheckContext,
    check,
    not_applicable,
    ok,
    problem,
    unknown,
)
from slurmgpu.result import Finding, Severity

from slurmgpu.checks import gpu, host, infiniband, links, memory, nvswitch, pins, thermal, xid  # isort: skip

__all__ = [
    "CheckContext", "Finding", "Severity", "check", "gpu", "host", "infiniband", "links", "memory",
    "not_applicable", "nvswitch", "ok", "pins", "problem", "thermal", "unknown", "xid",
]
