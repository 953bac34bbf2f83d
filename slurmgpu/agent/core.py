"""The per-node agent: poll loop, NVML event reactions, cache, spool and link.

Threads: the main loop (``run``) polls every ``[agent] interval_s`` and pings the
systemd watchdog; ``EventWatcher`` waits on NVML events and calls
``on_nvml_event``; ``Link`` owns the collector socket; the local query socket (if
present) calls ``latest``/``facts_for``. Shared state is guarded by one lock; NVML
collection and evaluation run outside it. The main loop also starts a dead link, event or
checkpoint thread again (and stops the watchdog pings when one keeps dying), and deletes
retired job directories (``jobfiles.sweep_trash``, bounded per turn).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slurmgpu import __version__, jobfiles, wire
from slurmgpu.agent.checkpoints import CheckpointWatcher
from slurmgpu.agent.flap import FlapTracker
from slurmgpu.agent.gatelog import GateLogForwarder, blocked_event
from slurmgpu.agent.notify import Notifier
from slurmgpu.agent.spool import Spool
from slurmgpu.config.env import apply_env
from slurmgpu.config.schema import Settings
from slurmgpu.decision import Action, PolicyTable
from slurmgpu.engine import Sources, assemble, evaluate, gather, second_brake_sample, system_sources
from slurmgpu.facts import NodeFacts, NvmlFacts, SoftwareVersions, XidEvent
from slurmgpu.fileutil import write_text_atomic
from slurmgpu.log import get_logger
from slurmgpu.result import Finding, Severity, Verdict
from slurmgpu.sources import Clock, SystemClock, kmsg
from slurmgpu.sources.sxids import merge_sxids
from slurmgpu.summary import report_fields

# XIDs the agent remembers (NVML events, the kernel log's at start), newest kept; they
# stay in the facts (and so in xid.recent) for [xid] kernel_log_lookback_s, and in
# <state_dir>/xids.json across restarts.
XIDS_MAX = 1024
XIDS_FILE = "xids.json"
XIDS_FILE_MAX = 4 * 1024 * 1024
KEYS_RETRY_S = 60.0
# At most one re-evaluation per GPU per this many seconds for events that are not health
# news (non-health kinds, repeats of a code already judged); later ones wait for it.
COALESCE_S = 1.0
# Events that always go on the wire (each one); anything else only when the GPU's
# verdict or findings change.
HEALTH_KINDS = frozenset({"xid", "ecc_dbe", "ecc_sbe_storm", "dram_retirement",
                          "dram_retirement_failure", "poison_nonfatal", "poison_fatal",
                          "gpu_unavailable", "recovery_action", "gpu_lost"})
# Health events sent per GPU per evaluation; the rest are counted in the last one.
MAX_EVENTS_PER_EVAL = 16
# How far back the kernel log is searched for the text of an XID that NVML reported.
KMSG_LOOKBACK_S = 10.0
SPOOL_CHECK = "agent.spool"
STATE_DIR_CHECK = "agent.state_dir"
JOBS_DIR_CHECK = "agent.jobs_dir"
# A vital thread (the link, the NVML event watcher, the checkpoint watcher) that dies is
# started again by the main loop, at most RESTARTS_MAX times in RESTART_WINDOW_S; past
# that the watchdog pings stop, so systemd restarts the agent.
RESTARTS_MAX = 5
RESTART_WINDOW_S = 600.0
# With retired job directories left to delete, the main loop sweeps again this soon.
SWEEP_AGAIN_S = 1.0


def load_client_keys(bundle_dir: str) -> tuple[bytes, bytes, bytes]:
    """(public, secret, collector_public), z85, from the key bundle in ``bundle_dir``."""
    from slurmgpu.keys import client_keys

    return client_keys(bundle_dir)


def load_xids(path: str) -> list[XidEvent]:
    """The XIDs ``Agent._save_xids`` wrote; [] when there is no such file or it is not
    one (logged)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read(XIDS_FILE_MAX))
        return [_xid_from(item) for item in data][-XIDS_MAX:]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as exc:
        get_logger(component="agent").warning("xids_file_unreadable", path=path, error=str(exc))
        return []


def _xid_from(item: dict[str, Any]) -> XidEvent:
    timestamp, gpu, message = item.get("timestamp"), item.get("gpu"), item.get("message")
    return XidEvent(xid=int(item["xid"]), gpu=None if gpu is None else int(gpu),
                    timestamp=None if timestamp is None else float(timestamp),
                    source=str(item.get("source", "saved")),
                    message=kmsg.bounded(message) if message else None)


