"""The agent's side of checkpoint coordination.

The collector sends a ``checkpoint`` command for each job on a degrading node (to every
node of the job). ``CheckpointWatcher.request`` writes ``<jobs_dir>/<job>/checkpoint``
(``slurmgpu.jobfiles``) and answers "delivered"; a thread then looks at each open
request every ``[agent] checkpoint_poll_s`` and, once the job acks (``slurmgpu ckpt
ack``, or "done" written to the file), sends one more ``command-result`` for the
original command: ``{"state": "acked", "acked_at", "note"}``. With no open request the
thread sleeps on an Event (no polling). A request is dropped when the job's directory
goes (the epilog removed it) or an hour after its deadline.

``local_fallback``: the collector is unreachable and an event calls for "drain-now"
(GPU lost, XID 79): write the request for every job on this node and signal each job's
top-level local processes (those whose parent is not in the job: the batch shell, each
task's first process) -- what ``scancel --batch --signal`` would do, but locally.
"""

from __future__ import annotations

import os
import pwd
import signal as signals
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmgpu import jobfiles, wire
from slurmgpu.decision import CHECKPOINTING, Action
from slurmgpu.log import get_logger
from slurmgpu.result import Finding
from slurmgpu.sources import Clock

#: An open request is forgotten this long after its deadline.
EXPIRE_AFTER_S = 3600.0
#: The local fallback signals a job at most once in this long.
FALLBACK_EVERY_S = 600.0
#: With only acked requests left, look for their directories going this often.
ACKED_POLL_S = 30.0
#: A job's file that is not understood is logged at most this often (per job).
POISON_LOG_EVERY_S = 60.0
#: Of a process's environment (its user chose its size), only this much is read.
ENVIRON_MAX_BYTES = 1 << 20

Submit = Callable[[str, dict[str, Any]], Any]


@dataclass
class Request:
    job_id: str
    command_id: str  # the first checkpoint command for this request: the ack answers it
    path: Path
    deadline: float
    acked_at: float | None = None


