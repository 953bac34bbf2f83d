"""Prometheus ``/metrics`` for the collector (``[collector] metrics_bind``).

Everything is computed at scrape time, in the HTTP server's thread, from the store (read
only) and the collector's counters, never on the ingest loop.

Design notes: docs/design-notes.md (``slurmgpu/collector/metrics.py``).
"""

from __future__ import annotations

import functools
import select
import socket
import sqlite3
import ssl
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurmgpu.collector.store import queries
from slurmgpu.collector.store.remediation import OUTCOMES, drain_outcome_counts, ladder_stage_counts
from slurmgpu.result import Severity
from slurmgpu.wire import EVENT_KINDS

if TYPE_CHECKING:
    from slurmgpu.collector.counters import MetricsSource

CONFIG_KEY = "collector.metrics_bind"
# The collector's reject reasons (transport.py): exported at 0 before the first one.
REJECT_REASONS = ("frames", "unknown_key", "oversized", "version", "malformed", "node_mismatch",
                  "routing_mismatch", "unexpected_type")
CHECKPOINT_STATES = ("open", "acked", "expired", "done")
# Gauge value of a verdict / a finding's severity (its exit code: OK 0, WARN 1, FAIL 2, UNKNOWN 3).
VERDICT_CODE = {s.name: s.exit_code for s in Severity}
# A severity's rank (as the store orders them: OK < WARN < UNKNOWN < FAIL) -> its code.
RANK_CODE = {s.rank: s.exit_code for s in Severity}
# At most this many per-GPU series per node (label cardinality from what nodes send).
MAX_GPU_SERIES_PER_NODE = 128
RATE_WINDOW_S = 60.0
SAMPLE_EVERY_S = 1.0
LabelValues = TypeVar("LabelValues", bound=tuple[str, ...])


def parse_bind(bind: str) -> tuple[str, int]:
    """``"host:port"`` (``"[v6addr]:port"`` for IPv6; port 0 = any free port) ->
    (host, port). A ValueError names the config key."""
    text = bind.strip()
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address without brackets: ambiguous
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{CONFIG_KEY} = {bind!r}: expected \"host:port\" "
                         f"(e.g. \"0.0.0.0:9750\", \"[::]:9750\"), or \"\" for no metrics")
    return host, int(port_text)


def verdict_name(verdict: str | None) -> str:
    name = str(verdict).upper() if verdict else Severity.UNKNOWN.name
    return name if name in VERDICT_CODE else Severity.UNKNOWN.name


def _per_node(name: str, documentation: str, nodes: list[str], values: list[int] | list[float]) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=["node"])
    for node, value in zip(nodes, values, strict=True):
        family.add_metric([node], value)
    return family


