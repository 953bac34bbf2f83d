"""The collector's Prometheus /metrics: a real collector, a real HTTP scrape, exact values."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
import zmq
from prometheus_client.parser import text_string_to_metric_families

from slurmgpu.collector import metrics as metrics_module
from slurmgpu.collector.app import CollectorError, build_collector
from slurmgpu.collector.metrics import IngestRate, parse_bind
from slurmgpu.collector.policy import Automation, Decision
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.automation import Breaker, DrainedNode, HeldDrain, Lemon
from slurmgpu.collector.store.backend import is_postgres
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.decision import Action
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.wire import EVENT, HELLO, REPORT, Envelope
from tests.agenthelpers import wait_until
from tests.test_collector import (  # noqa: F401
    Agent,
    ctx,
    free_port,
    keys_dir,
    make_settings,
    running,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def named(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def finding(check: str, severity: str, gpu: int | None = None) -> dict[str, Any]:
    return {"check": check, "severity": severity, "gpu": gpu, "subject": None, "message": "m"}


def report(node: str, seq: int, verdict: str, findings: list[dict[str, Any]], ts: float) -> Envelope:
    return Envelope(type=REPORT, node=node, seq=seq, ts=ts,
                    body={"verdict": verdict, "findings": findings, "facts": {}})


def xid_event(node: str, seq: int, xid: int | None, ts: float, kind: str = "xid") -> Envelope:
    return Envelope(type=EVENT, node=node, seq=seq, ts=ts,
                    body={"kind": kind, "gpu": 1, "data": xid, "verdict": "FAIL",
                          "findings": [finding("xid.recent", "FAIL", 1)]})


def seed(store: Store, now: float) -> None:
    store.store_batch([
        ("gpu-a", report("gpu-a", 1, "FAIL", [
            finding("gpu.ecc", "OK", 0),
            finding("ecc.uncorrected", "FAIL", 0), finding("thermal.throttle", "WARN", 0),
            finding("thermal.throttle", "WARN", 3), finding("thermal.clock_brake", "UNKNOWN", 5),
            finding("ib.made_up_by_a_node", "WARN")], now - 5)),
        ("gpu-b", report("gpu-b", 1, "OK", [], now - 30)),
        ("gpu-a", xid_event("gpu-a", 2, 79, now - 4)),
        ("gpu-a", xid_event("gpu-a", 3, 79, now - 3)),
        ("gpu-a", xid_event("gpu-a", 4, 48, now - 2)),
        ("gpu-a", xid_event("gpu-a", 5, None, now - 2)),
        ("gpu-a", xid_event("gpu-a", 6, None, now - 1, kind="ecc_dbe")),
    ], received_at=now)
    # gpu-b went WARN then OK again: its WARN finding is history, not current.
    store.store_batch([("gpu-b", report("gpu-b", 2, "WARN", [finding("thermal.throttle", "WARN", 2)],
                                        now - 20))], received_at=now)
    store.store_batch([("gpu-b", report("gpu-b", 3, "OK", [], now - 10))], received_at=now)
    # gpu-c said hello 500 s ago and nothing since: no report (UNKNOWN), unreachable.
    store.store_batch([("gpu-c", Envelope(type=HELLO, node="gpu-c", seq=1, ts=now - 500,
                                          body={"version": "1", "gpus": 8, "interval_s": 15.0}))],
                      received_at=now - 500)
    assert store.mark_unreachable(now, 100) == ["gpu-c"]
    store.add_decisions([
        Decision("gpu-a", "drain", "r", trigger="ecc.uncorrected", result="drained", time=now),
        Decision("gpu-b", "drain", "r", trigger="ecc.uncorrected", result="drained", time=now),
        Decision("gpu-a", "drain", "r", held=True, trigger="thermal.throttle", result="held",
                 time=now),
        Decision("gpu-b", "resume", "r", trigger="healthy", result="resumed", time=now),
        Decision("gpu-c", "drain", "r", trigger="ecc.uncorrected", result="error: slurm said no",
                 time=now),
    ])


def add_checkpoints(db_path: str, states: list[str]) -> None:
    with contextlib.closing(Store(db_path)) as store, store.transaction() as db:
        db.executemany(
            'INSERT INTO checkpoints (job_id, action, reason, trigger_node, nodes, "user", requested, '
            "deadline, state) VALUES (?, 'drain', 'r', 'gpu-a', '[\"gpu-a\"]', 'u', 1.0, 2.0, ?)",
            [(str(i), state) for i, state in enumerate(states)])


@pytest.fixture
def uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scrape computes (the 1 s scrape cache is tested on its own)."""
    monkeypatch.setattr(metrics_module, "CACHE_S", 0.0)