def _restrict(facts: NodeFacts, gpus: frozenset[int] | None) -> NodeFacts:
    if gpus is None:
        return facts
    nvml = dataclasses.replace(facts.nvml, gpus=[g for g in facts.nvml.gpus if g.index in gpus])
    return dataclasses.replace(facts, nvml=nvml)


class Agent:
    def __init__(self, settings: Settings, node: str, *, sources: Sources | None = None,
                 keys_dir: str | None = None, clock: Clock | None = None,
                 environ: dict[str, str] | None = None) -> None:
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        # Its environment's SLURMGPU_* over the settings (the state dir, the jobs dir, the
        # kernel log, ...), once: config.env's order.
        settings = apply_env(settings, self.environ)
        self.settings = settings
        self.node = node
        self.sources = sources if sources is not None else system_sources(settings)
        self.keys_dir = keys_dir or settings.collector.keys_dir
        self.clock: Clock = clock or SystemClock()
        self.log = get_logger(component="agent", node=node)
        self.notifier = Notifier(self.environ)
        self.stop_event = threading.Event()
        # link_downed history across polls, written into the facts for the ib.flap check.
        self.flaps = FlapTracker(settings.ib)
        self.spool: Spool | None = None
        self.link: Any = None  # slurmgpu.agent.link.Link once keys load
        self.events: Any = None  # slurmgpu.agent.events.EventWatcher
        self.polls = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._facts: NodeFacts | None = None
        self._verdict: Verdict | None = None
        self._at = 0.0  # monotonic time of the last full poll
        self._gpu_at: dict[int, float] = {}  # monotonic time each GPU's facts were read
        self._versions: SoftwareVersions | None = None
        self._versions_at = 0.0
        self._full_at: float | None = None  # monotonic time of the last report with facts
        self._full_verdict: Severity | None = None  # the verdict of the last report sent
        self._xids: list[XidEvent] = []
        self._xids_seeded = False
        self._agent_findings: list[Finding] = []
        self._refresh_ids: list[str] = []
        self._keys_retry_at = 0.0
        self._state_error: str | None = None  # gate bookkeeping that failed (warm path)
        self.restarts_max = RESTARTS_MAX
        self._restarts: dict[str, list[float]] = {}  # thread -> monotonic times restarted
        self.vital_dead: str | None = None  # a vital thread that is dead for good
        self._sweep_at: float | None = 0.0  # monotonic time the jobs trash is swept next
        self._sweep_error: str | None = None
        # Event coalescing, per GPU (None: could not tell which): events waiting for the
        # next evaluation, when the last one ran, when a deferred one is due, what the
        # last evaluation found (an unchanged one is not a message), and when each health
        # (kind, code) was last judged (only its repeats wait).
        self._pending_events: dict[int | None, list[tuple[str, int | None]]] = {}
        self._evaluated_at: dict[int | None, float] = {}
        self._deferred: dict[int | None, float] = {}
        self._judged_codes: dict[int | None, dict[tuple[str, int | None], float]] = {}
        self._event_state: dict[int | None, tuple[Any, ...]] = {}
        self.events_evaluated = 0
        self.events_sent = 0
        self.checkpoints = CheckpointWatcher(
            node=node, jobs_dir=jobfiles.jobs_dir(settings),
            poll_s=settings.agent.checkpoint_poll_s, submit=self.submit, clock=self.clock)
        # The prolog's full-path refusals, from the hooks' gate.jsonl (same state dir as
        # slurmgpu.gate.Gate.state_dir): sent as prolog_blocked events after each poll.
        self.gate_log = GateLogForwarder(
            settings.paths.state_dir, node,
            lambda body, ts: self.submit(wire.EVENT, body, ts=ts))

    # ------------------------------------------------------------ query API (local socket)

    def latest(self) -> tuple[NodeFacts, Verdict, float] | None:
        with self._lock:
            if self._facts is None or self._verdict is None:
                return None
            return self._facts, self._verdict, self.clock.monotonic() - self._at

    def facts_for(self, gpus: frozenset[int] | None, max_age_s: float) -> NodeFacts:
        """Cached facts when every requested GPU was read within ``max_age_s`` (0: never);
        else re-read just those GPUs (and update the cache with them). Either way with the
        XIDs the agent remembers and its last sample as ``previous``."""
        now = self.clock.monotonic()
        with self._lock:
            base = self._facts
            if base is not None and max_age_s > 0:
                wanted = gpus if gpus is not None else {g.index for g in base.gpus}
                fresh = all(i in self._gpu_at and now - self._gpu_at[i] <= max_age_s for i in wanted)
                if gpus is None:
                    fresh = fresh and now - self._at <= max_age_s
                if fresh:
                    return _restrict(dataclasses.replace(base, xids=self._recent_xids()), gpus)
        if base is None:
            facts, _ = self.poll()
            return _restrict(facts, gpus)
        nvml = self.sources.nvml.collect(gpus)
        # IB by its own rule: the last poll's, unless older than [agent] max_age_s.
        ib = base.ib if now - self._at <= self.settings.agent.max_age_s else self.sources.ib.collect()
        with self._lock:
            xids = self._recent_xids()
        facts = assemble(self.node, nvml, collected_at=self.clock.time(), ib=ib,
                         versions=base.versions, xids=xids, previous=base, host=base.host)
        self._merge_gpus(nvml, now)
        return second_brake_sample(facts, self.sources, self.settings.thermal)

    # ------------------------------------------------------------ polling

    def poll(self) -> tuple[NodeFacts, Verdict]:
        """One full gather + evaluate (+ agent findings); updates the cache."""
        agent_cfg = self.settings.agent
        now = self.clock.monotonic()
        with self._lock:
            previous = self._facts
            want_versions = self._versions is None or now - self._versions_at >= agent_cfg.versions_interval_s
            xids = self._recent_xids()
        facts = gather(self.sources, node=self.node, xids=xids, previous=previous,
                       want_versions=want_versions)
        if not self._xids_seeded and facts.nvml.available:  # (PCI addresses map the log's XIDs)
            self._seed_xids(facts.nvml)
            with self._lock:
                facts.xids = self._recent_xids()
        if want_versions:
            self._versions, self._versions_at = facts.versions, now
        elif self._versions is not None:
            facts.versions = self._versions
        self.flaps.observe(facts.ib, now)
        if previous is not None:  # the kernel ring buffer may have rotated an SXid out
            facts.host.sxids = merge_sxids(facts.host.sxids, previous.host.sxids)
        verdict = evaluate(facts, self.settings)
        extra: list[Finding] = []
        spool_error = self.spool.take_error() if self.spool is not None else None
        if spool_error:
            extra.append(Finding(SPOOL_CHECK, Severity.WARN, spool_error))
        with self._lock:
            state_error, self._state_error = self._state_error, None
        if state_error:
            extra.append(Finding(STATE_DIR_CHECK, Severity.WARN, state_error))
        jobs_error = self._jobs_dir_error()
        if jobs_error:
            extra.append(Finding(JOBS_DIR_CHECK, Severity.WARN, jobs_error))
        verdict = Verdict(self.node, verdict.findings + tuple(extra), verdict.duration_ms)
        with self._lock:
            self._facts, self._verdict, self._at = facts, verdict, now
            self._agent_findings = extra
            self._gpu_at = {g.index: now for g in facts.gpus}
            self.polls += 1
        return facts, verdict

    def _jobs_dir_error(self) -> str | None:
        """A checkpoint request not written, or job directories the sweep cannot delete."""
        errors = [e for e in (self.checkpoints.take_error(), self._sweep_error) if e]
        return "; ".join(errors) or None

    def report_body(self, facts: NodeFacts, verdict: Verdict, *, full: bool = True) -> dict[str, Any]:
        """Problems in full; checks that found nothing wrong by id only (the collector
        keeps non-OK findings, and OK findings were most of a report's bytes). ``full``:
        with the node's facts (``_full_report_due``); the collector keeps the last ones."""
        problems = [f for f in verdict.findings if f.severity is not Severity.OK]
        bad = {f.check for f in problems}
        ok_checks = sorted({f.check for f in verdict.findings} - bad)
        body = {"verdict": verdict.severity.name, "findings": wire.encode_findings(problems),
                "ok_checks": ok_checks, **report_fields(facts)}
        if full:  # pre-packed: the collector keeps them as bytes (no 13 KB decode per report)
            body["facts"] = wire.packed(wire.plain(facts.to_json()))
        return body

    def _full_report_due(self, verdict: Verdict) -> bool:
        """Facts go with the first report, every ``full_report_s``, and whenever the verdict
        changes (the collector then keeps the facts that go with the problem)."""
        every = self.settings.agent.full_report_s
        now = self.clock.monotonic()
        due = (not every or self._full_at is None or now - self._full_at >= every
               or verdict.severity is not self._full_verdict)
        self._full_verdict = verdict.severity
        if due:
            self._full_at = now
        return due

    def poll_and_report(self) -> None:
        try:
            facts, verdict = self.poll()
        except Exception as exc:  # a broken source must not stop the loop
            self.log.exception("poll_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self.submit(wire.REPORT, self.report_body(facts, verdict, full=self._full_report_due(verdict)))
        self.log.info("poll", verdict=verdict.severity.name,
                      problems=len(verdict.problems()), duration_ms=round(verdict.duration_ms, 1))
        self.forward_gate_log()
        with self._lock:
            pending, self._refresh_ids = self._refresh_ids, []
        for command_id in pending:
            self.submit(wire.COMMAND_RESULT, {"command_id": command_id, "ok": True, "result": {
                "verdict": verdict.severity.name, "collected_at": facts.collected_at}})

    def forward_gate_log(self) -> int:
        """Send the full path's prolog refusals written since the last poll."""
        try:
            return self.gate_log.poll()
        except Exception as exc:  # an unreadable state dir must not stop the loop
            self.log.warning("gate_log_forward_failed", error=f"{type(exc).__name__}: {exc}")
            return 0

    def _recent_xids(self) -> list[XidEvent]:
        cutoff = self.clock.time() - self.settings.xid.kernel_log_lookback_s
        self._xids = [x for x in self._xids if x.timestamp is None or x.timestamp >= cutoff][-XIDS_MAX:]
        return list(self._xids)

    def _seed_xids(self, nvml: NvmlFacts) -> None:
        """Once, at the first poll that reached NVML: the XIDs saved before a restart and
        those the kernel log holds, over the window the hooks read (``kmsg.xid_window``)."""
        since = kmsg.xid_window(self.settings, self.clock.time())
        saved = [x for x in load_xids(self._xids_path) if x.timestamp is not None and x.timestamp >= since]
        try:
            logged = kmsg.read_xids(self.settings.paths.kmsg, kmsg.pci_map(nvml), since=since)
        except kmsg.KernelLogError as exc:
            self.log.warning("kernel_log_unreadable", error=str(exc))
            logged = []
        with self._lock:
            self._xids = kmsg.merge_xids(logged, saved + self._xids)
            self._xids_seeded = True
        self._save_xids()

    @property
    def _xids_path(self) -> str:
        return os.path.join(self.settings.paths.state_dir, XIDS_FILE)

    def _save_xids(self) -> None:
        """The remembered XIDs, with their text, to ``<state_dir>/xids.json``. A state dir
        that cannot be written is an ``agent.state_dir`` WARN; the XIDs stay in memory."""
        with self._lock:
            text = json.dumps([dataclasses.asdict(x) for x in self._recent_xids()])
        try:
            os.makedirs(self.settings.paths.state_dir, exist_ok=True)
            write_text_atomic(self._xids_path, text, mode=0o600)
        except OSError as exc:
            self.log.warning("xids_not_saved", path=self._xids_path, error=str(exc))
            with self._lock:
                self._state_error = f"could not save the XIDs it remembers: {exc}"

    def _merge_gpus(self, nvml: NvmlFacts, now: float) -> None:
        """Put freshly read GPUs into the cached facts and re-judge the node."""
        if not nvml.available:
            return
        with self._lock:
            base = self._facts
            if base is None:
                return
            fresh = {g.index: g for g in nvml.gpus}
            gpus = [fresh.pop(g.index, g) for g in base.gpus] + list(fresh.values())
            gpus.sort(key=lambda g: g.index)
            merged = dataclasses.replace(base, nvml=dataclasses.replace(base.nvml, gpus=gpus),
                                         xids=self._recent_xids())
            verdict = evaluate(merged, self.settings)
            self._facts = merged
            self._verdict = Verdict(self.node, verdict.findings + tuple(self._agent_findings),
                                    verdict.duration_ms)
            for index in {g.index for g in nvml.gpus}:
                self._gpu_at[index] = now

    # ------------------------------------------------------------ NVML events

    def on_nvml_event(self, kind: str, gpu: int | None, data: int | None) -> None:
        """An NVML event (called by the event thread). The GPU is re-judged at once, unless
        it was within ``COALESCE_S`` and the event is not health news (a non-health event, or
        a health event whose code this GPU's last ``COALESCE_S`` already judged): then the
        event waits for one deferred evaluation (``run_deferred``, from the main loop)."""
        now = self.clock.monotonic()
        with self._lock:
            if kind == "xid" and data is not None:
                self._xids.append(XidEvent(xid=data, gpu=gpu, timestamp=self.clock.time(),
                                           source="nvml event"))
            self._pending_events.setdefault(gpu, []).append((kind, data))
            if self._may_wait(gpu, (kind, data), now):
                self._deferred.setdefault(gpu, self._evaluated_at[gpu] + COALESCE_S)
                self._wake.set()
                return
            self._deferred.pop(gpu, None)
        self._evaluate_events(gpu)

    def _may_wait(self, gpu: int | None, event: tuple[str, int | None], now: float) -> bool:
        """Within the GPU's coalescing window: any non-health event, and a health event
        whose kind and code were judged on this GPU within the window."""
        last = self._evaluated_at.get(gpu)
        if last is None or now - last >= COALESCE_S:
            return False
        if event[0] not in HEALTH_KINDS:
            return True
        judged = self._judged_codes.get(gpu, {}).get(event)
        return judged is not None and now - judged < COALESCE_S

    def _note_judged(self, gpu: int | None, events: list[tuple[str, int | None]], now: float) -> None:
        recent = {e: at for e, at in self._judged_codes.get(gpu, {}).items() if now - at < COALESCE_S}
        recent.update((e, now) for e in events if e[0] in HEALTH_KINDS)
        self._judged_codes[gpu] = recent

    def run_deferred(self) -> float | None:
        """Evaluate GPUs whose coalescing window is over; seconds until the next one is due."""
        now = self.clock.monotonic()
        with self._lock:
            due = [gpu for gpu, at in self._deferred.items() if at <= now]
            for gpu in due:
                del self._deferred[gpu]
        for gpu in due:
            self._evaluate_events(gpu)
        with self._lock:
            return min(self._deferred.values()) - now if self._deferred else None

    def _evaluate_events(self, gpu: int | None) -> None:
        now_wall, now = self.clock.time(), self.clock.monotonic()
        scope = frozenset({gpu}) if gpu is not None else None
        with self._lock:
            events = self._pending_events.pop(gpu, [])
            self._evaluated_at[gpu] = now
            self._note_judged(gpu, events, now)
            base = self._facts
            xids = self._recent_xids()
        if not events:
            return
        if any(kind == "xid" for kind, _ in events):
            self._attach_xid_messages(gpu, xids, base, now_wall)
            self._save_xids()
        nvml = self.sources.nvml.collect(scope)
        facts = assemble(self.node, nvml, collected_at=now_wall, ib=base.ib if base else None,
                         versions=base.versions if base else None, xids=xids, previous=base)
        verdict = evaluate(facts, self.settings, scope=scope)
        findings = list(verdict.findings)
        if any(k == "gpu_lost" for k, _ in events) and verdict.severity is not Severity.FAIL:
            findings.append(Finding("gpu.lost", Severity.FAIL,
                                    "NVML event wait: GPU is lost (fell off the bus)", gpu=gpu))
        verdict = Verdict(self.node, tuple(findings), verdict.duration_ms)
        self.events_evaluated += 1
        texts = {x.xid: x.message for x in xids if x.gpu == gpu and x.message}
        self._send_events(gpu, events, verdict, texts)
        self._merge_gpus(nvml, now)
        if any(k in HEALTH_KINDS for k, _ in events):
            self.local_fallback(gpu, verdict.findings)

    def _attach_xid_messages(self, gpu: int | None, xids: list[XidEvent], base: NodeFacts | None,
                             now_wall: float) -> None:
        """An NVML event carries only the XID code; the driver logs its text (sub-unit,
        Fatal/Nonfatal: what decides some XIDs' action) to the kernel log at the same time.
        Take it from there for this GPU's XIDs that have none yet."""
        waiting = [x for x in xids if x.message is None and x.gpu == gpu and x.source == "nvml event"]
        if not waiting or base is None:
            return
        try:
            logged = [e for e in kmsg.read_xids(self.settings.paths.kmsg, kmsg.pci_map(base.nvml),
                                                since=now_wall - KMSG_LOOKBACK_S)
                      if e.gpu == gpu and e.message]
        except kmsg.KernelLogError as exc:
            self.log.warning("kernel_log_unreadable", error=str(exc))
            return
        for x in waiting:
            match = next((e for e in reversed(logged) if e.xid == x.xid), None)
            if match is not None:
                x.message = match.message

    def _send_events(self, gpu: int | None, events: list[tuple[str, int | None]], verdict: Verdict,
                     texts: Mapping[int, str | None] | None = None) -> None:
        """Each health event goes on the wire; other events only when what the GPU's
        evaluation found changed since the last one."""
        state = (verdict.severity, tuple(sorted((f.check, f.severity, f.gpu, f.message)
                                                for f in verdict.problems())))
        with self._lock:
            changed = self._event_state.get(gpu) != state
            self._event_state[gpu] = state
        health = [e for e in events if e[0] in HEALTH_KINDS]
        if not health and not changed:
            self.log.debug("nvml_event_unchanged", gpu=gpu, events=len(events))
            return
        sent = health[:MAX_EVENTS_PER_EVAL] or [events[-1]]
        findings = wire.encode_findings(verdict.findings)
        for i, (kind, data) in enumerate(sent):
            body: dict[str, Any] = {"kind": kind, "gpu": gpu, "data": data,
                                    "verdict": verdict.severity.name, "findings": findings}
            if i == len(sent) - 1 and len(events) > len(sent):
                body["coalesced"] = len(events) - len(sent)
            if kind == "xid" and data is not None and (texts or {}).get(data):
                body["message"] = (texts or {})[data]  # the kernel log's text, bounded
            self.submit(wire.EVENT, body)
            self.events_sent += 1
            self.log.warning("nvml_event", kind=kind, gpu=gpu, data=data, verdict=verdict.severity.name,
                             coalesced=body.get("coalesced", 0))

    def link_connected(self) -> bool:
        link = self.link
        return link is not None and bool(getattr(link, "connected", False))

    def local_fallback(self, gpu: int | None, findings: Iterable[Finding]) -> list[dict[str, Any]]:
        """Collector unreachable and a "drain-now" finding (XID 79, ...): ask every local
        job to checkpoint and signal it ourselves (``CheckpointWatcher.local_fallback``);
        a ``local_checkpoint`` event tells the collector once the link is back."""
        signal_name = self.settings.agent.fallback_signal
        if not signal_name or self.link_connected():
            return []
        try:
            table = PolicyTable(self.settings.automation)
        except ValueError as exc:
            self.log.error("local_fallback_policy_invalid", error=str(exc))
            return []
        trigger = [f for f in findings if table.action(f) is Action.DRAIN_NOW]
        if not trigger:
            return []
        jobs = self.checkpoints.local_fallback(
            trigger, signal_name=signal_name,
            deadline_s=self.settings.automation.checkpoint_deadline_s)
        if jobs:
            self.submit(wire.EVENT, {"kind": "local_checkpoint", "gpu": gpu, "data": None,
                                     "verdict": Severity.FAIL.name,
                                     "findings": wire.encode_findings(trigger), "jobs": jobs})
        return jobs

    # ------------------------------------------------------------ messages

    def submit(self, mtype: str, body: dict[str, Any], *, ts: float | None = None) -> int | None:
        """Spool (then send) one acked message; returns its seq (None: not sendable).
        ``ts``: when it happened (default: now)."""
        spool = self.spool
        if spool is None:
            return None

        def encode(seq: int) -> bytes:
            # (called by the spool under its lock: the epoch is the one ``seq`` belongs to)
            return wire.message_frame(mtype, self.node, seq, body, epoch=spool.epoch,
                                      ts=None if ts is None else float(ts))

        try:
            item = spool.append(mtype, encode)
        except (wire.WireError, TypeError, ValueError) as exc:
            self.log.error("message_not_encodable", type=mtype, error=str(exc))
            return None
        link = self.link
        if link is not None:
            if item.stored:
                link.wake()
            else:
                link.send_unspooled(item.frame)
        return item.seq

    def bookkeeping_failed(self, errors: list[str]) -> None:
        """A gate run on the warm path decided, but could not record (state dir full or
        read-only): the next report says so as an ``agent.state_dir`` WARN."""
        with self._lock:
            self._state_error = f"could not record gate bookkeeping: {errors[0]}" + (
                f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")

    def prolog_blocked(self, job_id: str | None, record: dict[str, Any]) -> None:
        """The warm-path prolog refused a job: tell the collector (fleet report: jobs
        affected, and requeued: Slurm requeues it). No findings: the node's own reports
        carry those. (The full path's refusals: ``slurmgpu.agent.gatelog``.)"""
        self.submit(wire.EVENT, {**blocked_event(record, "agent"), "job_id": job_id})

    def hello_body(self) -> dict[str, Any]:
        with self._lock:
            gpus = self._facts.nvml.device_count if self._facts is not None else 0
        return {"version": __version__, "gpus": gpus, "interval_s": self.settings.agent.interval_s}

    def on_connected(self) -> None:
        self.submit(wire.HELLO, self.hello_body())
        self._full_at = None  # a new collector (or a new database) gets the facts at the next report

    def handle_command(self, message: wire.Envelope) -> None:
        command = message.body.get("command")
        self.log.info("command", command=command, command_id=message.id)
        if command == "ping":
            self.submit(wire.COMMAND_RESULT, {"command_id": message.id, "ok": True, "result": {
                "pong": True, "node": self.node, "version": __version__}})
        elif command == "refresh":
            with self._lock:
                self._refresh_ids.append(message.id)
            self._wake.set()
        elif command == "checkpoint":
            ok, result = self._checkpoint(message)
            self.submit(wire.COMMAND_RESULT, {"command_id": message.id, "ok": ok, "result": result})
        else:
            self.submit(wire.COMMAND_RESULT, {"command_id": message.id, "ok": False,
                                              "result": {"error": "unknown command",
                                                         "command": str(command)}})

    def _checkpoint(self, message: wire.Envelope) -> tuple[bool, dict[str, Any]]:
        """The checkpoint command; anything it raises is its error result."""
        args = message.body.get("args")
        try:
            return self.checkpoints.request(message.id, args if isinstance(args, dict) else {})
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
            self.log.exception("checkpoint_command_failed", command_id=message.id, error=error)
            job_id = args.get("job_id") if isinstance(args, dict) else None
            return False, {"job_id": str(job_id)[:64], "error": error}

    # ------------------------------------------------------------ job directories

    def sweep_soon(self) -> None:
        """A job directory was retired (warm-path epilog): the main loop deletes it."""
        with self._lock:
            self._sweep_at = self.clock.monotonic()
        self._wake.set()

    def sweep_jobs_trash(self) -> None:
        """Delete retired job directories within one sweep's budget; with more left, sweep
        again in SWEEP_AGAIN_S, and say what cannot be deleted (a finding)."""
        now = self.clock.monotonic()
        with self._lock:
            due = self._sweep_at is not None and now >= self._sweep_at
            if due:
                self._sweep_at = None
        if not due:
            return
        try:
            sweep = jobfiles.sweep_trash(jobfiles.jobs_dir(self.settings))
        except OSError as exc:
            self._sweep_error = f"cannot sweep retired job directories: {exc}"
            return
        self._sweep_error = None
        if sweep.errors:
            self._sweep_error = (f"{len(sweep.errors)} retired job directories not deleted: "
                                 + "; ".join(list(sweep.errors.values())[:3]))
            self.log.warning("job_dir_cleanup_failed", errors=dict(list(sweep.errors.items())[:5]))
        if not sweep.done:
            with self._lock:
                self._sweep_at = now + (SWEEP_AGAIN_S if not sweep.errors else self.settings.agent.interval_s)

    # ------------------------------------------------------------ vital threads

    def revive_threads(self) -> None:
        """Start a dead vital thread again (one log line); past RESTARTS_MAX in
        RESTART_WINDOW_S, mark it dead for good: the watchdog pings stop."""
        if self.stop_event.is_set():
            return
        for name, dead, restart in self._vital_threads():
            if dead and self.vital_dead is None:
                self._restart(name, restart)

    def _vital_threads(self) -> list[tuple[str, bool, Callable[[], object]]]:
        link, events = self.link, self.events
        return [
            ("link", link is not None and not link.is_alive(), self.start_link),
            ("events", events is not None and not events.is_alive() and not events.gave_up,
             self.start_events),
            ("checkpoints", self.checkpoints.dead, self.checkpoints.restart),
        ]

    def _restart(self, name: str, restart: Callable[[], object]) -> None:
        now = self.clock.monotonic()
        times = [t for t in self._restarts.get(name, []) if now - t < RESTART_WINDOW_S]
        if len(times) >= self.restarts_max:
            self.vital_dead = name
            self.log.error("vital_thread_dead", thread=name, restarts=len(times),
                           note="watchdog pings stop: systemd restarts the agent")
            return
        self._restarts[name] = [*times, now]
        self.log.error("vital_thread_restarted", thread=name, restarts=len(times) + 1)
        restart()

    def ping_watchdog(self) -> None:
        """WATCHDOG=1 when due, unless a vital thread is dead for good."""
        if self.vital_dead is None:
            self.notifier.ping_if_due(self.clock.monotonic())

    # ------------------------------------------------------------ lifecycle

    def open_spool(self) -> Spool:
        if self.spool is None:
            self.spool = Spool(self.settings.agent.spool_dir, self.settings.agent.spool_max_mb)
        return self.spool

    def start_link(self) -> bool:
        from slurmgpu.agent.link import Link

        self._keys_retry_at = self.clock.monotonic() + KEYS_RETRY_S
        from slurmgpu.keys import InsecureKeyError

        try:
            keys = load_client_keys(self.keys_dir)
        except InsecureKeyError:
            raise  # docs/keys.md: a secret open to others is refused, the agent does not start
        except Exception as exc:
            self.log.error("collector_keys_missing", keys_dir=self.keys_dir,
                           error=f"{type(exc).__name__}: {exc}", retry_s=KEYS_RETRY_S,
                           note="running locally; messages are spooled")
            return False
        self.link = Link(addresses=self.settings.collector.addresses, node=self.node, keys=keys,
                         spool=self.open_spool(), heartbeat_s=self.settings.agent.heartbeat_s,
                         on_command=self.handle_command, on_connected=self.on_connected,
                         events_port=self.settings.collector.events_port)
        self.link.start()
        return True

    def start_events(self) -> None:
        from slurmgpu.agent.events import EventWatcher
        from slurmgpu.sources.deadline import DeadlineNvmlSource
        from slurmgpu.sources.nvml import PynvmlSource

        nvml = self.sources.nvml
        real = nvml.source if isinstance(nvml, DeadlineNvmlSource) else nvml
        if not self.settings.agent.events or not isinstance(real, PynvmlSource):
            return
        self.events = EventWatcher(self.settings.nvml.library, self.on_nvml_event, self.stop_event,
                                   node=self.node)
        self.events.start()

    def stop(self) -> None:
        self.stop_event.set()
        self._wake.set()

    def run(self, stop_event: threading.Event | None = None) -> None:
        """Poll until ``stop()`` (or ``stop_event``); READY after the first poll."""
        if stop_event is not None:
            self.stop_event = stop_event
        self.open_spool()
        self.poll_and_report()  # first, so the hello can say how many GPUs there are
        self.start_link()
        self.notifier.ready()
        self.start_events()
        interval = self.settings.agent.interval_s
        next_poll = self.clock.monotonic() + interval
        deferred: float | None = None
        self.notifier.ping_if_due(self.clock.monotonic())
        try:
            while not self.stop_event.is_set():
                now = self.clock.monotonic()
                wait = next_poll - now
                ping = self.notifier.next_ping_in(now)
                if ping is not None:
                    wait = min(wait, ping)
                if self.link is None:
                    wait = min(wait, self._keys_retry_at - now)
                if deferred is not None:
                    wait = min(wait, deferred)
                with self._lock:
                    if self._sweep_at is not None:
                        wait = min(wait, self._sweep_at - now)
                self._wake.wait(max(0.0, min(wait, 60.0)))
                self._wake.clear()
                if self.stop_event.is_set():
                    break
                deferred = self.run_deferred()
                now = self.clock.monotonic()
                with self._lock:
                    refresh = bool(self._refresh_ids)
                if refresh or now >= next_poll:
                    self.poll_and_report()
                    next_poll = next_poll + interval if not refresh else now + interval
                    if next_poll <= now:  # fell behind (slow poll, suspend): no burst
                        next_poll = now + interval
                if self.link is None and now >= self._keys_retry_at:
                    self.start_link()
                self.revive_threads()
                self.sweep_jobs_trash()
                self.ping_watchdog()
        finally:
            self.notifier.stopping()
            self.shutdown()

    def shutdown(self) -> None:
        self.stop_event.set()
        self.checkpoints.stop()
        self.checkpoints.join(timeout=2.0)
        if self.link is not None:
            self.link.stop()
            self.link.join(timeout=2.0)
        if self.events is not None:
            self.events.join(timeout=2.0)
        if self.spool is not None:
            self.spool.close()
