"""The fleet and its month, planned: the nodes on their models' stacks, version drift and the
mid-month upgrade, the counters' baselines and slow risers, the showcase nodes and the
random episodes at the fleet's rates, laid out node by node in time."""

from __future__ import annotations

import math
import random
from typing import Any

from .episodes import Seeder
from .model import (
    A100_FRACTION,
    APP_XIDS,
    DAY,
    DRIFTS,
    FAULT_RATE,
    FAULTS,
    GPUS,
    HOUR,
    MODELS,
    OK,
    PORTS,
    REPORT_S,
    UPGRADE_FROM,
    WARN,
    Node,
    weighted,
)

SHOWCASE = ("lemon1", "lemon2", "remap-failure", "remap", "ecc", "ib", "xid79", "xid119", "thermal",
            "maintenance", "unreachable", "drift1", "drift2", "upgrade")
# Each node's planned episodes: (time, kind, argument), laid out in time by lay_out.
Plan = dict[str, list[tuple[float, str, Any]]]


def _name(model: str, i: int, count: int) -> str:
    return f"gpu-{model}-{i:0{max(3, len(str(count)))}d}"


def _schedule(rng: random.Random, start: float, end: float, n: int) -> list[float]:
    """``n`` start times in the window, sorted."""
    return sorted(rng.uniform(start + 2 * HOUR, end - 4 * HOUR) for _ in range(n))


def make_fleet(nodes: int, end: float) -> list[Node]:
    """The A100 nodes, then the H100 nodes, each on the pinned stack of its model."""
    n_a100 = max(1, round(nodes * A100_FRACTION)) if nodes > 1 else 1
    fleet: list[Node] = []
    for i in range(nodes):
        model = "a100" if i < n_a100 else "h100"
        idx = i + 1 if model == "a100" else i - n_a100 + 1
        count = n_a100 if model == "a100" else nodes - n_a100
        spec = MODELS[model]
        versions = {k: spec[k] for k in ("gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware",
                                         "ofed", "kernel")}
        fleet.append(Node(_name(model, idx, count), model, i, versions, last_seen=end))
    return fleet


def set_versions(sd: Seeder, fleet: list[Node], showcase: dict[str, Node], plan: Plan,
                 scale: float) -> tuple[list[str], Node]:
    """Versions: baselines, drift, the mid-month upgrade. Returns the drifted nodes' names
    and the upgraded node."""
    rng, start, end = sd.rng, sd.start, sd.end
    drifted: list[str] = []
    drift_nodes = [showcase["drift1"], showcase["drift2"]] + [
        n for n in fleet if rng.random() < 0.01 and n not in showcase.values()]
    for k, node in enumerate(drift_nodes):
        fld, check, values = DRIFTS[k % len(DRIFTS)]
        node.versions[fld] = values[node.model]
        node.standing.append((check, WARN, None, None, f"{fld} {values[node.model]} is not pinned",
                              -math.inf, math.inf))
        drifted.append(node.name)
    up = showcase["upgrade"]
    t_up = start + (end - start) * 0.5 + rng.uniform(-DAY, DAY) * min(1.0, scale)
    if up.name not in drifted:
        up.versions["driver"] = UPGRADE_FROM
        up.standing.append(("pin.driver", WARN, None, None, f"driver {UPGRADE_FROM} is not pinned",
                            -math.inf, t_up))
    for node in fleet:
        sd.versions.append((node.name, start + rng.uniform(0, 60), *node.versions.values()))
    if up.name not in drifted:
        upgraded = dict(up.versions, driver=MODELS[up.model]["driver"])
        sd.versions.append((up.name, t_up, *upgraded.values()))
        plan[up.name].append((t_up + 300.0, "report", None))
    return drifted, up


def counters(sd: Seeder, fleet: list[Node], order: list[int]) -> None:
    """Counters: a baseline row for every GPU and port, then the slow risers."""
    rng, start, end, nodes = sd.rng, sd.start, sd.end, len(fleet)
    for node in fleet:
        spec = MODELS[node.model]
        for g in range(GPUS):
            base = 0 if rng.random() < 0.9 else rng.randint(1, 400)
            cur = [f"{spec['serial']}{node.index:06d}{g}", spec["gpu_model"], base, 0, 0, 0, 0, 0]
            sd.gpu_now[(node.name, g)] = cur
            sd.gpu.append((node.name, g, start + 1.0, *cur))
        for p in PORTS:
            cur_ib = ["ACTIVE", spec["rate_gbps"], rng.choice((0, 0, 0, 1, 3)), 0, 0, 0, 0, 0]
            sd.ib_now[(node.name, p)] = cur_ib
            sd.ib.append((node.name, p, start + 1.0, *cur_ib))
    risers = max(2, int(nodes * GPUS * 0.003))
    for k in range(risers):
        node = fleet[order[(k * 7 + 3) % nodes]]
        g = rng.randrange(GPUS)
        rate = rng.choice((50, 200, 1500))
        t = start + rng.uniform(0, 5) * DAY
        while t < end:
            cur = sd.gpu_now[(node.name, g)]
            sd.set_gpu(node, g, t, ecc_corrected=cur[2] + int(rate * rng.uniform(0.5, 1.5)))
            t += DAY * rng.uniform(0.5, 1.5)
    for node in fleet:
        if rng.random() < 0.01 * max(1.0, 30 / max(nodes, 30)):
            p = rng.choice(PORTS)
            t = start + rng.uniform(0, 10) * DAY
            while t < end:
                cur_ib = sd.ib_now[(node.name, p)]
                sd.set_ib(node, p, t, symbol_error=cur_ib[2] + rng.randint(20, 800))
                t += DAY * rng.uniform(0.7, 1.3)


