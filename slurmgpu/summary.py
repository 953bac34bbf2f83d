"""The few numbers a report carries for the fleet history (``summary`` in a report body).

The collector keeps a node's facts as opaque bytes (decoding ~13 KB per report would
cost ingest throughput); what the fleet report trends over time — GPU error counters,
throttling, IB port counters, software versions — travels beside them in this small
map of positional lists (~600 bytes for 8 GPUs and 8 ports), pre-packed by the agent:
the collector compares the bytes with the node's previous report and decodes them only
when something changed. See docs/fleet-db.md. In a report body:

    "throttle": THROTTLE_HW | THROTTLE_SW bits (some GPU in HW slowdown / SW thermal),
    "summary": msgpack bytes of {"gpus": [[index, *GPU_FIELDS], ...],
                                 "ib": [[port, *IB_FIELDS], ...],   # port: "mlx5_0/1"
                                 "versions": [*VERSION_FIELDS]}
"""

from __future__ import annotations

from typing import Any

import msgpack

from slurmgpu.facts import GpuFacts, NodeFacts
from slurmgpu.wire import text_safe

# nvmlClocksEventReason* bits (nvml.h).
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
HW_ANY = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE
# IB port error counters kept in the history (sysfs names under ports/N/counters/).
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
GPU_FIELDS = ("serial", "model", "ecc_corrected", "ecc_uncorrected", "remap_corrected",
              "remap_uncorrected", "remap_pending", "remap_failure")
IB_FIELDS = ("state", "rate_gbps", *IB_COUNTERS)
THROTTLE_HW, THROTTLE_SW = 1, 2
VERSION_FIELDS = ("gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware", "ofed", "kernel")


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _gpu(g: GpuFacts) -> list[Any]:
    ecc, rows = g.ecc, g.remapped_rows
    return [
        g.index, g.serial, g.name,
        # Aggregate (lifetime) counts when the GPU keeps them: a volatile count resets at
        # each driver reload and would hide a trend.
        None if ecc is None else _first(ecc.corrected_aggregate, ecc.corrected_volatile),
        None if ecc is None else _first(ecc.uncorrected_aggregate, ecc.uncorrected_volatile),
        None if rows is None else rows.correctable,
        None if rows is None else rows.uncorrectable,
        None if rows is None else int(rows.pending),
        None if rows is None else int(rows.failure),
    ]


def summarize(facts: NodeFacts) -> dict[str, Any]:
    """The ``summary`` of a report body (format in the module docstring)."""
    live = [g for g in facts.nvml.gpus if not g.lost]
    reasons = [g.clocks_event_reasons or 0 for g in live]
    ports = [[f"{hca.name}/{port.port}", port.state, port.rate_gbps,
              *(port.counters.get(c) for c in IB_COUNTERS)]
             for hca in facts.ib.hcas for port in hca.ports]
    v = facts.versions
    models = sorted({g.name for g in facts.nvml.gpus if g.name})
    vbios = sorted({g.vbios for g in facts.nvml.gpus if g.vbios})
    firmware = sorted({h.fw_ver for h in facts.ib.hcas if h.fw_ver})
    versions = [", ".join(models) or None, facts.nvml.driver_version, facts.nvml.cuda_driver_version,
                v.nccl, ", ".join(vbios) or None, ", ".join(firmware) or None, v.ofed, v.kernel]
    return {"hw": int(any(r & HW_ANY for r in reasons)), "sw": int(any(r & SW_THERMAL for r in reasons)),
            "gpus": text_safe([_gpu(g) for g in live]), "ib": text_safe(ports), "versions": text_safe(versions)}


def report_fields(facts: NodeFacts) -> dict[str, Any]:
    """``throttle`` and the packed ``summary``, as the agent puts them in a report body."""
    summary = summarize(facts)
    throttle = (THROTTLE_HW if summary.pop("hw") else 0) | (THROTTLE_SW if summary.pop("sw") else 0)
    return {"throttle": throttle, "summary": msgpack.packb(summary, use_bin_type=True)}


def as_dict(summary: dict[str, Any]) -> dict[str, Any]:
    """The same summary with named fields (tests, debugging)."""
    return {"hw": summary.get("hw"), "sw": summary.get("sw"),
            "gpus": [{"index": g[0], **dict(zip(GPU_FIELDS, g[1:], strict=False))}
                     for g in summary.get("gpus") or ()],
            "ib": [{"port": p[0], **dict(zip(IB_FIELDS, p[1:], strict=False))} for p in summary.get("ib") or ()],
            "versions": dict(zip(VERSION_FIELDS, summary.get("versions") or (), strict=False))}
