"""The simulated cluster's Slurm daemons (munged, slurmctld, one slurmd per node): start,
stop, wait for them, and the Slurm clients run against them."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterable

from slurmgpu.sim.cluster.common import TERMINAL_JOB_STATES, ClusterError, log_tail
from slurmgpu.sim.cluster.gpus import GpuCluster
from slurmgpu.sim.cluster.procs import terminate


class SlurmDaemons(GpuCluster):
    """Process control and Slurm queries of a simulated cluster."""

    def is_up(self) -> bool:
        """All our daemons run and slurmctld answers."""
        if not self._state or any(self._pid(d) is None for d in self._daemons()):
            return False
        return self._ping()

    def _ping(self) -> bool:
        try:
            out = self._run(["scontrol", "ping"], timeout=15, check=False)
        except ClusterError:
            return False
        return "is UP" in out

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._start_munged()
        self._spawn(["slurmctld", "-c", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self._pid("slurmctld") is not None and self._ping(), deadline,
                   lambda: f"slurmctld did not come up; {log_tail(self.log_path('slurmctld'))}")
        for node in self.nodes:
            self._spawn(["slurmd", "-N", node, "-f", str(self.conf)], node)
        self.wait_idle(max(deadline - time.monotonic(), 5))

    def _start_munged(self) -> None:
        m = self.dir / "munge"
        m.mkdir(exist_ok=True)
        m.chmod(0o755)  # munged wants the socket's directory searchable by everyone
        key = m / "munge.key"
        if not key.is_file():
            if shutil.which("mungekey"):
                self._run(["mungekey", "--create", f"--keyfile={key}"])
            else:
                key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn([
            "munged", "--force", f"--key-file={key}", f"--socket={m}/munge.socket.2",
            f"--pid-file={self._pid_file('munged')}", f"--seed-file={m}/munged.seed",
            f"--log-file={m}/munged.log",
        ], "munged")
        self._wait(lambda: self._pid("munged") is not None and (m / "munge.socket.2").exists(),
                   time.monotonic() + 10, lambda: f"munged did not start; {log_tail(m / 'munged.log')}")

    def node_states(self) -> dict[str, str]:
        """sinfo's long state per node: idle, allocated, mixed, drained, idle*, down*..."""
        out = self._run(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout=15)
        states = {}
        for line in out.splitlines():
            name, _, state = line.partition("|")
            states[name.strip()] = state.strip()
        return states

    def node_reasons(self) -> dict[str, str]:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N|%E"], timeout=15)
        return {n.strip(): r.strip() for n, _, r in (ln.partition("|") for ln in out.splitlines())}

    def wait_idle(self, timeout: float = 30, nodes: Iterable[str] | None = None) -> None:
        """Wait until every (given) node is idle. Fails early when a slurmd died or a node is
        INVAL (config mismatch); the error carries the state and slurmd/slurmctld log tails."""
        names = list(nodes) if nodes is not None else self.nodes
        start = time.monotonic()
        deadline = start + timeout
        grace = start + 2  # a just-started slurmd may not have its pid file yet
        states: dict[str, str] = {}
        while True:
            with contextlib.suppress(ClusterError):
                states = self.node_states()
            busy = [n for n in names if states.get(n) != "idle"]
            if not busy:
                return
            now = time.monotonic()
            dead = [n for n in busy if self._pid(n) is None] if now > grace else []
            broken = dead + [n for n in busy if states.get(n, "").startswith("inval")]
            if broken or now > deadline:
                detail = ", ".join(f"{n}: {states.get(n, '?')}"
                                   f"{' (slurmd not running)' if n in dead else ''}"
                                   for n in busy)
                logs = "; ".join(log_tail(self.log_path(n), 4) for n in (broken or busy)[:2])
                raise ClusterError(f"nodes not idle after {now - start:.1f}s "
                                   f"({detail}); {logs}; {log_tail(self.log_path('slurmctld'), 3)}")
            time.sleep(0.1)

    def _stop_daemons(self, grace: float = 10) -> None:
        self.stop_agents(grace)
        slurm = [p for p in (self._pid(n) for n in [*self.nodes, "slurmctld"]) if p]
        terminate(slurm, grace)
        munged = self._pid("munged")
        if munged:
            terminate([munged], grace)
        for daemon in self._daemons():
            self._pid_file(daemon).unlink(missing_ok=True)

    def stop_controller(self, grace: float = 10) -> None:
        """Stop slurmctld only (to test what slurmgpu does when it is unreachable)."""
        pid = self._pid("slurmctld")
        if pid is not None:
            terminate([pid], grace)

    def start_controller(self, timeout: float = 30) -> None:
        """Start slurmctld again, keeping its saved state (no -c), and wait for it."""
        if self._pid("slurmctld") is None:
            self._spawn(["slurmctld", "-f", str(self.conf)], "slurmctld")
        deadline = time.monotonic() + timeout
        self._wait(lambda: self._pid("slurmctld") is not None and self._ping(), deadline,
                   lambda: f"slurmctld did not come back; {log_tail(self.log_path('slurmctld'))}")

    def job_ids(self) -> list[str]:
        """Jobs slurmctld still tracks that are not finished (pending, running, completing...)."""
        out = self._run(["squeue", "-h", "-o", "%A|%T"], timeout=15)
        return [j for j, _, s in (ln.partition("|") for ln in out.split()) if s not in
                TERMINAL_JOB_STATES]

    def cancel_all(self, timeout: float = 30) -> None:
        """scancel every job until none is left. A job whose prolog failed is requeued by
        slurmctld, and a cancel that arrives while it is requeued can be lost: ask again."""
        deadline = time.monotonic() + timeout
        asked = 0.0
        while ids := self.job_ids():
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(f"jobs still queued after scancel: {', '.join(ids)}")
            if now - asked >= 2.0:
                self._run(["scancel", *ids], check=False)
                asked = now
            time.sleep(0.2)

    def boot(self, node: str, timeout: float = 15) -> None:
        """Play a node coming back from ``scontrol reboot``: the RebootProgram (/bin/true)
        records nothing and restarts nothing, so this is the boot (see _reboot_slurmd)."""
        self._reboot_slurmd(node, timeout)

    def delete_reservations(self) -> None:
        """Delete every reservation (a test's, or one slurmgpu left behind)."""
        out = self._run(["scontrol", "-o", "show", "reservation"], check=False)
        for name in re.findall(r"^ReservationName=(\S+)", out, re.MULTILINE):
            self._run(["scontrol", "delete", f"reservationname={name}"], check=False)

    def _reboot_slurmd(self, node: str, timeout: float = 15) -> None:
        """Finish a reboot the RebootProgram (/bin/true) never did: restart the node's
        slurmd with -b, which tells slurmctld the node has just booted."""
        pid = self._pid(node)
        if pid is not None:
            terminate([pid], timeout)
        self._spawn(["slurmd", "-b", "-N", node, "-f", str(self.conf)], node)

    def _resume_all(self) -> None:
        """Resume drained, draining and down nodes (idle* just waits for its slurmd)."""
        for node, state in self.node_states().items():
            if state.endswith("^"):  # reboot issued: "reboot" it (slurmd -b says it booted)
                self._reboot_slurmd(node)
            elif "reboot" in state or state.endswith("@"):  # reboot pending: cancel it
                self._run(["scontrol", "cancel_reboot", node], check=False)
            if any(word in state for word in ("drain", "down", "fail")):
                self._run(["scontrol", "update", f"nodename={node}", "state=resume"],
                          check=False)

    def _clear_stale_reasons(self, timeout: float) -> None:
        """Run an empty job on each idle node that still shows a reason: 25.11 keeps a
        resumed node's reason until a job runs there (22.05 clears it on resume)."""
        stale = [n for n, r in self.node_reasons().items() if n in self.nodes and r not in ("", "none")]
        jobs = [self.sbatch("", "-w", node, "-o", "/dev/null", "--wrap", "true") for node in stale]
        for job in jobs:
            self.wait_job(job, timeout=timeout)
        if stale:
            self.wait_idle(timeout, stale)

    # ---- Slurm clients

    def scontrol(self, *args: str) -> str:
        return self._run(["scontrol", *args])

    def sbatch(self, script: str, *args: str) -> str:
        """Submit a batch job and return its id. ``script`` is the script's text (a ``#!``
        line is added when missing); pass ``""`` with ``--wrap CMD`` in ``args``. The job runs
        in ``<dir>/jobs``, so its default output is ``<dir>/jobs/slurm-<id>.out``."""
        cmd = ["sbatch", "--parsable", *args]
        text = None
        if script:
            text = script if script.startswith("#!") else "#!/bin/sh\n" + script
        out = self._run(cmd, input_text=text, cwd=self.dir / "jobs")
        return out.strip().split(";")[0]

    def job_output(self, job_id: str) -> str:
        path = self.dir / "jobs" / f"slurm-{job_id}.out"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ClusterError(f"no output for job {job_id} at {path}") from exc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -d -o`` as a dict (JobState, NodeList, Reason, GRES...)."""
        out = self.scontrol("show", "job", "-d", "-o", str(job_id))
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def wait_job(self, job_id: str, states: Iterable[str] = ("COMPLETED",),
                 timeout: float = 60) -> str:
        """Wait until the job reaches one of ``states`` or a final state; return that state."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "?")
            if state in wanted or state in TERMINAL_JOB_STATES:
                return state
            time.sleep(0.2)
        raise ClusterError(f"job {job_id} still {state} after {timeout:.0f}s")
