"""The agent: unit logic with fakes, and a real agent process against the fake NVML and
a test CURVE ROUTER (tests/agenthelpers.py)."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import msgpack
import pytest

from slurmgpu import wire
from slurmgpu.agent import Agent
from slurmgpu.agent.flap import FlapTracker
from slurmgpu.agent.notify import Notifier, notify, watchdog_interval
from slurmgpu.agent.spool import Spool
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources, evaluate
from slurmgpu.result import Severity
from slurmgpu.sources.infiniband import SysfsIbSource
from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource, make_facts
from tests.agenthelpers import (
    AgentProcess,
    FakeCollector,
    free_port,
    make_bundle,
    spool_rows,
    wait_until,
    write_config,
)

SYSFS = Path(__file__).parent / "data" / "sysfs"


def _encoder(mtype: str, body: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    def encode(seq: int) -> bytes:
        return wire.encode(wire.Envelope(type=mtype, node="n1", seq=seq, body=body or {}))
    return encode


HELLO = {"version": "0.1.0", "gpus": 8, "interval_s": 15.0}


def _report_body() -> dict[str, object]:
    return {"verdict": "OK", "findings": [], "facts": {"pad": "x" * 4000}}


def _event_body() -> dict[str, object]:
    return {"kind": "xid", "gpu": 1, "data": 79, "verdict": "FAIL", "findings": []}


# --------------------------------------------------------------------------- spool


def test_spool_seq_is_restart_proof_and_ordered(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    seqs = [spool.append("report", _encoder("report", _report_body())).seq for _ in range(3)]
    assert seqs == [1, 2, 3]
    assert spool.delete([3]) == 1 and spool.delete([3]) == 0  # duplicate ack: harmless
    spool.close()
    spool = Spool(tmp_path)  # the highest seq was deleted: still never reused
    item = spool.append("event", _encoder("event", _event_body()))
    assert item.stored and item.seq == 4
    assert [s for s, _ in spool.pending()] == [1, 2, 4]
    assert [s for s, _ in spool.pending(after=1, limit=1)] == [2]
    frame = dict(spool.pending())[4]
    assert wire.decode(frame).seq == 4 and frame == item.frame
    spool.close()


def test_spool_new_hello_replaces_unacked_hello(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("hello", _encoder("hello", HELLO))
    spool.append("report", _encoder("report", _report_body()))
    spool.append("hello", _encoder("hello", HELLO))
    assert [(s, wire.decode(f).type) for s, f in spool.pending()] == [(2, "report"), (3, "hello")]


def test_spool_compaction_keeps_events(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_mb=0.05)  # ~50 KiB
    for i in range(40):
        mtype = "event" if i % 4 == 0 else "report"
        spool.append(mtype, _encoder(mtype, _event_body() if mtype == "event" else _report_body()))
    assert spool.count("event") == 10
    assert spool.count("report") <= 10
    reports = [s for s, f in spool.pending(limit=1000) if wire.decode(f).type == "report"]
    assert reports[-1] == 40  # the newest report is kept
    seqs = [s for s, _ in spool.pending(limit=1000)]
    assert seqs == sorted(seqs)


def test_spool_disk_full_never_raises_and_warns(tmp_path: Path) -> None:
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    agent = Agent(settings, "n1", sources=_fake_sources(), clock=FakeClock())
    spool = agent.open_spool()
    assert spool._conn is not None
    spool._conn.execute("PRAGMA max_page_count=1")  # the next growth hits SQLITE_FULL
    sent: list[bytes] = []

    class _Link:
        def wake(self) -> None:
            pass

        def send_unspooled(self, frame: bytes) -> None:
            sent.append(frame)

    agent.link = _Link()
    big = {**_event_body(), "findings": [{"check": "x", "severity": "FAIL", "message": "y" * 20000}]}
    seq = agent.submit(wire.EVENT, big)
    assert seq == 1 and len(sent) == 1 and wire.decode(sent[0]).seq == 1  # still sent once
    _, verdict = agent.poll()
    spool_findings = [f for f in verdict.findings if f.check == "agent.spool"]
    assert [f.severity for f in spool_findings] == [Severity.WARN]
    assert "full" in spool_findings[0].message
    spool._conn.execute("PRAGMA max_page_count=1000000")
    assert agent.submit(wire.EVENT, big) == 2  # the failed seqs are never reused
    _, verdict = agent.poll()
    assert not [f for f in verdict.findings if f.check == "agent.spool"]


def test_spool_unwritable_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    spool = Spool(blocker / "spool")  # a path under a regular file
    item = spool.append("report", _encoder("report", _report_body()))
    assert not item.stored and item.seq == 1
    assert "cannot open spool" in (spool.take_error() or "")


# --------------------------------------------------------------------------- agent logic


def _fake_sources(clock: FakeClock | None = None) -> Sources:
    facts = make_facts("n1", gpus=4, ib_ports=2)
    return Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib), FakeVersionSource(facts.versions),
                   clock or FakeClock())


def test_latest_and_facts_for_cache(tmp_path: Path) -> None:
    clock = FakeClock()
    sources = _fake_sources(clock)
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    agent = Agent(settings, "n1", sources=sources, clock=clock)
    assert agent.latest() is None
    agent.poll()
    nvml = sources.nvml
    assert isinstance(nvml, FakeNvmlSource)
    assert nvml.calls == [None]
    latest = agent.latest()
    assert latest is not None and latest[1].severity is Severity.OK and latest[2] == 0
    facts = agent.facts_for(frozenset({1, 2}), max_age_s=30)
    assert [g.index for g in facts.gpus] == [1, 2] and nvml.calls == [None]  # from the cache
    clock.advance(31)
    nvml.facts.gpus[2].temperature_c = 77
    facts = agent.facts_for(frozenset({2}), max_age_s=30)
    assert nvml.calls == [None, frozenset({2})] and facts.gpus[0].temperature_c == 77
    assert facts.previous is not None and facts.previous.previous is None
    again = agent.facts_for(frozenset({2}), max_age_s=30)  # the cache now holds the fresh GPU 2
    assert nvml.calls == [None, frozenset({2})] and again.gpus[0].temperature_c == 77
    full = agent.latest()
    assert full is not None and full[0].gpu(2).temperature_c == 77  # type: ignore[union-attr]


def test_event_rejudges_the_gpu_and_is_spooled(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    agent = Agent(settings, "n1", sources=_fake_sources(clock), clock=clock)
    agent.open_spool()
    agent.poll()
    agent.on_nvml_event("xid", 3, 79)
    assert agent.spool is not None
    (seq, frame), = agent.spool.pending()
    env = wire.decode(frame)
    assert env.type == "event" and env.seq == seq
    assert (env.body["kind"], env.body["gpu"], env.body["data"], env.body["verdict"]) == ("xid", 3, 79, "FAIL")
    assert any(f["check"] == "xid.recent" and f["gpu"] == 3 for f in env.body["findings"])
    latest = agent.latest()
    assert latest is not None and latest[1].severity is Severity.FAIL  # the cache knows too
    _, verdict = agent.poll()  # and so do later reports
    assert verdict.severity is Severity.FAIL


def test_commands(tmp_path: Path) -> None:
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    agent = Agent(settings, "n1", sources=_fake_sources(), clock=FakeClock())
    agent.open_spool()
    ping = wire.Envelope(type="command", node="n1", seq=0, body={"command": "ping", "args": {}})
    bogus = wire.Envelope(type="command", node="n1", seq=0, body={"command": "reboot", "args": {}})
    refresh = wire.Envelope(type="command", node="n1", seq=0, body={"command": "refresh", "args": {}})
    for message in (ping, bogus, refresh):
        agent.handle_command(message)
    agent.poll_and_report()
    assert agent.spool is not None
    bodies = [wire.decode(f) for _, f in agent.spool.pending()]
    results = {b.body["command_id"]: b.body for b in bodies if b.type == "command-result"}
    assert results[ping.id]["ok"] is True
    assert results[bogus.id] == {"command_id": bogus.id, "ok": False,
                                 "result": {"error": "unknown command", "command": "reboot"}}
    assert results[refresh.id]["ok"] is True and results[refresh.id]["result"]["verdict"] == "OK"
    assert [b.type for b in bodies] == ["command-result", "command-result", "report", "command-result"]


# --------------------------------------------------------------------------- IB flapping


def _set_link_downed(root: Path, dev: str, value: int) -> None:
    (root / "class" / "infiniband" / dev / "ports" / "1" / "counters" / "link_downed").write_text(f"{value}\n")


def _flap_agent(tmp_path: Path, tree: str, settings: Settings | None = None) -> tuple[Agent, Path, FakeClock]:
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / tree, root)
    clock = FakeClock()
    facts = make_facts("n1", gpus=2, ib_ports=0)
    sources = Sources(FakeNvmlSource(facts.nvml), SysfsIbSource(root), FakeVersionSource(facts.versions),
                      clock)
    settings = settings or Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.ib.flap_window_s, settings.ib.flap_count, settings.ib.flap_strikes = 60, 2, 2
    return Agent(settings, "n1", sources=sources, clock=clock), root, clock


def _flap_findings(agent: Agent) -> list[tuple[str | None, Severity]]:
    _, verdict = agent.poll()
    return [(f.subject, f.severity) for f in verdict.findings
            if f.check == "ib.flap" and f.severity is not Severity.OK]


def test_ib_flap_strikes_on_sysfs_tree(tmp_path: Path) -> None:
    agent, root, clock = _flap_agent(tmp_path, "ib-healthy")

    def flap(value: int, step: float = 15) -> list[tuple[str | None, Severity]]:
        clock.advance(step)
        _set_link_downed(root, "mlx5_2", value)
        return _flap_findings(agent)

    assert flap(0) == []
    assert flap(1) == []  # one rise: not yet a strike
    assert flap(1, step=100) == []  # quiet for longer than the window
    assert flap(2) == []  # the earlier rise fell out of the window
    assert flap(3) == [("mlx5_2/1", Severity.WARN)]  # 2 rises within 60 s: strike 1
    assert flap(3) == [("mlx5_2/1", Severity.WARN)]  # a strike stays reported
    assert flap(4) == [("mlx5_2/1", Severity.WARN)]
    assert flap(6) == [("mlx5_2/1", Severity.FAIL)]  # strike 2 fails the port
    _set_link_downed(root, "mlx5_3", 0)
    assert flap(0) == [("mlx5_2/1", Severity.FAIL)]  # a reset counter is a new baseline
    latest = agent.latest()
    assert latest is not None
    port = next(h for h in latest[0].ib.hcas if h.name == "mlx5_2").ports[0]
    assert (port.flap_strikes, port.flap_rises) == (2, 0)  # the history the check judged


def _flapping(tmp_path: Path, dev: str, settings: Settings) -> list[list[tuple[str | None, Severity]]]:
    """Six polls of the HGX H100 tree with ``dev``'s link_downed rising at each one."""
    agent, root, clock = _flap_agent(tmp_path, "ib-hgx-h100", settings)
    seen = []
    for value in range(6):
        clock.advance(15)
        _set_link_downed(root, dev, value)
        seen.append(_flap_findings(agent))
    return seen


