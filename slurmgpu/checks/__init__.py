"""Every check module, imported once so each registers itself (see registry.py)."""

from slurmgpu.checks import gpu, infiniband, links, memory, pins, thermal, xid

__all__ = ["gpu", "infiniband", "links", "memory", "pins", "thermal", "xid"]
