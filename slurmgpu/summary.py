"""The few numbers a report carries for the fleet history (``summary`` in a report body).

The collector keeps a node's facts as opaque bytes (decoding ~13 KB per report would
cost ingest throughput); what the fleet report trends over time — GPU error counters,
throttling, IB port counters, software versions — travels beside them in this small
dict (a few hundred bytes for 8 GPUs and 4 ports). See docs/fleet-db.md.
"""

from __future__ import annotations

from typing import Any

from slurmgpu.facts import GpuFacts, NodeFacts

# nvmlClocksEventReason* bits (nvml.h).
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
HW_ANY = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE
# IB port error counters kept in the history (sysfs names under ports/N/counters/).
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")


def _gpu(g: GpuFacts) -> dict[str, Any]:
    ecc, rows = g.ecc, g.remapped_rows
    reasons = g.clocks_event_reasons or 0
    return {
        "index": g.index,
        "model": g.name,
        "serial": g.serial,
        # Aggregate (lifetime) counts when the GPU keeps them: a volatile count resets at
        # each driver reload and would hide a trend.
        "ecc_corrected": None if ecc is None else _first(ecc.corrected_aggregate, ecc.corrected_volatile),
        "ecc_uncorrected": None if ecc is None else _first(ecc.uncorrected_aggregate,
                                                           ecc.uncorrected_volatile),
        "remap_corrected": None if rows is None else rows.correctable,
        "remap_uncorrected": None if rows is None else rows.uncorrectable,
        "remap_pending": None if rows is None else int(rows.pending),
        "remap_failure": None if rows is None else int(rows.failure),
        "hw_slowdown": int(bool(reasons & HW_ANY)),
        "sw_thermal": int(bool(reasons & SW_THERMAL)),
    }


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def summarize(facts: NodeFacts) -> dict[str, Any]:
    """The ``summary`` of a report body: ``gpus``, ``ib`` ports and ``versions``."""
    gpus = [_gpu(g) for g in facts.nvml.gpus if not g.lost]
    ports = []
    for hca in facts.ib.hcas:
        for port in hca.ports:
            ports.append({"port": f"{hca.name}/{port.port}", "state": port.state,
                          "rate_gbps": port.rate_gbps,
                          **{c: port.counters.get(c) for c in IB_COUNTERS}})
    v = facts.versions
    models = sorted({g.name for g in facts.nvml.gpus if g.name})
    vbios = sorted({g.vbios for g in facts.nvml.gpus if g.vbios})
    firmware = sorted({h.fw_ver for h in facts.ib.hcas if h.fw_ver})
    versions = {
        "gpu_model": ", ".join(models) or None,
        "driver": facts.nvml.driver_version,
        "cuda": facts.nvml.cuda_driver_version,
        "nccl": v.nccl,
        "vbios": ", ".join(vbios) or None,
        "ib_firmware": ", ".join(firmware) or None,
        "ofed": v.ofed,
        "kernel": v.kernel,
    }
    return {"gpus": gpus, "ib": ports, "versions": versions}
