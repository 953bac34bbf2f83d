"""Episodes, as a collector would have recorded them: a fault's onset (XIDs, ECC, row remaps,
thermal throttling, IB link flaps), the automation's answer (a warning, or a drain after
asking the node's jobs to checkpoint), the repair and the resume; operators' maintenance
drains; unreachable spells."""

from __future__ import annotations

import json
import math

from slurmgpu.decision import DRAIN_NOW_XIDS, Action, drain_reason, with_actor
from slurmgpu.result import Finding, Severity

from .model import (
    DAY,
    FAIL,
    GPUS,
    HOUR,
    HW_XIDS,
    MAINTENANCE,
    OPERATORS,
    PORTS,
    THERMAL_STRIKES,
    USERS,
    WARN,
    Episode,
    Node,
    finding,
    weighted,
    xid_action,
)
from .rows import Recorder


class Seeder(Recorder):
    def drain(self, node: Node, ts: float, action: Action, reason: str, trigger: str, *,
              by_epilog: bool = False) -> None:
        """The automation drains the node; ``by_epilog``: the epilog of the job that was
        running there got to it first (its reason tagged, the automation finds it drained)."""
        if by_epilog:
            self.node_state(ts - 1.0, node, "drained", with_actor(reason, "epilog"), "root", "epilog")
            self.decision(ts, node, action, reason, trigger, "already-drained")
        else:
            self.decision(ts, node, action, reason, trigger, "drained")
            self.node_state(ts + 2.0, node, "drained", reason, "root", "automation")
        self.drained[node.name] = {"time": ts, "trigger": trigger, "reason": reason}

    def resume(self, node: Node, ts: float) -> None:
        """The node checks healthy after its repair: OK reports, then the automation resumes it."""
        self.report(node, ts, [])
        when = ts + 600.0 + self.rng.uniform(0, 60)
        if when < self.end:
            self.decision(when, node, Action.RESUME, f"3 OK reports over {600 + 30:g} s", "healthy",
                          "resumed")
            self.node_state(when + 2.0, node, "resumed", None, "root")
            self.drained.pop(node.name, None)

    def jobs(self, node: Node, ts: float, action: Action, reason: str, deadline_s: float) -> float:
        """Checkpoint requests to the node's jobs (0-3); returns when the node can drain."""
        rng = self.rng
        count = rng.choices((0, 1, 2, 3), weights=(25, 45, 20, 10))[0]
        ready = ts + 1.0
        for _ in range(count):
            self.job += rng.randint(1, 400)
            job = str(self.job)
            prefix, number = node.name.rsplit("-", 1)
            others = [f"{prefix}-{int(number) + k:0{len(number)}d}" for k in range(1, rng.choice((1, 1, 2, 4)))]
            requested = ts + 1.0
            deadline = requested + deadline_s
            expired = rng.random() < 0.2
            acked_at = None if expired else requested + rng.uniform(20, deadline_s * 0.8)
            closed = deadline + 1.0 if expired else (acked_at or requested) + 1.0
            state = "expired" if expired else "acked"
            self.checkpoints.append((job, action, reason, node.name, json.dumps([node.name, *others]),
                                     rng.choice(USERS), requested, deadline, state, acked_at,
                                     None if expired else f"{job}.0@{node.name}", closed))
            jev = self.job_events
            jev.append((job, requested, "detected", node.name, reason))
            jev.append((job, requested + 0.2, "signalled", node.name, "SIGUSR1 (scancel --signal)"))
            jev.append((job, requested + 0.5, "delivered", node.name, "checkpoint request file written"))
            if expired:
                jev.append((job, deadline, "deadline", node.name, f"no ack within {deadline_s:g} s"))
            else:
                late = rng.random() < 0.05
                jev.append((job, acked_at, "acked-late" if late else "acked", node.name, None))
            jev.append((job, closed, "drained", node.name, None))
            if rng.random() < 0.85:
                jev.append((job, closed + 0.5, "requeued", node.name, "scontrol requeue"))
            else:
                jev.append((job, closed + 0.5, "requeue-skipped", node.name, "job is not requeueable"))
            ready = max(ready, closed)
        return ready

    def prolog_blocked(self, node: Node, ts: float, why: str) -> None:
        for _ in range(self.rng.choice((0, 0, 1, 1, 2))):
            self.job += self.rng.randint(1, 50)
            self.event(node, ts + self.rng.uniform(3, 25), "prolog_blocked", None, None, FAIL, [],
                       {"job_id": str(self.job), "reason": why})

    def repair_time(self, median_h: float) -> float:
        return HOUR * median_h * math.exp(self.rng.gauss(0.0, 0.8))

    def fault(self, node: Node, kind: str, t0: float, *, forever: bool = False,
              xid: int | None = None, repair_h: float = 10.0) -> float:
        """One fault episode from ``t0``; returns when it ended (> end: still open)."""
        gpu = self.rng.randrange(GPUS)
        t_fix = self.end + DAY if forever else t0 + self.repair_time(repair_h)
        ep = Episode(kind, gpu, t0, t_fix)
        if kind == "xid":
            self._onset_xid(node, ep, xid)
        elif kind == "ecc":
            self._onset_ecc(node, ep)
        elif kind == "remap":
            self._onset_remap(node, ep)
        elif kind == "remap-failure":
            self._onset_remap_failure(node, ep)
        elif kind == "thermal":
            self._onset_thermal(node, ep)
        elif kind == "ib":
            self._onset_ib(node, ep)
        fix = min(ep.t_fix, self.end + DAY)
        self.report(node, ep.t0, ep.bad)
        if ep.severity == FAIL:
            node.fails.append((ep.t0, min(fix, self.end)))
        self._respond(node, ep)
        if fix <= self.end:
            if kind in ("ecc", "remap"):
                self.set_gpu(node, gpu, fix - 120.0, remap_pending=0)
            if ep.action == Action.WARN:
                self.report(node, fix, [])
            elif not forever:
                self.resume(node, fix)
        return fix

    def _onset_xid(self, node: Node, ep: Episode, xid: int | None) -> None:
        gpu, t0 = ep.gpu, ep.t0
        xid = xid or weighted(self.rng, HW_XIDS[node.model])
        name, catalog_action = self.xids.get(xid, (f"XID {xid}", Action.DRAIN))
        ep.action = xid_action(xid, catalog_action)
        ep.severity = FAIL if ep.action in (Action.DRAIN, Action.DRAIN_NOW) else WARN
        message = f"XID {xid}: {name}"
        ep.bad = [("xid.recent", ep.severity, gpu, None, message)]
        if xid in DRAIN_NOW_XIDS:  # off the bus
            ep.bad.append(("gpu.lost", FAIL, gpu, None, "GPU has fallen off the bus"))
        self.event(node, t0 - 1.0, "xid", gpu, xid, ep.severity, ep.bad[:1])
        ep.trigger = "xid.recent"
        if ep.action == Action.CHECKPOINT:
            ep.ckpt_deadline = 300.0
        elif ep.action == Action.DRAIN_NOW:
            ep.ckpt_deadline = 120.0
        if xid == 63:  # a row remap event: the remap itself is below
            ep.t_fix = t0 + self.rng.uniform(0.2, 2.0) * HOUR

    def _onset_ecc(self, node: Node, ep: Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        n = self.rng.choice((1, 1, 2, 4))
        cur = self.gpu_now[(node.name, gpu)]
        self.event(node, t0 - 2.0, "ecc_dbe", gpu, n, FAIL, [])
        self.event(node, t0 - 1.0, "xid", gpu, 48, FAIL,
                   [("xid.recent", FAIL, gpu, None, f"XID 48: {self.xids[48][0]}")])
        self.set_gpu(node, gpu, t0, ecc_uncorrected=cur[3] + n, remap_pending=1)
        ep.bad = [("ecc.uncorrected", FAIL, gpu, None, f"{n} uncorrected ECC error(s) (volatile)")]
        ep.trigger = "ecc.uncorrected"

    def _onset_remap(self, node: Node, ep: Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        cur = self.gpu_now[(node.name, gpu)]
        self.event(node, t0 - 1.0, "xid", gpu, 63, WARN,
                   [("xid.recent", WARN, gpu, None, f"XID 63: {self.xids[63][0]}")])
        self.set_gpu(node, gpu, t0, remap_uncorrected=cur[5] + 1, remap_pending=1)
        ep.bad = [("mem.row_remap", FAIL, gpu, None, "row remap pending: GPU reset required")]
        ep.action, ep.trigger, ep.ckpt_deadline = Action.CHECKPOINT, "mem.row_remap", 300.0
        ep.t_fix = t0 + self.rng.uniform(0.5, 4.0) * HOUR

    def _onset_remap_failure(self, node: Node, ep: Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        self.event(node, t0 - 1.0, "xid", gpu, 64, FAIL,
                   [("xid.recent", FAIL, gpu, None, f"XID 64: {self.xids[64][0]}")])
        self.set_gpu(node, gpu, t0, remap_failure=1)
        ep.bad = [("mem.row_remap", FAIL, gpu, None, "row remapping failure: no spare rows (RMA)")]
        ep.trigger = "mem.row_remap"
        ep.t_fix = self.end + DAY

    def _onset_thermal(self, node: Node, ep: Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        ep.severity = WARN
        ep.bad = [("thermal.throttle", WARN, gpu, None, "HW slowdown active (clocks event reasons 0x8)")]
        ep.trigger = "thermal.throttle"
        node.throttle.append((t0 - 2 * HOUR, t0 + 60.0, 0.7))
        reason = drain_reason([Finding(ep.trigger, Severity.WARN, "HW slowdown active", gpu)])
        self.decision(t0 + 1.0, node, Action.WARN, reason, ep.trigger, "recorded")
        ep.t0 = t0 + 30.0  # three strikes later

    def _onset_ib(self, node: Node, ep: Episode) -> None:
        rng, t0 = self.rng, ep.t0
        port = rng.choice(PORTS)
        cur = self.ib_now[(node.name, port)]
        self.set_ib(node, port, t0 - 240.0, symbol_error=cur[2] + rng.randint(200, 5000),
                    link_downed=cur[3] + 1, link_error_recovery=cur[4] + rng.randint(1, 5))
        cur = self.ib_now[(node.name, port)]
        self.set_ib(node, port, t0 - 30.0, symbol_error=cur[2] + rng.randint(100, 3000),
                    link_downed=cur[3] + rng.randint(1, 3), port_rcv_errors=cur[5] + rng.randint(10, 400))
        ep.bad = [("ib.flap", FAIL, None, port, "link flapping: link_downed rose in 2 samples within "
                                                "300 s (2 strikes)")]
        ep.trigger = "ib.flap"
        ep.t_fix = t0 + self.repair_time(6.0)

    def _respond(self, node: Node, ep: Episode) -> None:
        """The automation's answer to an episode's first report: a warning, or a drain (after
        asking the node's jobs to checkpoint); the prolog refuses jobs meanwhile. The reason
        names the episode's trigger, its first finding."""
        rng, t0, action, trigger = self.rng, ep.t0, ep.action, ep.trigger
        strikes = THERMAL_STRIKES if ep.kind == "thermal" else 1
        reason = drain_reason([finding(ep.bad[0])], strikes=strikes)
        if action == Action.WARN:
            self.decision(t0 + 1.0, node, Action.WARN, reason, trigger, "recorded")
            return
        if ep.ckpt_deadline:
            self.decision(t0 + 1.0, node, action, reason, trigger,
                          "drained" if action == Action.DRAIN_NOW else "checkpointing")
            ready = self.jobs(node, t0 + 1.0, action, reason, ep.ckpt_deadline)
            if action == Action.DRAIN_NOW:
                self.node_state(t0 + 3.0, node, "drained", reason, "root", "automation")
                self.drained[node.name] = {"time": t0 + 1.0, "trigger": trigger, "reason": reason}
            else:
                self.drain(node, max(ready, t0 + 2.0), Action.DRAIN, reason, trigger)
        else:
            # (uncorrected ECC errors: the job's epilog drains the node as it ends)
            self.drain(node, t0 + 1.0, action, reason, trigger, by_epilog=ep.kind == "ecc")
        self.prolog_blocked(node, t0, reason)
        if ep.kind == "remap-failure":
            self.ticket += rng.randint(1, 30)
            when = t0 + rng.uniform(2, 20) * HOUR
            if when < self.end:
                self.node_state(when, node, "drained", f"RMA GPU {ep.gpu}: row remap failure "
                                f"(case {self.ticket})", rng.choice(OPERATORS), "outside")

    def maintenance(self, node: Node, t0: float) -> float:
        rng = self.rng
        who = rng.choice(OPERATORS)
        self.ticket += rng.randint(1, 30)
        reason = rng.choice(MAINTENANCE).format(n=self.ticket)
        t1 = t0 + rng.uniform(1, 10) * HOUR
        self.node_state(t0, node, "drained", reason, who, "outside")
        if "reimage" in reason or "PSU" in reason or "power" in reason:
            down = t0 + rng.uniform(0.3, 0.6) * (t1 - t0)
            self.unreachable(node, down, down + rng.uniform(600, 1800))
        if t1 < self.end:
            self.node_state(t1, node, "resumed", None, who)
        return t1

    def unreachable(self, node: Node, t0: float, t1: float) -> float:
        self.node_state(t0, node, "unreachable", None, "collector")
        node.gaps.append((t0 - 15.0, min(t1, self.end)))
        if t1 < self.end:
            self.node_state(t1, node, "reachable", None, "collector")
        else:
            node.unreachable_since = t0
            node.last_seen = t0 - 15.0
        return t1

