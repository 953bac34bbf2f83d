"""InfiniBand: ib.count, ib.port_state, ib.rate, ib.errors."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem
from slurmgpu.facts import IbHca, IbPort
from slurmgpu.result import Finding, Severity


def ib_ports(ctx: CheckContext) -> list[tuple[IbHca, IbPort]]:
    """Ports the config asks about: matching [ib] devices, InfiniBand link layer unless
    include_ethernet (RoCE ports are the network team's, not the GPU fabric's)."""
    cfg = ctx.settings.ib
    ports = []
    for hca in ctx.facts.ib.hcas:
        if not any(fnmatch.fnmatchcase(hca.name, p) for p in cfg.devices):
            continue
        for port in hca.ports:
            if cfg.include_ethernet or port.link_layer in (None, "InfiniBand"):
                ports.append((hca, port))
    return ports


def _name(hca: IbHca, port: IbPort) -> str:
    return f"{hca.name}/{port.port}"


@check("ib.count", severity=Severity.FAIL, reads=("ib.hcas",),
       summary="the node has [ib] count InfiniBand ports")
def ib_count(ctx: CheckContext) -> Iterator[Finding]:
    expected = ctx.settings.ib.count
    if expected is None:
        yield not_applicable("IB port count not configured")
        return
    ports = ib_ports(ctx)
    if len(ports) != expected:
        why = f" ({ctx.facts.ib.error})" if ctx.facts.ib.error else ""
        yield problem(Severity.FAIL, f"{len(ports)} InfiniBand ports present, {expected} expected{why}",
                      present=len(ports), expected=expected)
    else:
        yield ok(f"{expected} InfiniBand ports present")


@check("ib.port_state", severity=Severity.FAIL, reads=("ib.ports.state", "ib.ports.phys_state"),
       summary="every InfiniBand port is ACTIVE and LinkUp")
def ib_port_state(ctx: CheckContext) -> Iterator[Finding]:
    ports = ib_ports(ctx)
    if not ports:
        yield not_applicable("no InfiniBand ports")
    for hca, port in ports:
        if port.state != "ACTIVE" or port.phys_state != "LinkUp":
            yield problem(Severity.FAIL, f"port {port.state or '?'} / {port.phys_state or '?'} "
                          "(want ACTIVE / LinkUp)", subject=_name(hca, port),
                          state=port.state, phys_state=port.phys_state)


@check("ib.rate", severity=Severity.FAIL, reads=("ib.ports.rate_gbps",),
       summary="every active InfiniBand port runs at [ib] rate_gbps or faster")
def ib_rate(ctx: CheckContext) -> Iterator[Finding]:
    expected = ctx.settings.ib.rate_gbps
    if expected is None:
        yield not_applicable("IB rate not configured")
        return
    for hca, port in ib_ports(ctx):
        # A port that is down reports a meaningless rate; ib.port_state covers it.
        if port.state == "ACTIVE" and port.rate_gbps is not None and port.rate_gbps < expected:
            yield problem(Severity.FAIL, f"port at {port.rate_text or port.rate_gbps}, expected {expected:g} Gb/sec",
                          subject=_name(hca, port), rate_gbps=port.rate_gbps, expected=expected)


@check("ib.errors", severity=Severity.WARN, reads=("ib.ports.counters", "previous.ib.ports.counters"),
       summary="InfiniBand error counters below [ib] counters_max, and their growth since the previous "
               "sample below counters_delta_max")
def ib_errors(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.ib
    before = _previous_counters(ctx)
    for hca, port in ib_ports(ctx):
        name = _name(hca, port)
        over = {c: v for c, v in port.counters.items() if c in cfg.counters_max and v > cfg.counters_max[c]}
        if over:
            text = ", ".join(f"{c} {v} (max {cfg.counters_max[c]})" for c, v in over.items())
            yield problem(cfg.counters_severity, text, subject=name, counters=over)
        old = before.get(name)
        if old is None:
            continue
        rising = {c: v - old[c] for c, v in port.counters.items()
                  if c in cfg.counters_delta_max and c in old and v - old[c] > cfg.counters_delta_max[c]}
        if rising:
            text = ", ".join(f"{c} +{d} (max +{cfg.counters_delta_max[c]})" for c, d in rising.items())
            yield problem(cfg.counters_severity, f"rising since last sample: {text}", subject=name,
                          deltas=rising)


def _previous_counters(ctx: CheckContext) -> dict[str, dict[str, int]]:
    prev = ctx.facts.previous
    if prev is None:
        return {}
    return {_name(h, p): p.counters for h in prev.ib.hcas for p in h.ports}
