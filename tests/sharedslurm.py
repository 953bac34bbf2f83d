"""Test support for several collectors as separate processes: one in-memory Slurm
(``FakeSlurmClient``) whose state lives in a file under an flock, so every process sees
the same nodes, jobs and calls; and the collector process itself (``python -m
tests.sharedslurm SPEC.json``), which a test can kill -9."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slurmgpu.testing import FakeSlurmClient


class FileSlurmClient:
    """A ``SlurmClient``: every call loads the shared ``FakeSlurmClient`` under an exclusive
    flock, runs, and writes it back (atomically: a process killed mid-call leaves the state
    as it was before the call). The fake's ``callers`` holds the pid of the process that
    made each of its ``calls``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | Path, nodes: list[str]) -> FileSlurmClient:
        client = cls(path)
        client._write(FakeSlurmClient(nodes))
        return client

    @contextlib.contextmanager
    def _locked(self) -> Iterator[FakeSlurmClient]:
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fake: FakeSlurmClient = pickle.loads(self.path.read_bytes())
            yield fake
            self._write(fake)

    def _write(self, fake: FakeSlurmClient) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(fake))
        tmp.replace(self.path)

    def snapshot(self) -> FakeSlurmClient:
        with self._locked() as fake:
            return fake

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._locked() as fake:
                before = len(fake.calls)
                try:
                    return getattr(fake, name)(*args, **kwargs)
                finally:  # (which process made each call: ``callers``, beside ``calls``)
                    callers = fake.__dict__.setdefault("callers", [])
                    callers += [os.getpid()] * (len(fake.calls) - before)
        return call


def main(spec_path: str) -> None:
    """One collector process, as ``slurmgpu collector`` runs it, on the shared Slurm."""
    from slurmgpu.collector.app import build_collector
    from slurmgpu.config.schema import AutomationSettings, CollectorSettings
    from slurmgpu.log import configure

    spec = json.loads(Path(spec_path).read_text())
    configure("info", json=True, stream=sys.stdout)
    slurm = FileSlurmClient(spec["slurm"])
    collector = build_collector(CollectorSettings(**spec["collector"]),
                                automation=AutomationSettings(**spec["automation"]), slurm=slurm,
                                state_dir=spec["state_dir"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(json.dumps({"event": "ready"}), flush=True)
    collector.run(stop)


if __name__ == "__main__":
    main(sys.argv[1])
