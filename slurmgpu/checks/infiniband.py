"""InfiniBand: ib.count, ib.port_state, ib.rate, ib.errors, ib.flap, ib.roce_counters.

Every check judges the same ports, the ones ``ib_ports`` puts in scope: those an
``[ib] devices`` entry selects ("mlx5_0": every port of the device, "mlx5_*/1": port 1
of each), with link layer InfiniBand, or any link layer with ``include_ethernet``.
A port in scope is a port expected to be ACTIVE/LinkUp: ib.count counts them (so an
uncabled port 2 left out of ``devices`` is neither counted nor failed), ib.port_state
fails each one that is not up.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Mapping

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem
from slurmgpu.config.schema import IbSettings
from slurmgpu.facts import IbHca, IbPort
from slurmgpu.result import Finding, Severity

# Width in bits of each error counter of the PMA's PortCounters attribute (IBTA IBA Vol. 1,
# Performance Management, PortCounters; the kernel's copy of the layout is struct
# ib_pma_portcounters in include/rdma/ib_pma.h, and drivers/infiniband/core/sysfs.c reads
# each with the width given here). These counters stop at all ones instead of wrapping: at
# that value they never move again, so a zero delta means nothing. The data and packet
# counters (32/64-bit) are not judged and left out.
PMA_COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
FLAP_COUNTER = "link_downed"
# Out-of-scope ports named in an ib.count mismatch (enough to spot a wrong [ib] devices).
_LIST_MAX = 12


def port_selected(patterns: Iterable[str], hca: str, port: int) -> bool:
    """Whether an [ib] devices entry selects port ``port`` of ``hca``: "<device glob>"
    selects every port, "<device glob>/<port glob>" the ports whose number matches."""
    for pattern in patterns:
        device, _, ports = pattern.partition("/")
        if fnmatch.fnmatchcase(hca, device) and (not ports or fnmatch.fnmatchcase(str(port), ports)):
            return True
    return False


def _link_layer_in_scope(port: IbPort, cfg: IbSettings) -> bool:
    # RoCE ports are the network team's, not the GPU fabric's, unless asked for.
    return cfg.include_ethernet or port.link_layer in (None, "InfiniBand")


def ib_ports(ctx: CheckContext) -> list[tuple[IbHca, IbPort]]:
    """Ports in scope: selected by [ib] devices, InfiniBand link layer unless include_ethernet."""
    return ports_in_scope(ctx.facts.ib.hcas, ctx.settings.ib)


def ports_in_scope(hcas: Iterable[IbHca], cfg: IbSettings) -> list[tuple[IbHca, IbPort]]:
    return [(hca, port) for hca in hcas for port in hca.ports
            if port_selected(cfg.devices, hca.name, port.port) and _link_layer_in_scope(port, cfg)]


def _name(hca: IbHca, port: IbPort) -> str:
    return f"{hca.name}/{port.port}"


def _left_out(ctx: CheckContext) -> list[str]:
    """Ports out of scope, each with why ("mlx5_2/1 Ethernet")."""
    cfg = ctx.settings.ib
    out = []
    for hca in ctx.facts.ib.hcas:
        for port in hca.ports:
            if not port_selected(cfg.devices, hca.name, port.port):
                out.append(f"{_name(hca, port)} not in [ib] devices")
            elif not _link_layer_in_scope(port, cfg):
                out.append(f"{_name(hca, port)} {port.link_layer}")
    return out


def _reset_hint(hca: IbHca, port: IbPort) -> str:
    # perfquery -R resets the PMA counters (-x only shows the extended ones).
    return f"reset the counters with `perfquery -C {hca.name} -P {port.port} -R`"


def saturated(counter: str, value: int | None) -> bool:
    bits = PMA_COUNTER_BITS.get(counter)
    return bits is not None and value is not None and value >= (1 << bits) - 1


@check("ib.count", severity=Severity.FAIL, reads=("ib.hcas", "ib.ports.link_layer"),
       summary="[ib] count ports in scope ([ib] devices, InfiniBand link layer): the ports "
               "expected active")
def ib_count(ctx: CheckContext) -> Iterator[Finding]:
    expected = ctx.settings.ib.count
    if expected is None:
        yield not_applicable("IB port count not configured")
        return
    ports = [_name(h, p) for h, p in ib_ports(ctx)]
    if len(ports) == expected:
        yield ok(f"{expected} InfiniBand ports present", ports=ports)
        return
    why = f" ({ctx.facts.ib.error})" if ctx.facts.ib.error else ""
    left_out = _left_out(ctx)
    if left_out:
        more = f", +{len(left_out) - _LIST_MAX}" if len(left_out) > _LIST_MAX else ""
        why += f"; not counted: {', '.join(left_out[:_LIST_MAX])}{more}"
    yield problem(Severity.FAIL, f"{len(ports)} InfiniBand ports present, {expected} expected{why}",
                  present=len(ports), expected=expected, ports=ports, not_counted=left_out)


@check("ib.port_state", severity=Severity.FAIL, reads=("ib.ports.state", "ib.ports.phys_state"),
       summary="every InfiniBand port in scope is ACTIVE and LinkUp")
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


@check("ib.errors", severity=Severity.WARN,
       reads=("ib.ports.counters", "ib.ports.counters_unavailable", "previous.ib.ports.counters"),
       summary="InfiniBand error counters below [ib] counters_max, their growth since the previous "
               "sample below counters_delta_max; WARN for counters saturated or unavailable")
def ib_errors(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.ib
    before = _previous(ctx)
    for hca, port in ib_ports(ctx):
        name = _name(hca, port)
        full = _full(cfg, port)
        # A saturated counter over its ceiling at WARN is one finding, the saturation one.
        yield from _over(cfg, port, name, skip=full if cfg.counters_severity == "warn" else {})
        old = before.get(name)
        if old is not None:
            yield from _rising(cfg, port.counters, old.counters, name)
        yield from _saturated(cfg, hca, port, full)
        yield from _unavailable(port, name)


def _over(cfg: IbSettings, port: IbPort, name: str, *, skip: Mapping[str, int]) -> Iterator[Finding]:
    over = {c: v for c, v in port.counters.items()
            if c in cfg.counters_max and v > cfg.counters_max[c] and c not in skip}
    if over:
        text = ", ".join(f"{c} {v} (max {cfg.counters_max[c]})" for c, v in over.items())
        yield problem(cfg.counters_severity, text, subject=name, counters=over)


def _rising(cfg: IbSettings, now: dict[str, int], old: dict[str, int], name: str) -> Iterator[Finding]:
    rising = {c: v - old[c] for c, v in now.items()
              if c in cfg.counters_delta_max and c in old and v - old[c] > cfg.counters_delta_max[c]}
    if rising:
        text = ", ".join(f"{c} +{d} (max +{cfg.counters_delta_max[c]})" for c, d in rising.items())
        yield problem(cfg.counters_severity, f"rising since last sample: {text}", subject=name,
                      deltas=rising)


def _full(cfg: IbSettings, port: IbPort) -> dict[str, int]:
    """The judged counters of a port that are at their maximum."""
    judged = set(cfg.counters_max) | set(cfg.counters_delta_max)
    return {c: v for c, v in port.counters.items() if c in judged and saturated(c, v)}


def _saturated(cfg: IbSettings, hca: IbHca, port: IbPort, full: Mapping[str, int]) -> Iterator[Finding]:
    """A judged counter at its maximum hides any further growth: say so instead of letting
    its zero delta pass. WARN whatever counters_severity says: it is a blind spot, not a fault
    (the value itself is judged by counters_max, and named here when over it)."""
    if full:
        text = ", ".join(f"{c} {v} ({PMA_COUNTER_BITS[c]}-bit maximum{_over_max(cfg, c, v)})"
                         for c, v in full.items())
        yield problem(Severity.WARN, f"counter saturated, its growth can no longer be seen: {text}; "
                      f"{_reset_hint(hca, port)}", subject=_name(hca, port), saturated=full)


def _over_max(cfg: IbSettings, counter: str, value: int) -> str:
    ceiling = cfg.counters_max.get(counter)
    return f", over max {ceiling}" if ceiling is not None and value > ceiling else ""


def _unavailable(port: IbPort, name: str) -> Iterator[Finding]:
    # The kernel has no PMA to ask (an old kernel prints "N/A (no PMA)"): nothing can be
    # judged on this port, which an admin should know; never a failure of the node.
    if port.counters_unavailable:
        yield problem(Severity.WARN, "error counters unavailable (N/A (no PMA)), not judged: "
                      + ", ".join(port.counters_unavailable), subject=name,
                      unavailable=list(port.counters_unavailable))


def _previous(ctx: CheckContext) -> dict[str, IbPort]:
    prev = ctx.facts.previous
    if prev is None:
        return {}
    return {_name(h, p): p for h in prev.ib.hcas for p in h.ports}


@check("ib.flap", severity=Severity.FAIL, reads=("ib.ports.flap_strikes", "ib.ports.counters"),
       summary="no InfiniBand link flapping: [ib] flap_count link_downed rises within flap_window_s "
               "are a strike (WARN), flap_strikes strikes FAIL (the agent keeps the history)")
def ib_flap(ctx: CheckContext) -> Iterator[Finding]:
    ports = ib_ports(ctx)
    tracked = [(h, p) for h, p in ports if p.flap_strikes is not None]
    if not tracked:
        yield not_applicable(_why_no_flap_history(ports))
        return
    found = False
    for hca, port in tracked:
        for finding in _flap_findings(ctx.settings.ib, hca, port):
            found = True
            yield finding
    if not found:
        yield ok("no link flapping")


def _why_no_flap_history(ports: list[tuple[IbHca, IbPort]]) -> str:
    if not ports:
        return "no InfiniBand ports"
    if not any(FLAP_COUNTER in p.counters for _, p in ports):
        return f"no {FLAP_COUNTER} counter on the ports in scope"
    # Flapping is a pattern over polls: only the agent, which keeps them, can judge it.
    return f"link flapping needs the agent's history of {FLAP_COUNTER} across polls"


def _flap_findings(cfg: IbSettings, hca: IbHca, port: IbPort) -> Iterator[Finding]:
    name = _name(hca, port)
    value = port.counters.get(FLAP_COUNTER)
    if saturated(FLAP_COUNTER, value):
        yield problem(Severity.WARN, f"{FLAP_COUNTER} saturated at {value}: flapping can no "
                      f"longer be seen; {_reset_hint(hca, port)}", subject=name, link_downed=value)
    strikes = port.flap_strikes or 0
    if not strikes:
        return
    to_fail = max(1, cfg.flap_strikes)
    yield problem(Severity.FAIL if strikes >= to_fail else Severity.WARN,
                  f"link flapping: {strikes} strike{'s' if strikes > 1 else ''} ({max(1, cfg.flap_count)} "
                  f"{FLAP_COUNTER} rises within {cfg.flap_window_s:g} s each; {to_fail} fail the port)",
                  subject=name, strikes=strikes, rises=port.flap_rises, link_downed=value)


@check("ib.roce_counters", severity=Severity.WARN,
       reads=("ib.ports.hw_counters", "previous.ib.ports.hw_counters"),
       summary="RoCE ports in scope: hw_counters growth since the previous sample below "
               "[ib] hw_counters_delta_max (with [ib] roce_hw_counters)")
def ib_roce_counters(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.ib
    if not cfg.roce_hw_counters:
        yield not_applicable("RoCE hw_counters not enabled ([ib] roce_hw_counters)")
        return
    roce = [(h, p) for h, p in ib_ports(ctx) if p.link_layer == "Ethernet"]
    ports = [(h, p) for h, p in roce if p.hw_counters is not None]
    if not ports:
        yield not_applicable("hw_counters of the RoCE ports were not read" if roce else
                             "no RoCE port in scope ([ib] include_ethernet)")
        return
    before = _previous(ctx)
    for hca, port in ports:
        old = before.get(_name(hca, port))
        if old is not None and old.hw_counters is not None and port.hw_counters is not None:
            yield from _hw_rising(cfg, port.hw_counters, old.hw_counters, _name(hca, port))


def _hw_rising(cfg: IbSettings, now: dict[str, int], old: dict[str, int], name: str) -> Iterator[Finding]:
    limits = cfg.hw_counters_delta_max
    rising = {c: v - old[c] for c, v in now.items() if c in limits and c in old and v - old[c] > limits[c]}
    if rising:
        text = ", ".join(f"{c} +{d} (max +{limits[c]})" for c, d in rising.items())
        yield problem(Severity.WARN, f"RoCE counters rising since last sample: {text}", subject=name,
                      deltas=rising)