@pytest.mark.parametrize("devices", [["*"], ["mlx5_4/1"], ["mlx5_[01]", "mlx5_[4-9]"]])
def test_ib_flap_on_an_included_port_warns_then_fails(tmp_path: Path, devices: list[str]) -> None:
    settings = Settings()
    settings.ib.devices = devices
    warn, fail = [("mlx5_4/1", Severity.WARN)], [("mlx5_4/1", Severity.FAIL)]
    # Rises at polls 1-5: every two within the window make a strike; the second one fails.
    assert _flapping(tmp_path, "mlx5_4", settings) == [[], [], warn, warn, fail, fail]


@pytest.mark.parametrize(("dev", "configure"), [
    # A device [ib] devices leaves out.
    ("mlx5_4", lambda s: setattr(s.ib, "devices", ["mlx5_[01]", "mlx5_[5-9]"])),
    # The RoCE bond and a storage NIC: Ethernet link layer, include_ethernet off.
    ("mlx5_bond_0", lambda s: None),
    ("mlx5_2", lambda s: None),
    # Every IB check disabled.
    ("mlx5_0", lambda s: setattr(s.checks, "disabled", ["ib.*"])),
], ids=["excluded-device", "roce-bond", "ethernet-nic", "ib-disabled"])
def test_ib_flap_out_of_scope_never_judged(tmp_path: Path, dev: str, configure) -> None:  # type: ignore[no-untyped-def]
    settings = Settings()
    configure(settings)
    assert _flapping(tmp_path, dev, settings) == [[]] * 6