def test_scrape_reports_store_automation_and_checkpoints(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                                         uncached: None, store_url: str) -> None:
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}", db=store_url)
    client = FakeSlurmClient(["gpu-a", "gpu-b"])
    store = Store(cfg.db)
    before = Automation(AutomationSettings(), client, tmp_path / "state", store=store)
    before.state.breaker = Breaker(True, 1.0, "storm")
    before.state.held = {n: HeldDrain(Action.DRAIN, "", "", 1.0, 1.0) for n in ("gpu-b", "gpu-c")}
    before.state.lemons = {"gpu-c": Lemon(1.0, "lemon")}
    before.state.drained = {"gpu-a": DrainedNode(1.0)}
    before._record.save()  # the state the collector's automation starts from
    store.close()
    collector = build_collector(cfg, automation=AutomationSettings(), slurm=client, state_dir=tmp_path / "state")
    auto = collector.automation
    assert auto is not None
    try:
        assert collector.metrics_server is not None
        url = collector.metrics_server.url
        now = time.time()
        seed(collector.store, now)
        add_checkpoints(cfg.db, ["open", "open", "acked", "expired", "done", "done", "done"])
        m = scrape(url)

        assert named(m, "slurmgpu_node_verdict") == {
            frozenset({("node", "gpu-a")}): 2, frozenset({("node", "gpu-b")}): 0,
            frozenset({("node", "gpu-c")}): 3}
        assert value(m, "slurmgpu_node_reachable", node="gpu-a") == 1
        assert value(m, "slurmgpu_node_reachable", node="gpu-c") == 0
        assert 0 <= value(m, "slurmgpu_node_last_seen_seconds", node="gpu-a") < 60
        assert 500 <= value(m, "slurmgpu_node_last_seen_seconds", node="gpu-c") < 560
        assert value(m, "slurmgpu_fleet_nodes") == 3
        assert value(m, "slurmgpu_fleet_nodes_by_verdict", verdict="FAIL") == 1
        assert value(m, "slurmgpu_fleet_nodes_by_verdict", verdict="UNKNOWN") == 1
        assert value(m, "slurmgpu_fleet_nodes_by_verdict", verdict="WARN") == 0
        assert named(m, "slurmgpu_node_drained") == {
            frozenset({("node", "gpu-a")}): 1, frozenset({("node", "gpu-b")}): 0,
            frozenset({("node", "gpu-c")}): 0}

        # Only gpu-a's current findings (gpu-b's WARN was cleared by its OK report; the
        # xid event's findings are events, not the node's report).
        assert named(m, "slurmgpu_findings") == {
            frozenset({("check", "ecc.uncorrected"), ("severity", "FAIL")}): 1,
            frozenset({("check", "thermal.throttle"), ("severity", "WARN")}): 2,
            frozenset({("check", "thermal.clock_brake"), ("severity", "UNKNOWN")}): 1,
            frozenset({("check", "other"), ("severity", "WARN")}): 1}  # an unknown check id
        assert named(m, "slurmgpu_gpu_verdict") == {
            frozenset({("node", "gpu-a"), ("gpu", "0")}): 2,  # FAIL beats WARN
            frozenset({("node", "gpu-a"), ("gpu", "3")}): 1,
            frozenset({("node", "gpu-a"), ("gpu", "5")}): 3}

        assert named(m, "slurmgpu_xid_events_total") == {
            frozenset({("xid", "79")}): 2, frozenset({("xid", "48")}): 1,
            frozenset({("xid", "unknown")}): 1}
        assert value(m, "slurmgpu_events_total", kind="xid") == 4
        assert value(m, "slurmgpu_events_total", kind="ecc_dbe") == 1

        assert named(m, "slurmgpu_actions_total") == {
            frozenset({("action", "drain"), ("result", "drained")}): 2,
            frozenset({("action", "drain"), ("result", "held")}): 1,
            frozenset({("action", "drain"), ("result", "error")}): 1,
            frozenset({("action", "resume"), ("result", "resumed")}): 1}
        assert named(m, "slurmgpu_actions_by_trigger_total") == {
            frozenset({("action", "drain"), ("trigger", "ecc.uncorrected")}): 3,
            frozenset({("action", "drain"), ("trigger", "thermal.throttle")}): 1,
            frozenset({("action", "resume"), ("trigger", "healthy")}): 1}

        assert value(m, "slurmgpu_breaker_open") == 1
        assert value(m, "slurmgpu_breaker_held_nodes") == 2
        assert value(m, "slurmgpu_lemon_nodes") == 1
        assert value(m, "slurmgpu_automation_drained_nodes") == 1
        assert value(m, "slurmgpu_automation_dry_run") == 0

        assert value(m, "slurmgpu_checkpoints_pending") == 2
        assert named(m, "slurmgpu_checkpoints") == {
            frozenset({("state", "open")}): 2, frozenset({("state", "acked")}): 1,
            frozenset({("state", "expired")}): 1, frozenset({("state", "done")}): 3}
        assert value(m, "slurmgpu_pending_drains") == 0
        assert value(m, "slurmgpu_store_up") == 1
        assert value(m, "slurmgpu_collector_up") == 1
        assert value(m, "slurmgpu_allowed_nodes") == 2

        # The breaker closes: the next scrape says so (computed at scrape time).
        auto.release()
        assert value(scrape(url), "slurmgpu_breaker_open") == 0

        # A database without the checkpoints tables (older schema): 0, not an error.
        # (SQLite only: a PostgreSQL database starts at the current schema.)
        if not is_postgres(cfg.db):
            with contextlib.closing(sqlite3.connect(cfg.db)) as db:
                db.execute("DROP TABLE checkpoints")
                db.execute("DROP TABLE pending_drains")
            m = scrape(url)
            assert value(m, "slurmgpu_checkpoints_pending") == 0
            assert set(named(m, "slurmgpu_checkpoints").values()) == {0}
            assert value(m, "slurmgpu_pending_drains") == 0
            assert value(m, "slurmgpu_store_up") == 1
            assert value(m, "slurmgpu_node_verdict", node="gpu-a") == 2
    finally:
        collector.close()
    with pytest.raises(urllib.error.URLError):
        scrape(url)  # close() stopped the HTTP server


