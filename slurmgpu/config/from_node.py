"""A drop-in that pins what a node has (``slurmgpu config init --from-this-node``).

From one node's facts: the driver, the VBIOS versions, the GPU model(s) and count, the
NVLinks active per GPU, the InfiniBand ports the ``[ib]`` settings put in scope and their
rate, the firmware of their HCAs, and the CUDA and NCCL versions. Each pin is exactly what
the node has (so the file is a baseline to compare the fleet against, as NHC's
``nhc-genconf`` writes one); what the node lacks is left unpinned, with a comment saying
so. Anything that looks unhealthy while the baseline is taken (a port down, a GPU with
fewer links than the others) is named in ``Baseline.notes``: pinning it would bless it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmgpu.config.schema import IbSettings
from slurmgpu.config.tomltext import format_value
from slurmgpu.facts import NodeFacts


@dataclass
class Baseline:
    """The tables to write (``{"gpu": {"count": 8}, ...}``), what was left unpinned and why,
    and what looked wrong on the node."""

    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    unpinned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def pin(self, table: str, key: str, value: Any) -> None:
        self.tables.setdefault(table, {})[key] = value

    def pin_or_say(self, table: str, key: str, values: list[str], missing: str) -> None:
        """Pin the sorted distinct ``values``; none found: say why it stays unpinned."""
        found = sorted({v for v in values if v})
        if found:
            self.pin(table, key, found)
        else:
            self.unpinned.append(f"{table}.{key}: {missing}")


def baseline(facts: NodeFacts, ib: IbSettings) -> Baseline:
    """What ``facts`` says the node has, as pins (``ib``: which ports are in scope)."""
    out = Baseline()
    gpu_pins(facts, out)
    nvlink_pins(facts, out)
    version_pins(facts, out)
    ib_pins(facts, ib, out)
    return out


def gpu_pins(facts: NodeFacts, out: Baseline) -> None:
    nvml = facts.nvml
    if not nvml.available:
        out.pin("gpu", "count", 0)
        out.notes.append(f"NVML unavailable ({nvml.error}): pinned as a node without GPUs")
        return
    out.pin("gpu", "count", nvml.device_count)
    live = [g for g in nvml.gpus if not g.lost]
    out.notes += [f"GPU {g.index} is lost (fell off the bus)" for g in nvml.gpus if g.lost]
    out.pin_or_say("gpu", "model", [g.name or "" for g in live], "NVML names no GPU model")
    out.pin_or_say("pins", "driver", [nvml.driver_version or ""], "driver version unknown")
    out.pin_or_say("pins", "vbios", [g.vbios or "" for g in live], "no GPU reports a VBIOS version")


def nvlink_pins(facts: NodeFacts, out: Baseline) -> None:
    active = {g.index: sum(1 for link in g.nvlinks or [] if link.active)
              for g in facts.nvml.gpus if not g.lost}
    if not any(active.values()):
        out.unpinned.append("nvlink.links: no active NVLink on this node")
        return
    most = max(active.values())
    out.pin("nvlink", "links", most)
    out.notes += [f"GPU {i} has {n} active NVLinks, the others up to {most}"
                  for i, n in sorted(active.items()) if n < most]


def version_pins(facts: NodeFacts, out: Baseline) -> None:
    v = facts.versions
    out.pin_or_say("pins", "cuda", [v.cuda_toolkit or v.cuda_runtime or ""],
                   "no CUDA toolkit or runtime found")
    out.pin_or_say("pins", "cuda_driver", [facts.nvml.cuda_driver_version or ""],
                   "the driver reports no CUDA version")
    out.pin_or_say("pins", "nccl", [v.nccl or ""], "libnccl.so.2 not found")


def ib_pins(facts: NodeFacts, ib: IbSettings, out: Baseline) -> None:
    """The ports the IB checks judge under ``ib``: how many, their rate, their firmware."""
    from slurmgpu.checks.infiniband import ports_in_scope

    ports = ports_in_scope(facts.ib.hcas, ib)
    if not ports:
        out.unpinned.append("ib.count, ib.rate_gbps, pins.ib_firmware: no InfiniBand port in scope")
        return
    out.pin("ib", "count", len(ports))
    down = [f"{h.name}/{p.port}" for h, p in ports if p.state != "ACTIVE"]
    if down:
        out.notes.append(f"InfiniBand port(s) not ACTIVE: {', '.join(down)} (counted: "
                         "bring them up, or leave them out with [ib] devices)")
    rates = [p.rate_gbps for _, p in ports if p.state == "ACTIVE" and p.rate_gbps]
    if rates:
        out.pin("ib", "rate_gbps", min(rates))
    out.pin_or_say("pins", "ib_firmware", [h.fw_ver or "" for h, _ in ports],
                   "no HCA reports its firmware")


def render(facts: NodeFacts, found: Baseline, *, generator: str) -> str:
    """The drop-in's text: a header naming the node and the command, then one table each."""
    lines = [f"# Pins what {facts.node} had when `{generator}` ran. Every value is exactly the",
             "# node's; edit a pin into a glob (\"580.*\") or a floor (\">=12.4\") to allow more.",
             *(f"# Not pinned: {why}" for why in found.unpinned),
             *(f"# NOTE: {note}" for note in found.notes)]
    for table, values in found.tables.items():
        lines += ["", f"[{table}]", *(f"{k} = {format_value(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"