def test_ib_flap_ok_and_not_applicable(tmp_path: Path) -> None:
    agent, _, _ = _flap_agent(tmp_path, "ib-hgx-h100")
    _, verdict = agent.poll()
    (flap,) = [f for f in verdict.findings if f.check == "ib.flap"]
    assert (flap.severity, flap.not_applicable, flap.message) == (Severity.OK, False, "no link flapping")
    # Without the agent's history (a one-shot check) there is nothing to judge.
    (one_shot,) = [f for f in evaluate(make_facts(ib_ports=2), Settings()).findings if f.check == "ib.flap"]
    assert one_shot.not_applicable and "history" in one_shot.message


def test_flap_tracker_marks_only_ports_with_link_downed() -> None:
    facts = make_facts(ib_ports=2)
    del facts.ib.hcas[1].ports[0].counters["link_downed"]
    FlapTracker(Settings().ib).observe(facts.ib, 0.0)
    first, second = (h.ports[0] for h in facts.ib.hcas)
    assert (first.flap_rises, first.flap_strikes) == (0, 0)
    assert (second.flap_rises, second.flap_strikes) == (None, None)


# --------------------------------------------------------------------------- systemd


def test_sd_notify_abstract_socket_and_watchdog() -> None:
    name = f"slurmgpu-test-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(2)
        env = {"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"}
        notifier = Notifier(env)
        assert notifier.watchdog_s == 2.0
        assert notifier.ready() and server.recv(64) == b"READY=1"
        assert notifier.ping_if_due(100.0) and server.recv(64) == b"WATCHDOG=1"
        assert not notifier.ping_if_due(101.0)  # not due yet
        assert notifier.ping_if_due(102.0)
        assert notifier.stopping()
        assert server.recv(64) == b"WATCHDOG=1" and server.recv(64) == b"STOPPING=1"
    assert not notify("READY=1", {})
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None


