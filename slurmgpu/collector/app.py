"""The collector's one composition root: ``build_collector`` makes the store, the
automation and its checkpoint coordination, the transport, the fleet logic, the Slurm
poller and ``/metrics``, and wires them through their constructors; ``Collector`` is the
loop over the parts. Diagram: docs/design-notes.md (``slurmgpu/collector/app.py``).
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import signal
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from slurmgpu.collector.checkpoint import Checkpoints, SendCommand
from slurmgpu.collector.coordination import Coordination, FencedSlurm
from slurmgpu.collector.counters import Counters
from slurmgpu.collector.fleet import Fleet, SlurmPoller
from slurmgpu.collector.policy import Automation, Clock
from slurmgpu.collector.remediate import NODE_POLL_S, POLL_S, Remediation
from slurmgpu.collector.store import Leadership, Store
from slurmgpu.collector.store.backend import is_postgres
from slurmgpu.collector.transport import (
    MAX_BATCH,
    MAX_BATCH_POSTGRES,
    CollectorError,
    Transport,
)
from slurmgpu.config.schema import AutomationSettings, CollectorSettings, RemediationSettings
from slurmgpu.log import get_logger
from slurmgpu.slurm import SlurmClient

if TYPE_CHECKING:
    from slurmgpu.collector.metrics import MetricsServer

__all__ = ["Collector", "CollectorError", "build_collector"]


class Collector:
    """The running collector: each loop turn the transport receives a batch and hands it
    to the fleet logic, then both do their periodic work. Every method must be called
    from the thread that runs the loop (``run`` or ``serve_once``)."""

    def __init__(self, transport: Transport, fleet: Fleet, *,
                 metrics: MetricsServer | None = None) -> None:
        self.transport = transport
        self.fleet = fleet
        self.metrics_server = metrics
        self.log = get_logger(component="collector")
        self._closed = False

    # ------------------------------------------------------------------ the parts

    @property
    def endpoint(self) -> str:
        return self.transport.endpoint

    @property
    def counters(self) -> Counters:
        return self.transport.counters

    @property
    def allowed(self) -> Mapping[bytes, str]:
        return self.transport.allowed

    @property
    def store(self) -> Store:
        return self.fleet.store

    @property
    def automation(self) -> Automation | None:
        return self.fleet.automation

    @property
    def checkpoints(self) -> Checkpoints | None:
        return self.fleet.checkpoints

    def send_command(self, node: str, command: str, args: dict[str, Any] | None = None) -> str:
        return self.transport.send_command(node, command, args)

    # ------------------------------------------------------------------ lifecycle

    def run(self, stop_event: threading.Event) -> None:
        """Serve until ``stop_event`` is set. Installs a SIGHUP handler (allow-list
        reload) when called from the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        try:
            while not stop_event.is_set():
                self.serve_once(200)
        finally:
            self.close()

    def serve_once(self, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for frames, handle up to a batch of them, run the
        periodic tasks. Returns frames handled."""
        handled = self.transport.receive(self.fleet, timeout_ms)
        if self.metrics_server is not None:
            self.metrics_server.sample()  # at most once a second, cheap
        self.transport.tick(self.fleet)
        self.fleet.tick()
        self._deliver(self.fleet.coordination)
        return handled

    def _deliver(self, coordination: Coordination) -> None:
        """Commands another collector (the leader) queued for the agents connected here."""
        try:
            coordination.deliver(self.transport.send_command, self.transport.routes)
        except sqlite3.Error as exc:
            self.log.error("command_outbox_failed", error=str(exc))

    def request_reload(self) -> None:
        """Reload the allow-list at the next loop turn (signal-safe)."""
        self.transport.request_reload()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        self.log.info("collector_stopped", **self.counters.snapshot())
        self.transport.close()
        self.fleet.close()


def build_collector(settings: CollectorSettings, *, automation: AutomationSettings | None = None,
                    slurm: SlurmClient | None = None, state_dir: str | Path | None = None,
                    slurm_poll: SlurmClient | None = None, store: Store | None = None,
                    clock: Clock | None = None, max_batch: int | None = None,
                    remediation: RemediationSettings | None = None) -> Collector:
    """The collector for ``settings``, bound and ready to ``run``.

    ``automation``: the ``[automation]`` settings (None: no automation), acting through
    ``slurm`` with its state in ``state_dir``, on ``clock`` (default: the system's).
    ``slurm_poll``: the client asked for the nodes' states every ``slurm_poll_s`` (None:
    no polling). ``store``: an open store to use (default: ``settings.db``, closed with
    the collector). ``max_batch``: messages a batch (default: the backend's, MAX_BATCH or
    MAX_BATCH_POSTGRES). ``remediation``: ``[remediation]`` (with ``enabled``, drained nodes
    return through the ladder: ``collector.remediate``). CollectorError: cannot bind or serve metrics; ValueError: a bad
    ``[automation]`` (or its state directory not writable)."""
    counters = Counters()
    postgres = is_postgres(str(store.path if store else settings.db))
    if max_batch is None:
        max_batch = MAX_BATCH_POSTGRES if postgres else MAX_BATCH
    transport = Transport(settings, counters, max_batch=max_batch)
    with contextlib.ExitStack() as undo:
        undo.callback(transport.close)
        own_store = store is None
        if store is None:
            store = Store(settings.db, sample_interval_s=settings.sample_interval_s)
            undo.callback(store.close)
            store.checkpoint_in_background()
        coordination = None
        send: SendCommand = transport.send_command
        if store.shared:  # PostgreSQL: maybe one of several collectors
            coordination = Coordination(store, Leadership(store.path, timeout_s=settings.leader_timeout_s))
            undo.callback(coordination.close)
            send = coordination.sender(transport.send_command)
            if slurm is not None:  # a leader cut off since its last poll does not act
                slurm = cast("SlurmClient", FencedSlurm(slurm, coordination))
        auto = None
        if automation is not None:
            if slurm is None or state_dir is None:
                raise ValueError("automation needs a Slurm client and a state directory")
            make_checkpoints = functools.partial(Checkpoints, store, slurm, automation, send=send,
                                                 clock=clock.time if clock is not None else time.time)
            auto = Automation(automation, slurm, state_dir, clock, store=store,
                              checkpoints=make_checkpoints)
            if remediation is not None and remediation.enabled:
                attach(auto, remediation, Path(state_dir))
        poller = None
        if slurm_poll is not None and settings.slurm_poll_s > 0:
            poller = SlurmPoller(slurm_poll, settings.slurm_poll_s)
            poller.start()
            undo.callback(poller.stop)
        fleet = Fleet(settings, store, counters, allowed=transport.allowed, automation=auto,
                      poller=poller, own_store=own_store, coordination=coordination)
        transport.listen()  # last: a connected agent is answered from the first loop turn
        undo.pop_all()
    transport.log.info("collector_listening", endpoint=transport.endpoint, nodes=len(transport.allowed),
                       db=store.where, automation=auto is not None)
    return Collector(transport, fleet, metrics=_metrics(settings, transport, fleet))


def attach(auto: Automation, settings: RemediationSettings, state_dir: Path, *,
           poll_s: float = POLL_S, node_poll_s: float = NODE_POLL_S) -> Remediation:
    """The automation's drained nodes return through their ladders from now on."""
    auto.remediation = Remediation(
        settings, auto.client, auto.store, state_dir, dry_run=auto.settings.dry_run,
        program=shlex.split(settings.job_program), note_action=auto.ladder_reboot,
        on_closed=auto.ladder_closed, poll_s=poll_s, node_poll_s=node_poll_s,
        breaker_open=lambda: auto.state.breaker.open)
    return auto.remediation


def _metrics(settings: CollectorSettings, transport: Transport, fleet: Fleet) -> MetricsServer | None:
    """Prometheus /metrics (collector/metrics.py): computed at scrape time in its own thread."""
    if not settings.metrics_bind:
        return None
    from slurmgpu.collector.metrics import start_metrics_server

    try:
        server = start_metrics_server(fleet, settings.metrics_bind, tls_cert=settings.metrics_tls_cert,
                                      tls_key=settings.metrics_tls_key,
                                      client_ca=settings.metrics_client_ca)
    except (OSError, ValueError) as exc:
        Collector(transport, fleet).close()
        detail = str(exc) if isinstance(exc, ValueError) else (
            f"collector.metrics_bind = {settings.metrics_bind!r}: cannot serve metrics: {exc}")
        raise CollectorError(detail) from None
    transport.log.info("metrics_listening", url=server.url)
    return server