def parse_signal(name: str) -> signals.Signals:
    """"USR1", "SIGUSR1", "usr1" or "10" -> the signal; ValueError otherwise."""
    text = name.strip()
    if text.isdigit():
        return signals.Signals(int(text))
    text = text.upper()
    try:
        return signals.Signals[text if text.startswith("SIG") else "SIG" + text]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class CheckpointWatcher:
    def __init__(self, *, node: str, jobs_dir: str | os.PathLike[str], poll_s: float,
                 submit: Submit, clock: Clock, proc_root: str = "/proc") -> None:
        self.node = node
        self.jobs_dir = Path(jobs_dir)
        self.poll_s = max(0.01, float(poll_s))
        self.submit = submit
        self.clock = clock
        self.proc_root = proc_root
        self.log = get_logger(component="checkpoints", node=node)
        self._lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._fallback_at: dict[str, float] = {}  # job id -> monotonic time it was signalled
        # job id -> (mtime, monotonic time) of the file last logged as not understood
        self._poisoned: dict[str, tuple[float, float]] = {}
        self._failed: dict[str, str] = {}  # job id -> the error last logged while watching it
        self._write_error: str | None = None  # a request that could not be written (ENOSPC, ...)
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the command

    def request(self, command_id: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Handle one ``checkpoint`` command: (ok, result) for its command-result."""
        job_id = args.get("job_id")
        if not jobfiles.valid_job_id(job_id):
            return False, {"job_id": str(job_id)[:64], "error": "bad job id"}
        assert isinstance(job_id, str)
        action = args.get("action", Action.CHECKPOINT.value)
        deadline = _number(args.get("deadline"))
        if not isinstance(action, str) or action not in CHECKPOINTING:
            return False, {"job_id": job_id, "error": f"bad action {str(action)[:40]!r}"}
        if deadline is None:
            return False, {"job_id": job_id, "error": "bad or missing deadline"}
        now = self.clock.time()
        requested_at = _number(args.get("requested_at"))
        requested_at = now if requested_at is None else requested_at
        path = jobfiles.checkpoint_file(self.jobs_dir, job_id)
        with self._lock:
            req = self._requests.get(job_id)
            if req is not None and not path.parent.is_dir():
                req = None  # the job's directory went: whatever was open is over
            try:
                current = jobfiles.read_file(path)
                parsed = self._parse(job_id, current)
                ack_time = self._ack_time(parsed, current)
                if parsed["state"] == jobfiles.ACKED and (req is not None
                                                          or ack_time >= requested_at):
                    if req is None:  # (an agent restart): this answer is the ack
                        req = self._requests[job_id] = Request(job_id, command_id, path, deadline,
                                                               acked_at=ack_time)
                    elif req.acked_at is None:
                        self._report_ack(req, parsed, ack_time)
                    return True, {"job_id": job_id, "state": "acked", "acked_at": req.acked_at,
                                  "file": str(path)}
                owner = self._job_dir_owner(job_id, args.get("user"))
                content = {"job_id": job_id, "state": jobfiles.REQUESTED, "action": action,
                           "reason": str(args.get("reason") or ""), "deadline": deadline,
                           "requested_at": requested_at, "node": self.node,
                           "trigger_node": str(args.get("trigger_node") or "")}
                jobfiles.write_atomic(path, content, owner=owner)
            except OSError as exc:
                self.log.error("checkpoint_request_failed", job=job_id, error=str(exc))
                self._write_error = f"checkpoint request for job {job_id} not written: {exc}"
                return False, {"job_id": job_id, "error": f"{type(exc).__name__}: {exc}"}
            if req is None:
                self._requests[job_id] = Request(job_id, command_id, path, deadline)
            else:
                req.deadline = deadline
        self.log.warning("checkpoint_requested", job=job_id, action=action, file=str(path),
                         deadline=deadline, reason=content["reason"])
        self._start()
        self._wake.set()
        return True, {"job_id": job_id, "state": "delivered", "file": str(path)}

    def _job_dir_owner(self, job_id: str, user: Any) -> tuple[int, int] | None:
        """(uid, gid) of the job's directory; made (for ``user``, else root) if missing."""
        directory = jobfiles.job_dir(self.jobs_dir, job_id)
        try:
            st = os.stat(directory)
            return st.st_uid, st.st_gid
        except FileNotFoundError:
            pass
        uid = gid = None
        if isinstance(user, str) and user:
            try:
                entry = pwd.getpwnam(user)
                uid, gid = entry.pw_uid, entry.pw_gid
            except KeyError:
                self.log.warning("checkpoint_unknown_user", job=job_id, user=user)
        jobfiles.make_job_dir(self.jobs_dir, job_id, uid, gid)
        return None if uid is None or gid is None else (uid, gid)

    @staticmethod
    def _ack_time(parsed: dict[str, Any], current: tuple[str, float] | None) -> float:
        at = parsed.get("acked_at")
        if isinstance(at, float):
            return at
        return current[1] if current else 0.0

    def _report_ack(self, req: Request, parsed: dict[str, Any], acked_at: float) -> None:
        req.acked_at = acked_at
        note = parsed.get("note")
        self.submit(wire.COMMAND_RESULT, {"command_id": req.command_id, "ok": True, "result": {
            "job_id": req.job_id, "state": "acked", "acked_at": acked_at,
            "note": note if isinstance(note, str) else None}})
        self.log.warning("checkpoint_acked", job=req.job_id, acked_at=acked_at, note=note)

    # ------------------------------------------------------------ watching

    def open_jobs(self) -> list[str]:
        """Jobs with a request not acked yet."""
        with self._lock:
            return sorted(j for j, r in self._requests.items() if r.acked_at is None)

    def _parse(self, job_id: str, current: tuple[str, float] | None) -> dict[str, Any]:
        """``jobfiles.parse`` of a job's file; what it did not understand is logged once
        per version of the file (its mtime), not at every poll."""
        parsed = jobfiles.parse(current[0] if current else None)
        error = parsed.get("error")
        if error and current is not None and self._log_poisoned(job_id, current[1]):
            self.log.warning("checkpoint_file_not_understood", job=job_id, error=str(error),
                             state=parsed["state"], bytes=len(current[0]))
        return parsed

    def _log_poisoned(self, job_id: str, mtime: float) -> bool:
        """Log this version of a job's file? Once per version, and at most once per
        POISON_LOG_EVERY_S per job (the job chooses how often its file changes)."""
        now = self.clock.monotonic()
        last = self._poisoned.get(job_id)
        if last is not None and (last[0] == mtime or now - last[1] < POISON_LOG_EVERY_S):
            return False
        self._poisoned[job_id] = (mtime, now)
        return True

    def check_once(self) -> None:
        """One look at every request: acks, jobs gone, requests expired. Each job on its
        own: one job's file can never keep the others' acks from being seen."""
        now = self.clock.time()
        with self._lock:
            for req in list(self._requests.values()):
                try:
                    self._check_request(req, now)
                except Exception as exc:
                    self._watch_failed(req.job_id, exc)

    def _check_request(self, req: Request, now: float) -> None:
        if not req.path.parent.is_dir():
            del self._requests[req.job_id]
            self._poisoned.pop(req.job_id, None)
            self._failed.pop(req.job_id, None)
            self.log.info("checkpoint_job_gone", job=req.job_id, acked=req.acked_at is not None)
            return
        if now > req.deadline + EXPIRE_AFTER_S:
            del self._requests[req.job_id]
            self.log.warning("checkpoint_request_expired", job=req.job_id,
                             acked=req.acked_at is not None)
            return
        if req.acked_at is not None:
            return
        try:
            current = jobfiles.read_file(req.path)
        except OSError as exc:
            self._watch_failed(req.job_id, exc)
            return
        parsed = self._parse(req.job_id, current)
        if parsed["state"] == jobfiles.ACKED:
            self._report_ack(req, parsed, self._ack_time(parsed, current))

    def _watch_failed(self, job_id: str, exc: BaseException) -> None:
        """One line per job and kind of error, not one per poll."""
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        if self._failed.get(job_id) != type(exc).__name__:
            self._failed[job_id] = type(exc).__name__
            self.log.warning("checkpoint_watch_failed", job=job_id, error=error)

    def _next_wait(self) -> float | None:
        with self._lock:
            if not self._requests:
                return None
            if any(r.acked_at is None for r in self._requests.values()):
                return self.poll_s
            return ACKED_POLL_S

    def _run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                self.check_once()
            except Exception as exc:  # pragma: no cover - logged; the thread goes on
                self.log.exception("checkpoint_watch_failed", error=f"{type(exc).__name__}: {exc}")

    def take_error(self) -> str | None:
        """The last request that could not be written since the last call (for a finding)."""
        with self._lock:
            error, self._write_error = self._write_error, None
        return error

    @property
    def dead(self) -> bool:
        """The watching thread was started and is gone, though not stopped."""
        thread = self._thread
        return thread is not None and not thread.is_alive() and not self._halt.is_set()

    def _start(self) -> None:
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if alive or self._halt.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="slurmgpu-checkpoints",
                                            daemon=True)
            self._thread.start()

    def restart(self) -> None:
        """Start the watching thread again (after it died)."""
        self._start()
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------ local fallback

    def local_jobs(self) -> list[str]:
        """Job ids with a directory under jobs_dir."""
        try:
            names = os.listdir(self.jobs_dir)
        except OSError:
            return []
        return sorted(n for n in names if jobfiles.valid_job_id(n)
                      and (self.jobs_dir / n).is_dir() and not (self.jobs_dir / n).is_symlink())

    def local_fallback(self, findings: Sequence[Finding], *, signal_name: str,
                       deadline_s: float) -> list[dict[str, Any]]:
        """Request a checkpoint from every local job and signal it (at most once per job in
        FALLBACK_EVERY_S); the jobs signalled, as the ``jobs`` of a local_checkpoint event."""
        try:
            sig = parse_signal(signal_name)
        except ValueError as exc:
            self.log.error("fallback_signal_invalid", signal=signal_name, error=str(exc))
            return []
        now, mono = self.clock.time(), self.clock.monotonic()
        jobs = []
        for job_id in self.local_jobs():
            with self._lock:
                last = self._fallback_at.get(job_id)
                if last is not None and mono - last < FALLBACK_EVERY_S:
                    continue
                self._fallback_at[job_id] = mono
            jobs.append(job_id)
        if not jobs:
            return []
        reason = _reason(findings)
        processes = scan_processes(self.proc_root)
        out = []
        for job_id in jobs:
            error = self._write_local_request(job_id, reason, now, now + deadline_s)
            pids = []
            for pid in top_level_pids(processes, job_id):
                try:
                    os.kill(pid, sig)
                    pids.append(pid)
                except OSError as exc:
                    self.log.warning("fallback_signal_failed", job=job_id, pid=pid, error=str(exc))
            name = sig.name.removeprefix("SIG")
            self.log.warning("local_checkpoint", job=job_id, pids=pids, signal=name, reason=reason,
                             file_error=error, note="collector unreachable; signalled locally")
            out.append({"job_id": job_id, "pids": pids, "signal": name})
        return out

    def _write_local_request(self, job_id: str, reason: str, now: float,
                             deadline: float) -> str | None:
        path = jobfiles.checkpoint_file(self.jobs_dir, job_id)
        with self._lock:
            req = self._requests.get(job_id)
            if req is not None and req.acked_at is not None:
                return None  # the job already acked: keep its answer
            try:
                st = os.stat(path.parent)
                jobfiles.write_atomic(path, {
                    "job_id": job_id, "state": jobfiles.REQUESTED, "action": Action.DRAIN_NOW.value,
                    "reason": reason, "deadline": deadline, "requested_at": now,
                    "node": self.node, "trigger_node": self.node, "local": True,
                }, owner=(st.st_uid, st.st_gid))
            except OSError as exc:
                self.log.error("local_checkpoint_write_failed", job=job_id, error=str(exc))
                self._write_error = f"checkpoint request for job {job_id} not written: {exc}"
                return f"{type(exc).__name__}: {exc}"
        return None