def plan_episodes(sd: Seeder, fleet: list[Node], showcase: dict[str, Node], plan: Plan,
                  scale: float) -> None:
    """Episodes: the showcase ones, then random ones at the fleet's rates."""
    rng, start, end = sd.rng, sd.start, sd.end
    window = end - start
    for role in ("lemon1", "lemon2"):
        node = showcase[role]
        t = start + window * rng.uniform(0.3, 0.5)
        step = min(rng.uniform(1.2, 2.0) * DAY, (end - t - 2 * HOUR) / 3)
        for k in range(3):
            plan[node.name].append((t, "lemon", k))
            t += step
    for role, kind, arg in (("remap-failure", "fault", ("remap-failure", None)),
                            ("remap", "fault", ("remap", None)), ("ecc", "fault", ("ecc", None)),
                            ("ib", "fault", ("ib", None)), ("xid79", "fault", ("xid", 79)),
                            ("xid119", "fault", ("xid", 119 if showcase["xid119"].model == "h100" else 74)),
                            ("thermal", "fault", ("thermal", None)),
                            ("maintenance", "maintenance", None), ("unreachable", "unreachable", None)):
        node = showcase[role]
        plan[node.name].append((rng.uniform(start + 2 * HOUR, end - 4 * HOUR), kind, arg))
    throttlers = [showcase["thermal"]] + [n for n in fleet if rng.random() < 0.004]
    for node in throttlers:
        node.chronic = rng.uniform(0.15, 0.45)
    for node in fleet:
        if not node.chronic and rng.random() < 0.08:
            node.noise = rng.uniform(0.01, 0.05)
        lam = FAULT_RATE * scale
        for t in _schedule(rng, start, end, sum(1 for _ in range(3) if rng.random() < lam / 3)):
            kind = weighted(rng, FAULTS)
            if kind == "thermal" and not node.chronic:
                node.chronic = rng.uniform(0.05, 0.2)
            plan[node.name].append((t, "fault", (kind, None)))
        if rng.random() < 0.03 * scale:
            plan[node.name].append((rng.uniform(start, end - HOUR), "maintenance", None))
        if rng.random() < 0.02 * scale:
            plan[node.name].append((rng.uniform(start, end - HOUR), "unreachable", None))


def lay_out(sd: Seeder, fleet: list[Node], plan: Plan) -> list[str]:
    """Lay every node's episodes out in time, one at a time. Returns the lemons."""
    rng, start, end = sd.rng, sd.start, sd.end
    lemons: list[str] = []
    for node in fleet:
        sd.report(node, start + rng.uniform(1, REPORT_S), [])
        busy_until = start
        for t, kind, arg in sorted(plan[node.name], key=lambda x: x[0]):
            if kind == "report":
                if t >= busy_until:
                    sd.report(node, t, [])
                continue
            if kind != "lemon":
                t = max(t, busy_until + 2 * HOUR)
            if t >= end - (HOUR if kind != "lemon" else 0.25 * HOUR):
                continue
            if kind == "fault":
                fault_kind, xid = arg
                busy_until = sd.fault(node, fault_kind, t, forever=fault_kind == "remap-failure", xid=xid)
            elif kind == "lemon":
                busy_until = _lemon_drain(sd, node, t, busy_until, last=arg == 2)
                if arg == 2:
                    lemons.append(node.name)
            elif kind == "maintenance":
                busy_until = sd.maintenance(node, t)
            elif kind == "unreachable":
                busy_until = sd.unreachable(node, t, t + rng.uniform(0.3, 8) * HOUR)
    return lemons


def _lemon_drain(sd: Seeder, node: Node, t: float, busy_until: float, *, last: bool) -> float:
    """One of a lemon's three XID drains; the last one stays open and makes it a lemon."""
    code = 119 if node.model == "h100" else 74
    ended = sd.fault(node, "xid", max(t, busy_until + 0.1 * HOUR), forever=last, xid=code,
                     repair_h=min(3.0, (sd.end - sd.start) / HOUR / 24))
    if last:
        info = sd.drained.get(node.name, {})
        sd.lemons[node.name] = {"since": info.get("time", t), "why":
                                f"3 drains within 604800 s, last: {info.get('reason', '')}"}
    return ended


def application_xids(sd: Seeder, fleet: list[Node], scale: float) -> None:
    """Application XIDs: events only (the node is fine)."""
    rng = sd.rng
    app = list(APP_XIDS)
    weights = [APP_XIDS[c] for c in app]
    for node in fleet:
        for _ in range(int(rng.expovariate(1 / (3.0 * scale)))):
            g, code = rng.randrange(GPUS), rng.choices(app, weights)[0]
            t = rng.uniform(sd.start, sd.end)
            sd.event(node, t, "xid", g, code, OK,
                     [("xid.recent", OK, g, None, f"XID {code}: {sd.xids[code][0]}")])