def _labelled(kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, documentation: str,
              labels: list[str], values: Mapping[LabelValues, float]) -> Metric:
    """A family with one sample per label tuple of ``values``, in sorted order."""
    family = kind(name, documentation, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


class IngestRate:
    """Stored-message rate over the last ``window_s``: a ring of (monotonic time, stored
    total) samples, appended by the collector loop at most every ``every_s``, read by the
    scrape thread (a deque's append and ``list()`` copy are atomic under the GIL)."""

    def __init__(self, window_s: float = RATE_WINDOW_S, every_s: float = SAMPLE_EVERY_S) -> None:
        self.window_s = window_s
        self.every_s = every_s
        self._samples: deque[tuple[float, int]] = deque(maxlen=int(window_s / every_s) + 2)

    def sample(self, stored: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._samples and now - self._samples[-1][0] < self.every_s:
            return
        self._samples.append((now, stored))

    def rate(self, stored: int, now: float | None = None) -> float:
        """Messages stored per second since the oldest sample still in the window."""
        now = time.monotonic() if now is None else now
        for t, count in list(self._samples):
            if now - t <= self.window_s:
                elapsed = now - t
                return max(0, stored - count) / elapsed if elapsed >= self.every_s else 0.0
        return 0.0


class StoreReads(NamedTuple):
    """What the store's families show, read in one snapshot."""

    nodes: queries.NodeVerdictColumns
    findings: list[queries.FindingCount]
    events: list[queries.EventCount]
    decisions: list[queries.DecisionCount]
    checkpoint_states: dict[str, int]
    pending_drains: int
    drain_outcomes: list[tuple[str, str, str, int]]
    ladder_stages: dict[str, int]

    @classmethod
    def read(cls, db: queries.Connection) -> StoreReads:
        return cls(queries.node_verdict_columns(db), queries.current_findings(db),
                   queries.event_counts(db), queries.decision_counts(db),
                   queries.checkpoint_states(db), queries.pending_drain_count(db),
                   drain_outcome_counts(db), ladder_stage_counts(db))


class FleetMetrics:
    """The prometheus_client collector: ``collect()`` builds every family per scrape."""

    def __init__(self, collector: MetricsSource) -> None:
        self.collector = collector
        self.rate = IngestRate()
        self.started = time.time()
        self.store_errors = 0
        self.series_dropped = 0

    def sample(self) -> None:
        """From the collector loop (cheap; at most one sample a second)."""
        self.rate.sample(self.collector.counters.stored)

    # ------------------------------------------------------------------ collect

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        yield from self._ingest()
        status = self._automation_status()
        drained: set[str] | None = None
        if status is not None:
            drained = {str(n) for n in status.get("drained") or ()}
            yield from self._automation(status)
        try:
            families = self._store(drained)
        except sqlite3.Error as exc:
            self.store_errors += 1
            families = None
            self.collector.log.warning("metrics_store_failed", error=str(exc))
        ok = families is not None
        yield from families or ()
        yield GaugeMetricFamily("slurmgpu_store_writable", "0 while the collector's store batches keep failing "
                                "(nothing is acked; agents keep spooling), else 1.",
                                value=0 if self.collector.counters.store_failing else 1)
        yield GaugeMetricFamily("slurmgpu_store_up", "1 if this scrape could read the fleet database, else 0 "
                                "(the store's metrics are then left out).", value=1 if ok else 0)
        yield CounterMetricFamily("slurmgpu_metrics_store_errors", "Scrapes that could not read the fleet "
                                  "database.", value=self.store_errors)
        yield CounterMetricFamily("slurmgpu_metrics_series_dropped", "Per-GPU series left out (over "
                                  f"{MAX_GPU_SERIES_PER_NODE} GPUs for one node).", value=self.series_dropped)
        yield GaugeMetricFamily("slurmgpu_metrics_scrape_duration_seconds", "Time this scrape took to compute "
                                "its metrics.", value=time.perf_counter() - began)

    def _ingest(self) -> Iterable[Metric]:
        c = self.collector.counters
        yield GaugeMetricFamily("slurmgpu_collector_up", "1 while the collector is serving.", value=1)
        yield GaugeMetricFamily("slurmgpu_collector_start_time_seconds",
                                "Unix time the collector's metrics server started.", value=self.started)
        yield GaugeMetricFamily("slurmgpu_allowed_nodes", "Node keys in the allow-list.",
                                value=len(self.collector.allowed))
        for name, doc, value in (
            ("slurmgpu_messages_received", "Frames received from agents (all types, before validation; a "
             "bundle is one).", c.received),
            ("slurmgpu_bundles_received", "Bundles received: one frame carrying several of a node's spooled "
             "messages (a backlog).", c.bundles),
            ("slurmgpu_bundled_messages_received", "Messages received in bundles.", c.bundled),
            ("slurmgpu_messages_stored", "Acked-type messages newly stored (hello, report, event, "
             "command-result).", c.stored),
            ("slurmgpu_messages_duplicates", "Acked-type messages already stored (resends), acked again and "
             "not stored.", c.duplicates),
            ("slurmgpu_messages_duplicate_conflicts", "Duplicates (same node, spool epoch and seq) whose body "
             "differs from the stored message: dropped, logged.", c.conflicts),
            ("slurmgpu_heartbeats_received", "Heartbeats received from agents.", c.heartbeats_received),
            ("slurmgpu_heartbeats_sent", "Heartbeats sent to agents.", c.heartbeats_sent),
            ("slurmgpu_probes_answered", "`slurmgpu doctor` probes answered (a node's key checked from another "
             "socket; its route and last-seen time are left alone).", c.probes_answered),
            ("slurmgpu_acks_sent", "Ack frames sent.", c.acks_sent),
            ("slurmgpu_acks_failed", "Ack frames that could not be sent (peer gone or queue full; the agent "
             "resends).", c.acks_failed),
            ("slurmgpu_store_batches", "Batches written to the store (one transaction each).", c.batches),
            ("slurmgpu_store_errors", "Failed store transactions (nothing acked; agents resend).", c.store_errors),
            ("slurmgpu_decisions_recorded", "Automation decisions recorded by this process.", c.decisions),
            ("slurmgpu_automation_errors", "Automation calls that raised (logged, serving goes on).",
             c.automation_errors),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        counts = dict(c.rejected)
        yield _labelled(CounterMetricFamily, "slurmgpu_messages_rejected", "Frames rejected, by reason.",
                        ["reason"], {(reason,): counts.get(reason, 0) for reason in {*REJECT_REASONS, *counts}})
        yield GaugeMetricFamily("slurmgpu_ingest_reports_per_second", f"Messages stored per second over the "
                                f"last {RATE_WINDOW_S:g} s.", value=self.rate.rate(c.stored))

    def _automation_status(self) -> dict[str, Any] | None:
        status_fn = getattr(self.collector.automation, "status", None)
        if status_fn is None:
            return None
        for _ in range(3):  # the loop thread may be changing the state while we copy it
            try:
                status: dict[str, Any] = status_fn()
                return status
            except RuntimeError:
                continue
            except Exception as exc:  # a broken automation must not break the scrape
                self.collector.log.warning("metrics_automation_failed", error=str(exc))
                return None
        return None

    def _automation(self, status: dict[str, Any]) -> Iterable[Metric]:
        yield GaugeMetricFamily("slurmgpu_breaker_open", "1 while the automation's circuit breaker is open "
                                "(drains held).", value=1 if status.get("breaker_open") else 0)
        yield GaugeMetricFamily("slurmgpu_breaker_held_nodes", "Nodes whose drain is held by the open breaker.",
                                value=len(status.get("held") or ()))
        yield GaugeMetricFamily("slurmgpu_lemon_nodes", "Lemon nodes (drained too often; never auto-resumed).",
                                value=len(status.get("lemons") or ()))
        yield GaugeMetricFamily("slurmgpu_automation_drained_nodes", "Nodes drained by the automation and not "
                                "resumed yet.", value=len(status.get("drained") or ()))
        yield GaugeMetricFamily("slurmgpu_automation_dry_run", "1 if the automation records decisions without "
                                "Slurm calls.", value=1 if status.get("dry_run") else 0)

    # ------------------------------------------------------------------ the store

    def _store(self, drained: set[str] | None) -> list[Metric] | None:
        """The store's families, read in one read-only snapshot (None for an in-memory
        store: no file to read)."""
        path = self.collector.store.path
        if str(path) == ":memory:":
            return None
        with queries.snapshot(path) as db:
            reads = StoreReads.read(db)
        return self._families(reads, drained)

    def _families(self, reads: StoreReads, drained: set[str] | None) -> list[Metric]:
        return [*self._node_families(reads.nodes, drained), *self._finding_families(reads.findings),
                *self._event_families(reads.events), *self._decision_families(reads.decisions),
                *self._checkpoint_families(reads.checkpoint_states, reads.pending_drains),
                *self._verdict_quality_families(reads.drain_outcomes),
                _labelled(GaugeMetricFamily, "slurmgpu_remediation_nodes", LADDER_HELP, ["stage"],
                          {(stage,): n for stage, n in reads.ladder_stages.items()})]

    def _node_families(self, cols: queries.NodeVerdictColumns, drained: set[str] | None) -> list[Metric]:
        """Nodes: latest report's verdict, last seen, reachable; the fleet by verdict."""
        now = time.time()
        names = [verdict_name(v) for v in cols.verdicts]
        by_verdict = {**dict.fromkeys(VERDICT_CODE, 0), **Counter(names)}
        out: list[Metric] = [
            _per_node("slurmgpu_node_verdict", NODE_VERDICT_HELP, cols.nodes, [VERDICT_CODE[n] for n in names]),
            _per_node("slurmgpu_node_last_seen_seconds", LAST_SEEN_HELP, cols.nodes,
                      [max(0.0, now - t) for t in cols.last_seen]),
            _per_node("slurmgpu_node_reachable", REACHABLE_HELP, cols.nodes, cols.reachable),
            GaugeMetricFamily("slurmgpu_fleet_nodes", FLEET_NODES_HELP, value=len(cols.nodes))]
        fleet = GaugeMetricFamily("slurmgpu_fleet_nodes_by_verdict", BY_VERDICT_HELP, labels=["verdict"])
        for name, count in by_verdict.items():
            fleet.add_metric([name], count)
        out.append(fleet)
        if drained is not None:
            known = sorted(drained.union(cols.nodes))
            out.append(_per_node("slurmgpu_node_drained", DRAINED_HELP, known,
                                 [1 if name in drained else 0 for name in known]))
        return out

    def _finding_families(self, current: list[queries.FindingCount]) -> list[Metric]:
        """Current findings (each node's latest state change) by check and severity, and
        per GPU its worst severity."""
        per_check: Counter[tuple[str, str]] = Counter()
        gpu_rank: dict[tuple[str, int], int] = {}
        for node, gpu_index, check, severity, rank, n in current:
            per_check[(str(check), str(severity))] += n
            if gpu_index is not None and rank > gpu_rank.get((node, gpu_index), 0):
                gpu_rank[(node, gpu_index)] = rank
        return [self._findings_family(per_check), self._gpu_family(gpu_rank)]

    @staticmethod
    def _findings_family(per_check: Counter[tuple[str, str]]) -> Metric:
        """Current non-OK findings by (check, severity), unknown ones as "other"."""
        capped: Counter[tuple[str, str]] = Counter()
        for (check, severity), count in per_check.items():
            capped[(check_label(check), severity if severity in VERDICT_CODE else OTHER)] += count
        return _labelled(GaugeMetricFamily, "slurmgpu_findings", FINDINGS_HELP, ["check", "severity"], capped)

    def _gpu_family(self, gpu_rank: dict[tuple[str, int], int]) -> Metric:
        """Per GPU with a current non-OK finding, its worst severity's code (by node, GPU)."""
        family = GaugeMetricFamily("slurmgpu_gpu_verdict", GPU_VERDICT_HELP, labels=["node", "gpu"])
        per_node: Counter[str] = Counter()
        for (node, gpu_index), rank in sorted(gpu_rank.items()):
            per_node[node] += 1
            if per_node[node] <= MAX_GPU_SERIES_PER_NODE:
                family.add_metric([str(node), str(gpu_index)], RANK_CODE[rank])
            else:
                self.series_dropped += 1
        return family

    def _event_families(self, counts: list[queries.EventCount]) -> list[Metric]:
        """Events (history within the retention): by kind, XIDs by code."""
        per_kind: Counter[tuple[str]] = Counter()
        per_xid: Counter[tuple[str]] = Counter()
        for kind, xid, count in counts:
            per_kind[(str(kind) if kind in EVENT_KINDS else OTHER,)] += count
            if kind == "xid":
                per_xid[(xid_label(xid),)] += count
        return [_labelled(CounterMetricFamily, "slurmgpu_events", "Events stored (within the retention), by kind.",
                          ["kind"], per_kind),
                _labelled(CounterMetricFamily, "slurmgpu_xid_events", "XID events stored (within the retention), "
                          "by XID code.", ["xid"], per_xid)]

    def _decision_families(self, counts: list[queries.DecisionCount]) -> list[Metric]:
        """Automation decisions (history within the retention) by result and by trigger."""
        per_result: Counter[tuple[str, str]] = Counter()
        per_trigger: Counter[tuple[str, str]] = Counter()
        for action, result, trigger, count in counts:
            per_result[(action, result)] += count
            per_trigger[(action, trigger)] += count
        return [_labelled(CounterMetricFamily, "slurmgpu_actions", ACTIONS_HELP, ["action", "result"], per_result),
                _labelled(CounterMetricFamily, "slurmgpu_actions_by_trigger", TRIGGERS_HELP, ["action", "trigger"],
                          per_trigger)]

    def _checkpoint_families(self, counts: dict[str, int], pending_drains: int) -> list[Metric]:
        """Checkpoint requests by state; nodes whose drain waits for them."""
        per_state = {**dict.fromkeys(CHECKPOINT_STATES, 0), **counts}
        states = _labelled(GaugeMetricFamily, "slurmgpu_checkpoints", "Checkpoint requests (within the retention) "
                           "by state; a gauge: requests move between states.", ["state"],
                           {(state,): n for state, n in per_state.items()})
        pending = GaugeMetricFamily("slurmgpu_pending_drains", "Nodes whose drain waits for "
                                    "their jobs' checkpoints.", value=pending_drains)
        open_ = GaugeMetricFamily("slurmgpu_checkpoints_pending", "Checkpoint requests "
                                  "still open (not acked, expired or done).", value=per_state["open"])
        return [open_, states, pending]

    @staticmethod
    def _verdict_quality_families(counts: list[tuple[str, str, str, int]]) -> list[Metric]:
        """The report's verdict_quality: drains and their outcomes by check and GPU model."""
        outcomes = CounterMetricFamily("slurmgpu_drain_outcomes", OUTCOMES_HELP,
                                       labels=["check", "gpu_model", "outcome"])
        per_drain: Counter[tuple[str, str]] = Counter()
        per_outcome: Counter[tuple[str, str, str]] = Counter()
        for check, model, outcome, n in counts:
            key = (check_label(check), model)
            per_drain[key] += n
            per_outcome[(*key, outcome if outcome in OUTCOMES else OTHER)] += n
        for key in sorted(per_drain):
            for outcome in OUTCOMES:
                outcomes.add_metric([*key, outcome], per_outcome.pop((*key, outcome), 0))
        for labels, n in sorted(per_outcome.items()):
            outcomes.add_metric(list(labels), n)
        return [_labelled(CounterMetricFamily, "slurmgpu_drains", DRAINS_HELP, ["check", "gpu_model"], per_drain),
                outcomes]


NODE_VERDICT_HELP = "Verdict of the node's latest report: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN (or no report yet)."
LAST_SEEN_HELP = "Seconds since the collector last heard from the node (any message)."
REACHABLE_HELP = "1 if the node is reachable, 0 once silent for unreachable_after heartbeats."
FLEET_NODES_HELP = "Nodes known to the collector (heard from at least once)."
BY_VERDICT_HELP = "Nodes by the verdict of their latest report."
DRAINED_HELP = ("1 if the automation drained the node and has not resumed it (drains by others "
                "are not known here).")
FINDINGS_HELP = ("Current non-OK findings across the fleet (from each node's latest report), by "
                 "check and severity.")
GPU_VERDICT_HELP = ("Worst severity of the GPU's current findings: 1 WARN, 2 FAIL, 3 UNKNOWN (only "
                    "GPUs with a current non-OK finding are exported; absent = OK).")
ACTIONS_HELP = ("Automation decisions (within the retention) by action and result (\"error: ...\" results "
                "count as \"error\").")
TRIGGERS_HELP = ("Automation decisions (within the retention) by action and trigger (the check id, \"healthy\" "
                 "for a resume).")
DRAINS_HELP = ("Drains with a recorded outcome (the report's verdict_quality: the fleet "
               "database's whole history), by check and GPU model.")
LADDER_HELP = ("Nodes on the return-to-service ladder, by stage (drained, awaiting_validation, "
               "reset, reboot, held: slurmgpu could not carry its steps out, an operator decides).")
OUTCOMES_HELP = ("What those drains turned out to be, by check, GPU model and outcome: confirmed, "
                 "cleared_by_validation (a false-positive candidate), transient (cleared by a "
                 "reset or reboot), unknown (resumed without validation).")

# Label cardinality from what nodes send: check ids, event kinds and XID codes outside the
# known sets become "other".
OTHER = "other"
MAX_XID_LABEL = 1023


@functools.cache
def known_checks() -> frozenset[str]:
    from slurmgpu.checks.registry import all_checks

    return frozenset({c.id for c in all_checks()} | {"agent.spool", "agent.state_dir"})


def check_label(check: str) -> str:
    return check if check in known_checks() else OTHER


def xid_label(xid: int | None) -> str:
    return "unknown" if xid is None else str(xid) if 0 <= int(xid) <= MAX_XID_LABEL else OTHER


# A scraper gets this long to send its request and read the answer: an idle or trickling
# connection (slowloris) is closed instead of holding a thread.
REQUEST_TIMEOUT_S = 10.0
# At most this many requests are served at once; more are turned away.
MAX_WORKERS = 4
# A connection holds none of those until its request line has arrived (over TLS: its
# handshake is done and its first record arrived), which it gets this long for; at most
# MAX_WAITING connections wait so, more are closed at accept. Idle sockets cannot keep
# a scraper out.
REQUEST_LINE_TIMEOUT_S = 2.0
MAX_WAITING = 64
_MAX_REQUEST_LINE = 65537  # (http.server's bound)
# A scrape is computed at most once per this many seconds; scrapers in between (and
# concurrent ones) get the same bytes, so scrapers cannot load the collector's database.
CACHE_S = 1.0


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log on stderr


class CachedExposition:
    """The WSGI app: the registry's text format (``generate_latest``) at most once per
    ``CACHE_S``, under a lock."""

    def __init__(self, registry: CollectorRegistry, cache_s: float | None = None) -> None:
        self.registry = registry
        self.cache_s = CACHE_S if cache_s is None else cache_s
        self.computed = 0  # scrapes actually computed (tests, and the docs' figures)
        self._lock = threading.Lock()
        self._body = b""
        self._at = -1e9

    def body(self) -> bytes:
        with self._lock:
            if time.monotonic() - self._at >= self.cache_s:
                self._body = generate_latest(self.registry)
                self._at = time.monotonic()
                self.computed += 1
            return self._body

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; see /metrics\n"]
        body = self.body()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                  ("Content-Length", str(len(body)))])
        return [body]


class _BoundedServer(WSGIServer):
    """One thread per connection: at most MAX_WAITING waiting for their request line (for
    REQUEST_LINE_TIMEOUT_S), at most MAX_WORKERS serving one; a connection past either
    bound is closed (a scraper retries; a flood does not pile up threads)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_WORKERS)
        self.waiting = threading.BoundedSemaphore(MAX_WAITING)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.waiting.acquire(blocking=False):
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._serve, args=(request, client_address), daemon=True)
        thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that times out or fails the TLS handshake is not the collector's error

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            try:
                arrived = request_line_arrived(request, REQUEST_LINE_TIMEOUT_S)
            finally:
                self.waiting.release()
            if arrived and self.slots.acquire(blocking=False):
                try:
                    self.finish_request(request, client_address)
                finally:
                    self.slots.release()
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)


def request_line_arrived(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` sent a whole request line (or closed) within ``timeout_s``. Over
    TLS (whose records cannot be peeked at): whether it finished its handshake and sent
    its first record."""
    deadline = time.monotonic() + timeout_s
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(timeout_s)
        sock.do_handshake()
        return bool(sock.pending()) or _readable(sock, deadline)
    while time.monotonic() < deadline and _readable(sock, deadline):
        data = sock.recv(_MAX_REQUEST_LINE, socket.MSG_PEEK)
        if not data or b"\n" in data or len(data) >= _MAX_REQUEST_LINE:
            return True
        time.sleep(0.05)  # (a part of the line: readable at once again)
    return False


def _readable(sock: socket.socket, deadline: float) -> bool:
    return bool(select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0])