# --------------------------------------------------------------------------- real process


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, Path]:
    return make_bundle(tmp_path)


def test_agent_process_reports_events_and_acks(tmp_path: Path, fake_nvml_lib: Path, scenario_file,  # type: ignore[no-untyped-def]
                                               bundle: tuple[Path, Path]) -> None:
    from tests.simfixtures import sim_env

    scenario = scenario_file("h100-sxm-8")
    keys, collector_secret = bundle
    port = free_port()
    spool = tmp_path / "spool"
    config = write_config(tmp_path / "agent.toml", port=port, spool=spool)
    collector = FakeCollector(port, collector_secret).start()
    agent = AgentProcess(config, keys, sim_env(fake_nvml_lib, scenario), tmp_path / "agent.log")
    try:
        hello = collector.wait_for(lambda e: e.type == "hello")
        assert hello.envelope.body["gpus"] == 8 and hello.envelope.node == "n1"
        report = collector.wait_for(lambda e: e.type == "report").envelope
        facts = msgpack.unpackb(report.body["facts"], raw=False)  # sent pre-packed
        assert report.body["verdict"] == "OK" and len(facts["nvml"]["gpus"]) == 8
        assert "previous" not in facts
        assert "ib.flap" in report.body["ok_checks"] and report.body["findings"] == []
        # acks delete spool rows
        wait_until(lambda: spool_rows(spool) == [] and len(collector.of_type("report")) >= 2,
                   what="acked spool rows to go")

        started = time.monotonic()
        scenario_file.update(scenario, lambda d: d.setdefault("events", []).append(
            {"gpu": 3, "type": 8, "data": 79, "id": 1}))
        event = collector.wait_for(lambda e: e.type == "event", timeout=30, after=started)
        body = event.envelope.body
        assert (body["kind"], body["gpu"], body["data"], body["verdict"]) == ("xid", 3, 79, "FAIL")
        assert event.at - started < 1.0, f"XID took {event.at - started:.3f} s"

        command_id = collector.send_command("n1", "ping")
        result = collector.wait_for(lambda e: e.type == "command-result"
                                    and e.body["command_id"] == command_id).envelope
        assert result.body["ok"] is True

        started = time.monotonic()
        scenario_file.update(scenario, lambda d: d["gpus"][5].update(lost=True))
        lost = collector.wait_for(lambda e: e.type == "event" and e.body["kind"] == "gpu_lost",
                                  timeout=30, after=started).envelope
        assert lost.body["gpu"] == 5 and lost.body["verdict"] == "FAIL"
        assert any(f["check"] == "gpu.lost" and f["severity"] == "FAIL" for f in lost.body["findings"])
        seqs = [r.envelope.seq for r in collector.messages if r.envelope.type in wire.ACKED]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        rc = agent.stop()
        collector.stop()
    assert rc == 0, agent.output()[-3000:]