def _reason(findings: Iterable[Finding]) -> str:
    """The request's reason: the first finding that called for it."""
    for f in findings:
        where = "" if f.gpu is None else f" GPU {f.gpu}"
        return f"{f.check}{where}: {f.message}"[:300]
    return "drain-now event"


# ------------------------------------------------------------------ processes


def _job_ids(environ: bytes) -> frozenset[str]:
    """The jobs a process's environment names: SLURM_JOB_ID, and for an array task also
    <SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>."""
    values: dict[bytes, bytes] = {}
    for item in environ.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_ARRAY_JOB_ID", b"SLURM_ARRAY_TASK_ID"):
            values[key] = value
    out = set()
    if b"SLURM_JOB_ID" in values:
        out.add(values[b"SLURM_JOB_ID"].decode("ascii", "replace"))
    if b"SLURM_ARRAY_JOB_ID" in values and b"SLURM_ARRAY_TASK_ID" in values:
        out.add((values[b"SLURM_ARRAY_JOB_ID"] + b"_" + values[b"SLURM_ARRAY_TASK_ID"])
                .decode("ascii", "replace"))
    return frozenset(out)


def _ppid(proc_root: str, pid: int) -> int | None:
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read()
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def scan_processes(proc_root: str = "/proc") -> dict[int, tuple[frozenset[str], int | None]]:
    """pid -> (the jobs its environment names, its parent pid), for every process that
    names a job (other than this one)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return {}
    found: dict[int, tuple[frozenset[str], int | None]] = {}
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                environ = f.read(ENVIRON_MAX_BYTES)
        except OSError:
            continue  # gone, a kernel thread, or not ours to read
        jobs = _job_ids(environ)
        if jobs:
            found[pid] = (jobs, _ppid(proc_root, pid))
    return found


def top_level_pids(processes: dict[int, tuple[frozenset[str], int | None]],
                   job_id: str) -> list[int]:
    """The processes of ``job_id`` whose parent is not in that job."""
    out = []
    for pid, (jobs, ppid) in processes.items():
        if job_id not in jobs:
            continue
        parent = processes.get(ppid) if ppid is not None else None
        if parent is None or job_id not in parent[0]:
            out.append(pid)
    return sorted(out)