class MetricsServer:
    """The running HTTP server (a daemon thread); ``shutdown()`` stops it."""

    def __init__(self, httpd: WSGIServer, metrics: FleetMetrics, *, scheme: str = "http") -> None:
        self.httpd = httpd
        self.metrics = metrics
        address = httpd.server_address
        self.host = address[0] if isinstance(address[0], str) else address[0].decode()
        self.port = int(address[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{scheme}://{host}:{self.port}/metrics"
        self._closed = False
        self.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="slurmgpu-metrics", daemon=True)
        self.thread.start()

    def sample(self) -> None:
        self.metrics.sample()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def tls_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """The server's TLS context (ValueError: only one of cert/key; ssl.SSLError, an
    OSError: a file that cannot be read or does not match)."""
    if bool(cert) != bool(key):
        raise ValueError("collector.metrics_tls_cert and metrics_tls_key go together: set both or neither")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def start_metrics_server(collector: MetricsSource, bind: str, *, tls_cert: str = "", tls_key: str = "",
                         client_ca: str = "") -> MetricsServer:
    """Serve the collector's metrics at ``http(s)://<bind>/metrics`` from a daemon thread.

    ValueError: ``bind`` is not "host:port" (or half a TLS setting); OSError: it cannot be
    bound, or the TLS files cannot be used."""
    if client_ca and not tls_cert:
        raise ValueError("collector.metrics_client_ca needs metrics_tls_cert and metrics_tls_key")
    context = tls_context(tls_cert, tls_key, client_ca) if tls_cert or tls_key else None
    host, port = parse_bind(bind)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, addr = infos[0][0], infos[0][4][0]

    class _Server(_BoundedServer):
        address_family = family

    registry = CollectorRegistry(auto_describe=False)
    metrics = FleetMetrics(collector)
    registry.register(metrics)
    httpd = make_server(str(addr), port, CachedExposition(registry), server_class=_Server,
                        handler_class=_Handler)
    if context is not None:
        # The handshake happens on the first read, in the request's worker thread and under
        # its timeout: a client that never finishes it cannot hold the accept loop.
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True,
                                           do_handshake_on_connect=False)
    return MetricsServer(httpd, metrics, scheme="https" if context is not None else "http")