def test_a_clean_exit_removes_the_local_socket(tmp_path: Path, fake_nvml_lib: Path, scenario_file) -> None:  # type: ignore[no-untyped-def]
    """Issue 29 item 9: an agent without keys yet (no link to stop) exited before its
    local socket's thread saw the stop, and left the socket file behind."""
    from tests.simfixtures import sim_env

    spool = tmp_path / "spool"
    config = write_config(tmp_path / "agent.toml", port=free_port(), spool=spool)
    (tmp_path / "no-keys").mkdir()
    agent = AgentProcess(config, tmp_path / "no-keys", sim_env(fake_nvml_lib, scenario_file("h100-sxm-8")),
                         tmp_path / "agent.log")
    try:
        wait_until(lambda: (spool / "agent.sock").is_socket() and "local_socket_listening" in agent.output(),
                   what="the local socket")
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()[-3000:]
    assert not (spool / "agent.sock").exists()


def test_spool_outlives_collector_outage_and_kill9(tmp_path: Path, fake_nvml_lib: Path,
                                                   scenario_file, bundle: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    from tests.simfixtures import sim_env

    scenario = scenario_file("h100-sxm-8")
    keys, collector_secret = bundle
    port = free_port()
    spool = tmp_path / "spool"
    config = write_config(tmp_path / "agent.toml", port=port, spool=spool)
    env = sim_env(fake_nvml_lib, scenario)
    # The collector takes messages but never acks: every row stays spooled.
    mute = FakeCollector(port, collector_secret, ack=False).start()
    agent = AgentProcess(config, keys, env, tmp_path / "agent.log")
    try:
        mute.wait_for(lambda e: e.type == "report")
        mute.stop()  # now the collector is down: the spool fills
        wait_until(lambda: len([t for _, t in spool_rows(spool) if t == "report"]) >= 4,
                   what="reports to pile up in the spool")
        agent.kill9()
        # (an unacked hello is superseded by the next connection's hello)
        before = [(s, t) for s, t in spool_rows(spool) if t != "hello"]
        agent = AgentProcess(config, keys, env, tmp_path / "agent.log")  # restarted, still no collector
        # (a row of its own, after the old backlog: the old run's unacked hello is still there,
        # so a row count alone can be met before the new agent spooled anything)
        last = before[-1][0]
        wait_until(lambda: [s for s, _ in spool_rows(spool) if s > last], what="the new agent to spool")
        collector = FakeCollector(port, collector_secret).start()
        try:
            wait_until(lambda: all(s in collector.stored for s, _ in before), what="the backlog to arrive",
                       timeout=20)  # a reconnect on a loaded 2-core CI machine can take seconds
            # (sent after the backlog: it may still be on its way when the backlog is in)
            wait_until(lambda: [s for s in list(collector.stored) if s > last],
                       what="the new agent's messages to arrive")
            wait_until(lambda: not [s for s, _ in spool_rows(spool) if s <= before[-1][0]],
                       what="acked rows to be deleted")
            # after the reconnect, the first pass over the spool came in seq order
            backlog = [r.envelope.seq for r in collector.messages if r.envelope.type in wire.ACKED]
            first_pass = backlog[:len(before)]
            assert first_pass == sorted(first_pass)
            assert {seq for seq, _ in before} <= set(backlog)
            # deduped by seq, each spooled message is stored exactly once, as it was spooled
            for seq, mtype in before:
                assert collector.stored[seq].type == mtype
            new_seqs = [s for s in backlog if s > before[-1][0]]
            assert new_seqs and min(new_seqs) > before[-1][0]  # the restart never reused a seq
        finally:
            collector.stop()
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()[-3000:]