def test_scrape_over_real_agent_messages(tmp_path: Path, keys_dir: Path,  # noqa: F811
                                         ctx: zmq.Context[Any], store_url: str) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}", db=store_url)
    with running(cfg) as collector:
        assert collector.metrics_server is not None
        url = collector.metrics_server.url
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(HELLO, 1, {"version": "1.2.3", "gpus": 8, "interval_s": 15.0})
        assert agent.acked() == [1]
        agent.report(2, "FAIL")
        assert agent.acked() == [2]
        agent.send(EVENT, 3, {"kind": "xid", "gpu": 2, "data": 79, "verdict": "FAIL", "findings": []})
        assert agent.acked() == [3]
        agent.report(2, "FAIL")  # a resend
        assert agent.acked() == [2]
        agent.sock.send(b"\x93not an envelope")
        # Nothing acks a rejected frame: wait until the collector has handled it.
        wait_until(lambda: collector.counters.rejected["malformed"] == 1, 10.0, "the malformed frame handled")
        time.sleep(1.2)  # wall time: the rate needs two samples a second apart
        m = scrape(url)
    assert value(m, "slurmgpu_messages_received_total") == 5
    assert value(m, "slurmgpu_messages_stored_total") == 3
    assert value(m, "slurmgpu_messages_duplicates_total") == 1
    assert value(m, "slurmgpu_messages_rejected_total", reason="malformed") == 1
    assert value(m, "slurmgpu_messages_rejected_total", reason="unknown_key") == 0
    assert 0 < value(m, "slurmgpu_ingest_reports_per_second") <= 3
    assert value(m, "slurmgpu_node_verdict", node="gpu-a") == 2
    assert value(m, "slurmgpu_gpu_verdict", node="gpu-a", gpu="3") == 2
    assert value(m, "slurmgpu_xid_events_total", xid="79") == 1
    assert value(m, "slurmgpu_fleet_nodes") == 1
    # No automation configured: no automation metrics.
    assert not named(m, "slurmgpu_breaker_open") and not named(m, "slurmgpu_node_drained")


