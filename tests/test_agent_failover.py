"""Agents with several collector addresses (issue 15 part 2): the link moves to the next
collector when the one it is on falls silent, the new handshake resends the spool, and
nothing is lost. Real ZeroMQ, real CURVE keys, real collectors (``build_collector``),
each on a SQLite file of its own (two collectors on one SQLite file is not a supported
set-up: they share a PostgreSQL database), so "stored" means "in A's file or B's".

Every wait polls for the effect itself (rows in a collector's database, the spool
empty); none sleeps and then looks.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import wire
from slurmgpu.agent.link import Link
from slurmgpu.agent.spool import Spool
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.config.load import load_config
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.errors import ConfigError
from tests.agenthelpers import AgentProcess, Links, free_port, node_keys, query_db, wait_until

NODE = "n1"
COLLECTOR_HEARTBEAT_S = 0.2
LINK_HEARTBEAT_S = 0.5  # silent after 1.5 s
BOUND_S = 20.0  # a failover on a loaded 2-core machine: 1.5 s of silence, then a handshake


class Serving:
    """One collector serving in a thread of its own; ``hang`` stops its loop and keeps its
    socket (a collector stuck in a database call), ``close`` stops it for good."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.collector: Collector | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.settings.addresses[0]

    def start(self) -> Serving:
        self.collector = build_collector(self.settings)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(self.collector,), daemon=True)
        self._thread.start()
        return self

    def _loop(self, collector: Collector) -> None:
        while not self._stop.is_set():
            collector.serve_once(50)

    def hang(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "the collector loop did not stop"

    def close(self) -> None:
        self.hang()
        if self.collector is not None:
            self.collector.close()
            self.collector = None

    def stored(self, epoch: str) -> set[int]:
        """The seqs of NODE's messages (this spool's epoch) in this collector's database."""
        if not Path(self.settings.db).exists():
            return set()
        rows = query_db(Path(self.settings.db), "SELECT seq FROM messages WHERE node = ? AND epoch = ?",
                        NODE, epoch)
        return {int(seq) for (seq,) in rows}


class Recorder:
    """Stands in for the link's logger: every call as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        # (not positional-only: like structlog's, a field named "event" is a TypeError)
        def record(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))
        return record

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for _, event, fields in list(self.lines) if event == name]


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    return node_keys(tmp_path / "keys", NODE)


@pytest.fixture
def pair(tmp_path: Path, keys_dir: Path) -> Iterator[tuple[Serving, Serving]]:
    """Collectors A and B: one keys_dir (one server key), two ports, two database files."""
    made = [Serving(_settings(tmp_path, keys_dir, name)) for name in ("a", "b")]
    try:
        yield made[0], made[1]
    finally:
        for serving in made:
            serving.close()


def _settings(tmp_path: Path, keys_dir: Path, name: str) -> CollectorSettings:
    port = free_port()
    return CollectorSettings(address=f"tcp://127.0.0.1:{port}", bind=f"tcp://127.0.0.1:{port}",
                             db=str(tmp_path / f"{name}.db"), keys_dir=str(keys_dir),
                             heartbeat_s=COLLECTOR_HEARTBEAT_S)


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    made = Spool(tmp_path / "spool")
    yield made
    made.close()


@pytest.fixture
def make_link(keys_dir: Path, spool: Spool) -> Iterator[Any]:
    links = Links(keys_dir, spool, NODE, LINK_HEARTBEAT_S, log=Recorder)
    yield links.make
    links.stop()


def report(spool: Spool, link: Link | None = None) -> int:
    """Spool one report, as the agent does (``Agent.submit``); its seq."""
    body = {"verdict": "OK", "findings": [], "facts": {}}

    def encode(seq: int) -> bytes:
        return wire.message_frame(wire.REPORT, NODE, seq, body, epoch=spool.epoch)

    item = spool.append(wire.REPORT, encode)
    assert item.stored
    if link is not None:
        link.wake()
    return item.seq


def wait_stored(serving: Serving, spool: Spool, seqs: set[int], what: str) -> None:
    wait_until(lambda: seqs <= serving.stored(spool.epoch), timeout=BOUND_S, what=what)


# --------------------------------------------------------------------------- the config


def _load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "slurmgpu.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(str(path), environ={})


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'slurmgpu.toml'}:") and "\n" not in message
    return message


def test_address_one_string_as_before(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[collector]\naddress = "tcp://head:7150"\n')
    assert cfg.settings_for("gpu-001").collector.address == "tcp://head:7150"
    assert cfg.settings_for("gpu-001").collector.addresses == ["tcp://head:7150"]
    assert CollectorSettings().addresses == ["tcp://localhost:7150"]


def test_address_a_list(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[collector]\naddress = ["tcp://head1:7150", "tcp://[fd00::2]:7150"]\n'
                          '[[hosts]]\nnodes = "gpu-[065-128]"\n'
                          '[hosts.collector]\naddress = ["tcp://[fd00::2]:7150", "tcp://head1:7150"]\n')
    assert cfg.settings_for("gpu-001").collector.addresses == ["tcp://head1:7150", "tcp://[fd00::2]:7150"]
    assert cfg.settings_for("gpu-070").collector.addresses == ["tcp://[fd00::2]:7150",
                                                              "tcp://head1:7150"]


@pytest.mark.parametrize(("value", "expected"), [
    ("[]", ": collector.address: no collector address"),
    ('["tcp://head1:7150", "head2:7150"]', ': collector.address[1]: not a collector endpoint: "head2:7150"'),
    ('"tcp://head:71500"', ': collector.address: port out of range in "tcp://head:71500"'),
    ('["tcp://head:7150", 7150]', ": collector.address[1]: expected a string, got an integer"),
    ('["tcp://a:1", "tcp://a:1"]', ': collector.address[1]: "tcp://a:1" is listed twice'),
    ("7150", ": collector.address: expected a string or an array of strings, got an integer"),
])
def test_a_bad_address_names_the_file_and_key(tmp_path: Path, value: str, expected: str) -> None:
    assert expected in _error(tmp_path, f"[collector]\naddress = {value}\n")


# --------------------------------------------------------------------------- the link


def test_a_stopped_collector_is_left_for_the_next_and_nothing_is_lost(
        pair: tuple[Serving, Serving], spool: Spool, make_link: Any) -> None:
    a, b = pair
    a.start()
    b.start()
    link = make_link(a.address, b.address)
    first = {report(spool, link) for _ in range(20)}
    wait_stored(a, spool, first, "A to store the first reports")
    wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="A's acks to empty the spool")

    a.close()
    later = {report(spool, link) for _ in range(20)}  # spooled while A is gone
    wait_stored(b, spool, later, "B to store what was spooled after A stopped")
    wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="B's acks to empty the spool")

    assert first | later <= a.stored(spool.epoch) | b.stored(spool.epoch)
    assert link.address == b.address
    failovers = link.log.events("collector_failover")
    assert failovers[0]["from"] == a.address and failovers[0]["to"] == b.address


def test_a_hung_collector_is_left_and_its_unacked_messages_go_to_the_next(
        pair: tuple[Serving, Serving], spool: Spool, make_link: Any) -> None:
    """A takes the connection (its socket lives, the handshake completes) but its loop is
    stuck: nothing is stored or acked and no heartbeat comes. The link leaves it after
    SILENT_HEARTBEATS heartbeats, and B gets the whole unacked spool."""
    a, b = pair
    a.start()
    b.start()
    link = make_link(a.address, b.address)
    seen = {report(spool, link)}
    wait_stored(a, spool, seen, "A to store a first report")
    wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="A's ack")

    a.hang()
    stuck = {report(spool, link) for _ in range(30)}
    wait_stored(b, spool, stuck, "B to store the reports A never acked")
    wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="B's acks to empty the spool")
    assert not stuck & a.stored(spool.epoch)  # A stored none of them: B's resend was the one
    assert link.address == b.address


def test_a_collector_that_refuses_the_key_is_left_for_the_next(
        tmp_path: Path, keys_dir: Path, pair: tuple[Serving, Serving], spool: Spool,
        make_link: Any) -> None:
    """The first collector has the same keypair but an allow-list without this node (not
    synced after `keys add-node`): every handshake fails, and the link moves on to B
    (a failed handshake once killed the link thread: a log call with a field named
    "event", structlog's own argument)."""
    _, b = pair
    unsynced = tmp_path / "unsynced-keys"
    (unsynced / "nodes").mkdir(parents=True, mode=0o700)
    for name in ("collector.key", "collector.key_secret"):
        shutil.copy2(keys_dir / name, unsynced / name)
    refusing = Serving(_settings(tmp_path, unsynced, "refusing")).start()
    b.start()
    try:
        link = make_link(refusing.address, b.address)
        wait_stored(b, spool, {report(spool, link) for _ in range(5)}, "B to store the reports")
        assert link.is_alive()
        assert link.log.events("collector_handshake_failed")
        assert link.log.events("collector_failover")[0]["from"] == refusing.address
    finally:
        refusing.close()


def test_the_first_address_down_at_start_and_round_robin_back(
        pair: tuple[Serving, Serving], spool: Spool, make_link: Any) -> None:
    """No collector at the first address: the link moves on to B. B stops and A comes up:
    the link wraps around to A (no handshake at B within the window)."""
    a, b = pair
    b.start()
    link = make_link(a.address, b.address)
    on_b = {report(spool, link) for _ in range(5)}
    wait_stored(b, spool, on_b, "B to store the reports (A was never up)")

    b.close()
    a.start()
    on_a = {report(spool, link) for _ in range(5)}
    wait_stored(a, spool, on_a, "A to store the reports after B stopped")
    wait_until(lambda: spool.count() == 0, timeout=BOUND_S, what="A's acks to empty the spool")
    assert on_b | on_a <= a.stored(spool.epoch) | b.stored(spool.epoch)
    moves = [(f["from"], f["to"]) for f in link.log.events("collector_failover")]
    assert moves[0] == (a.address, b.address) and (b.address, a.address) in moves


def test_the_link_stays_on_the_collector_that_works(
        pair: tuple[Serving, Serving], spool: Spool, make_link: Any) -> None:
    """After a failover to B, A coming back does not pull the agent back: every later
    report goes to B (reports go only to the collector the link is on, so B storing
    them all is the proof)."""
    a, b = pair
    a.start()
    b.start()
    link = make_link(a.address, b.address)
    wait_stored(a, spool, {report(spool, link)}, "A to store a first report")
    a.close()
    wait_stored(b, spool, {report(spool, link)}, "B to take over")
    a.start()  # the primary is back (same port)
    stored_on_a = a.stored(spool.epoch)
    later = {report(spool, link) for _ in range(10)}
    wait_stored(b, spool, later, "B to store the reports sent after A came back")
    assert not later & a.stored(spool.epoch)
    assert a.stored(spool.epoch) == stored_on_a
    assert link.address == b.address


def test_one_address_reconnects_to_it_without_failover(
        pair: tuple[Serving, Serving], spool: Spool, make_link: Any) -> None:
    a, _ = pair
    a.start()
    link = make_link(a.address)
    wait_stored(a, spool, {report(spool, link)}, "A to store a report")
    a.hang()
    wait_until(lambda: link.log.events("collector_silent_reconnecting"), timeout=BOUND_S,
               what="the silent reconnect")
    a.close()
    a.start()
    wait_stored(a, spool, {report(spool, link)}, "A, restarted, to store a report")
    assert link.address == a.address
    assert not link.log.events("collector_failover")


def test_a_link_needs_an_address(spool: Spool) -> None:
    with pytest.raises(ValueError, match="at least one collector address"):
        Link(addresses=[], node=NODE, keys=(b"", b"", b""), spool=spool, heartbeat_s=1.0,
             on_command=lambda _m: None)


# --------------------------------------------------------------------------- the agent


def test_agent_process_with_a_list_fails_over(tmp_path: Path, keys_dir: Path, fake_nvml_lib: Path,
                                              scenario_file: Any, pair: tuple[Serving, Serving]) -> None:
    """The real agent, configured with [A, B] in slurmgpu.toml: A down from the start, so
    its hello and reports reach B, with one collector_failover line in its log."""
    from tests.simfixtures import sim_env

    a, b = pair
    b.start()
    spool_dir = tmp_path / "agent-spool"
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[agent]
interval_s = 1.0
heartbeat_s = {LINK_HEARTBEAT_S}
spool_dir = "{spool_dir}"
socket = "{spool_dir}/agent.sock"

[collector]
address = ["{a.address}", "{b.address}"]
""", encoding="utf-8")
    env = sim_env(fake_nvml_lib, scenario_file("h100-sxm-8"))
    agent = AgentProcess(config, keys_dir / "bundles" / NODE, env, tmp_path / "agent.log", node=NODE)
    try:
        def types_on_b() -> set[str]:
            if not Path(b.settings.db).exists():
                return set()
            rows = query_db(Path(b.settings.db), "SELECT type FROM messages WHERE node = ?", NODE)
            return {str(t) for (t,) in rows}

        wait_until(lambda: {"hello", "report"} <= types_on_b(), timeout=BOUND_S,
                   what="the agent's hello and a report at B")
    finally:
        rc = agent.stop()
    log = agent.output()
    assert rc == 0, log[-3000:]
    assert "collector_failover" in log and a.address in log and b.address in log