@pytest.mark.parametrize("bind", ["9750", "localhost", "127.0.0.1:", "127.0.0.1:http",
                                  "127.0.0.1:70000", ":9750", "::1:9750"])
def test_bad_metrics_bind_is_a_clear_error(tmp_path: Path, keys_dir: Path, bind: str) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=bind)
    with pytest.raises(CollectorError, match=r"collector\.metrics_bind = .*host:port"):
        build_collector(cfg)
    build_collector(make_settings(tmp_path, keys_dir, port=int(cfg.bind.rsplit(":", 1)[1]))).close()


def test_metrics_port_in_use_is_a_clear_error(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{port}")
        with pytest.raises(CollectorError) as err:
            build_collector(cfg)
    message = str(err.value)
    assert "collector.metrics_bind" in message and "\n" not in message
    # The collector's own socket was released: the same settings work once the port is free.
    build_collector(make_settings(tmp_path, keys_dir, port=int(cfg.bind.rsplit(":", 1)[1]))).close()


def test_in_memory_store_reports_store_down(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    cfg = make_settings(tmp_path, keys_dir, metrics_bind="127.0.0.1:0")
    store = Store(":memory:")
    collector = build_collector(cfg, store=store)
    try:
        assert collector.metrics_server is not None and collector.metrics_server.port != 0
        m = scrape(collector.metrics_server.url)
        assert value(m, "slurmgpu_store_up") == 0 and value(m, "slurmgpu_collector_up") == 1
        assert not named(m, "slurmgpu_fleet_nodes")
    finally:
        collector.close()
        store.close()


def test_no_metrics_bind_no_server(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    collector = build_collector(make_settings(tmp_path, keys_dir))
    try:
        assert collector.metrics_server is None
    finally:
        collector.close()


def test_parse_bind() -> None:
    assert parse_bind("0.0.0.0:9750") == ("0.0.0.0", 9750)
    assert parse_bind("[::]:9750") == ("::", 9750)
    assert parse_bind("head.example:0") == ("head.example", 0)


def test_ingest_rate_window() -> None:
    rate = IngestRate(window_s=60, every_s=1)
    assert rate.rate(100, now=0.0) == 0.0  # no samples yet
    rate.sample(0, now=0.0)
    rate.sample(5, now=0.5)  # within a second of the last: ignored
    assert rate.rate(10, now=0.5) == 0.0  # under a second of history
    for t in range(1, 121):
        rate.sample(t * 10, now=float(t))
    # 10 messages a second; the oldest sample inside the last 60 s is t=60.
    assert rate.rate(1200, now=120.0) == pytest.approx(10.0)
    assert rate.rate(1200, now=1000.0) == 0.0  # all samples stale: the loop stalled


def test_scrapes_are_cached_bounded_and_time_out(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """Issue 12 item 11: 8 scrapers in a loop compute at most one scrape a second; an idle
    connection (slowloris) is closed after the request timeout, never held; more concurrent
    connections than workers are turned away instead of piling up threads."""
    import threading

    from prometheus_client import CollectorRegistry

    from slurmgpu.collector.metrics import CachedExposition

    calls = []

    class Counting:
        def collect(self) -> Any:
            from prometheus_client.core import GaugeMetricFamily

            calls.append(1)
            yield GaugeMetricFamily("x", "x", value=1)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Counting())
    app = CachedExposition(registry, cache_s=1.0)
    threads = [threading.Thread(target=lambda: [app.body() for _ in range(50)]) for _ in range(8)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    # At most one computed per second of it (one when, as usual, it takes under a second:
    # a loaded machine can stretch 400 scrapes past that).
    assert 1 <= len(calls) == app.computed <= 1 + int(took), took

    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}")
    with running(cfg) as collector:
        server = collector.metrics_server
        assert server is not None
        workers = metrics_module.MAX_WORKERS
        idle = [socket.create_connection((server.host, server.port)) for _ in range(workers + 4)]
        try:
            started = time.monotonic()
            while time.monotonic() - started < metrics_module.REQUEST_TIMEOUT_S + 10:
                try:  # served once the idle ones time out (the extra ones are turned away)
                    assert scrape(server.url)
                    break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    time.sleep(0.2)
            else:
                raise AssertionError("scrapes stayed blocked by idle connections")
            assert threading.active_count() < 40
        finally:
            for conn in idle:
                conn.close()


def test_idle_connections_hold_no_slot_a_scraper_needs(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """Issue 28 item 10: sockets that connect and send nothing, or half a request line,
    hold none of the MAX_WORKERS slots: with more of them open than slots, a scrape is
    served at once (it was turned away for up to REQUEST_TIMEOUT_S, 10 s); they are
    closed after REQUEST_LINE_TIMEOUT_S."""
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}")
    with running(cfg) as collector:
        server = collector.metrics_server
        assert server is not None
        idle = [socket.create_connection((server.host, server.port)) for _ in range(metrics_module.MAX_WORKERS + 4)]
        idle[0].sendall(b"GET /metr")  # trickling
        try:
            assert scrape(server.url)[("slurmgpu_collector_up", frozenset())] == 1.0
            for conn in idle:
                conn.settimeout(metrics_module.REQUEST_TIMEOUT_S)
                assert conn.recv(1) == b""  # closed by the server, never served
        finally:
            for conn in idle:
                conn.close()


def test_one_node_cannot_grow_metric_label_cardinality(tmp_path: Path) -> None:
    """Issue 12 item 9: check ids, event kinds and XID codes a node invents become "other";
    at most MAX_GPU_SERIES_PER_NODE per-GPU series per node."""
    from slurmgpu.collector.metrics import MAX_GPU_SERIES_PER_NODE, FleetMetrics, StoreReads

    store = Store(tmp_path / "m.db")
    findings = [{"check": f"made.up{i}", "severity": "WARN", "gpu": i % 1000, "message": "x"} for i in range(600)]
    store.store_batch([("evil", Envelope(type=REPORT, node="evil", seq=1,
                                         body={"verdict": "WARN", "findings": findings}))])
    store.store_batch([("evil", Envelope(type=EVENT, node="evil", seq=2 + i, body={
        "kind": kind, "gpu": 0, "data": data, "verdict": "WARN", "findings": []}))
        for i, (kind, data) in enumerate([(f"kind{i}", 1) for i in range(50)] + [("xid", 10**12), ("xid", 79)])])
    metrics = FleetMetrics(None)  # type: ignore[arg-type]
    families = {f.name: f for f in metrics._families(StoreReads.read(store.db), None)}
    checks = {s.labels["check"] for s in families["slurmgpu_findings"].samples}
    assert checks == {"other"}
    assert len(families["slurmgpu_gpu_verdict"].samples) == MAX_GPU_SERIES_PER_NODE
    assert metrics.series_dropped > 0
    kinds = {s.labels["kind"] for s in families["slurmgpu_events"].samples}
    assert kinds == {"other", "xid"}
    assert {s.labels["xid"] for s in families["slurmgpu_xid_events"].samples} == {"79", "other"}
    store.close()


def test_metrics_over_tls_and_client_certificates(tmp_path: Path, keys_dir: Path) -> None:  # noqa: F811
    """Issue 12 item 11: optional TLS (and mutual TLS with metrics_client_ca)."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")

    def cert(name: str) -> tuple[Path, Path]:
        crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True, timeout=60)
        return crt, key

    server_crt, server_key = cert("server")
    client_crt, client_key = cert("client")
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}",
                        metrics_tls_cert=str(server_crt), metrics_tls_key=str(server_key),
                        metrics_client_ca=str(client_crt))
    with running(cfg) as collector:
        server = collector.metrics_server
        assert server is not None and server.url.startswith("https://")
        trusting = ssl.create_default_context(cafile=str(server_crt))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):  # no client cert
            urllib.request.urlopen(server.url, timeout=10, context=trusting)
        trusting.load_cert_chain(str(client_crt), str(client_key))
        # (issue 28: connections that never start their handshake hold no slot)
        idle = [socket.create_connection((server.host, server.port)) for _ in range(metrics_module.MAX_WORKERS)]
        with urllib.request.urlopen(server.url, timeout=10, context=trusting) as resp:
            assert resp.status == 200 and b"slurmgpu_collector_up 1.0" in resp.read()
        for conn in idle:
            conn.close()
    half = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}",
                         metrics_tls_cert=str(server_crt))
    with pytest.raises(CollectorError, match="set both or neither"):
        build_collector(half)


def _fleet_metrics(store: Store, status: dict[str, Any] | None = None) -> Any:
    import types

    from slurmgpu.collector.counters import Counters
    from slurmgpu.collector.metrics import FleetMetrics

    automation = None if status is None else types.SimpleNamespace(status=lambda: status)
    return FleetMetrics(types.SimpleNamespace(counters=Counters(), allowed={}, store=store,  # type: ignore[arg-type]
                                              log=None, automation=automation))


def _family(fleet: Any, name: str, label: str) -> dict[str, float]:
    """One family of one scrape computed by ``fleet`` (a FleetMetrics): label -> value."""
    families = {f.name: f for f in fleet.collect()}
    return {s.labels[label]: s.value for s in families[name].samples}


def test_a_scrape_shows_what_was_committed_before_it(store_url: str) -> None:
    """Each scrape reads the store in one snapshot: a state change, a prune (the history
    gone: no current findings) show at the next scrape."""
    store = Store(store_url)
    now = time.time()

    def send(seq: int, severity: str) -> None:
        body = {"verdict": severity, "findings": [finding("ecc.uncorrected", severity, 1)] if severity != "OK"
                else [finding("ecc.volatile", "OK", 0)]}
        store.store_batch([("n1", Envelope(type=REPORT, node="n1", seq=seq, ts=now + seq, body=body))])

    fleet = _fleet_metrics(store)
    try:
        send(1, "OK")
        assert _family(fleet, "slurmgpu_node_verdict", "node") == {"n1": 0}
        send(2, "FAIL")
        assert _family(fleet, "slurmgpu_node_verdict", "node") == {"n1": 2}
        assert _family(fleet, "slurmgpu_findings", "check") == {"ecc.uncorrected": 1}
        send(3, "FAIL")  # the same state: no history row
        assert _family(fleet, "slurmgpu_findings", "check") == {"ecc.uncorrected": 1}
        assert store.prune(0.0, now=now + 10 + 86400) > 0
        assert _family(fleet, "slurmgpu_findings", "check") == {}
        assert _family(fleet, "slurmgpu_node_verdict", "node") == {"n1": 2}  # (the node row is kept)
    finally:
        store.close()


def test_odd_node_names_are_escaped_in_the_body(tmp_path: Path) -> None:
    """Node names holding ``"``, ``\\``, a newline or non-ASCII, drained nodes the store never
    heard of: the body parses back to the same names; the nodes come in the store's order."""
    from prometheus_client import CollectorRegistry, generate_latest

    store = Store(tmp_path / "m.db")
    now = time.time()
    seed(store, now)
    odd = ['we"ird', "back\\slash", "new\nline", "ünï", "x y"]
    store.store_batch([(n, Envelope(type=REPORT, node=n, seq=1, ts=now - 7.25, body={
        "verdict": "FAIL", "facts": {}, "findings": [finding("ecc.uncorrected", "FAIL", 2)]}))
        for n in odd], received_at=now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_fleet_metrics(store, {"drained": ["gpu-a", 'we"ird', "gone-node"], "held": []}))
    body = generate_latest(registry)
    assert b'slurmgpu_node_verdict{node="we\\"ird"} 2.0\n' in body
    assert b'slurmgpu_gpu_verdict{gpu="2",node="new\\nline"} 2.0\n' in body
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert [s.labels["node"] for s in families["slurmgpu_node_verdict"].samples] == \
        ["gpu-a", "gpu-b", "gpu-c", *sorted(odd)]  # (one batch: by name)
    assert {s.labels["node"]: s.value for s in families["slurmgpu_node_drained"].samples} == \
        {**dict.fromkeys(["gpu-a", 'we"ird', "gone-node"], 1.0),
         **dict.fromkeys(["gpu-b", "gpu-c", "back\\slash", "new\nline", "ünï", "x y"], 0.0)}
    store.close()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian: prometheus)")
def test_promtool_accepts_the_body(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from slurmgpu.collector.store.remediation import DrainOutcome, record_drain_outcome

    store = Store(tmp_path / "m.db")
    seed(store, time.time())
    with store.transaction() as db:
        record_drain_outcome(db, DrainOutcome("gpu-a", 1.0, "xid.recent", "H100", "transient"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_fleet_metrics(store, {"drained": ["gpu-a"], "held": [], "breaker_open": True}))
    body = generate_latest(registry)
    assert b'slurmgpu_drain_outcomes_total{check="xid.recent",gpu_model="H100",outcome="transient"} 1.0' in body
    out = subprocess.run(["promtool", "check", "metrics"], input=body,
                         capture_output=True, timeout=60, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    store.close()


def test_recorded_drain_outcomes_show_as_verdict_quality(store_url: str) -> None:
    """A drain's recorded outcome (the report's verdict_quality) shows on /metrics by check,
    GPU model and outcome; the other outcomes of that check at 0."""
    from slurmgpu.collector.store.remediation import DrainOutcome, record_drain_outcome

    store = Store(store_url)
    now = time.time()
    try:
        fleet = _fleet_metrics(store)
        assert _family(fleet, "slurmgpu_drains", "check") == {}
        with store.transaction() as db:
            record_drain_outcome(db, DrainOutcome("n1", now - 60, "xid.recent", "H100", "transient", now, "reset"))
            record_drain_outcome(db, DrainOutcome("n2", now - 30, "xid.recent", "H100", "confirmed"))
            record_drain_outcome(db, DrainOutcome("n3", now - 20, "ecc.uncorrected", None, "cleared_by_validation"))
        families = {f.name: f for f in fleet.collect()}
        assert {(s.labels["check"], s.labels["gpu_model"]): s.value for s in families["slurmgpu_drains"].samples} == \
            {("xid.recent", "H100"): 2, ("ecc.uncorrected", "unknown"): 1}
        outcomes = {(s.labels["check"], s.labels["outcome"]): s.value
                    for s in families["slurmgpu_drain_outcomes"].samples}
        assert outcomes[("xid.recent", "transient")] == 1 and outcomes[("xid.recent", "confirmed")] == 1
        assert outcomes[("xid.recent", "unknown")] == 0 and outcomes[("ecc.uncorrected", "cleared_by_validation")] == 1
    finally:
        store.close()


def test_open_ladders_show_by_stage_and_held_nodes_fire_an_alert(store_url: str) -> None:
    """Every open ladder stage is exported (0 where no node is in it): the shipped
    SlurmgpuNodesHeld rule has a series to watch before the first node is held."""
    from slurmgpu.collector.store.remediation import save_ladder

    store = Store(store_url)
    try:
        fleet = _fleet_metrics(store)
        assert _family(fleet, "slurmgpu_remediation_nodes", "stage") == \
            {"drained": 0, "awaiting_validation": 0, "reset": 0, "reboot": 0, "held": 0}
        with store.transaction() as db:
            for node, stage in [("n1", "held"), ("n2", "held"), ("n3", "awaiting_validation")]:
                save_ladder(db, node, {"node": node, "stage": stage}, time.time())
        stages = _family(fleet, "slurmgpu_remediation_nodes", "stage")
        assert (stages["held"], stages["awaiting_validation"], stages["reset"]) == (2, 1, 0)
    finally:
        store.close()
    rules = yaml.safe_load((Path(__file__).resolve().parent.parent / "monitoring" / "slurmgpu.rules.yml").read_text())
    held = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "SlurmgpuNodesHeld"]
    assert [r["expr"] for r in held] == ['slurmgpu_remediation_nodes{stage="held"} > 0']
