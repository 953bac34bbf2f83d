"""The Slurm hooks: prolog gate, epilog re-check, node healthcheck.

Each hook asks its ``FactsProvider`` for the facts of its scope (``slurmgpu.engine``:
the node's sources on the cold path, the agent's cache on the warm path), runs the
checks, decides, and acts through ``slurmgpu.actions`` (the only place that drains or
resumes). Every decision is one structured log line on stderr (slurmd keeps it) and one
JSON line in ``<state_dir>/gate.jsonl``.

Safety rules: an internal error or a watchdog timeout *before a verdict* follows
``on_error`` (default fail-open: the job runs, the error is logged loudly and recorded),
so a slurmgpu bug can never drain a cluster. Once the verdict is FAIL nothing turns it
into exit 0: a watchdog timeout then refuses (exit 1; Slurm drains the node itself). The
Slurm calls of a prolog or epilog share ``SLURM_SHARE`` of its watchdog (``_actions``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from slurmgpu import jobfiles
from slurmgpu.actions import Actions
from slurmgpu.config.env import apply_env
from slurmgpu.config.schema import Settings
from slurmgpu.decision import Action, drain_reason
from slurmgpu.engine import FactsProvider, evaluate, node_name, source_facts, system_sources
from slurmgpu.facts import (
    CLOCKS_EVENT_HW_THROTTLE,
    CLOCKS_EVENT_SW_THERMAL,
    NodeFacts,
    clocks_event_names,
)
from slurmgpu.fileutil import append_private, private_dir, write_text_atomic
from slurmgpu.record import record
from slurmgpu.result import Severity, Verdict
from slurmgpu.slurm import SlurmClient, SlurmError, SlurmUnreachable
from slurmgpu.slurm.common import ClientBase
from slurmgpu.slurm.factory import bounded
from slurmgpu.sources import kmsg

EXIT_OK, EXIT_REFUSE = 0, 1
#: The share of a prolog's or epilog's ``timeout_s`` its Slurm calls may take, tries and
#: pauses together (``SlurmClient.within``): the rest is for the facts and the checks.
SLURM_SHARE = 0.5


def _nobody(what: str) -> None:
    """Nobody to tell that the hook decided (the agent's warm path; tests)."""


@record(frozen=True)
class JobContext:
    """The job a hook runs for, from Slurm's environment."""

    node: str
    job_id: str | None = None
    user: str | None = None
    # GPU indices Slurm gave the job; empty: no GPUs; None: unknown (check all).
    gpus: frozenset[int] | None = None
    # Set when SLURM_JOB_GPUS names something that is no GPU index (e.g. "-1"): a bad
    # request, judged by on_error, never a drain.
    bad_gpus: str | None = None


def parse_gpu_indices(text: str | None) -> frozenset[int] | None:
    """SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES ("0,1") -> {0, 1}; None when absent or not
    indices (UUIDs, "NoDevFiles"): then the gate checks every GPU."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return frozenset()
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return None


MAX_GPU_INDEX = 1023


def _bad_indices(gpus: frozenset[int] | None) -> bool:
    return gpus is not None and any(i < 0 or i > MAX_GPU_INDEX for i in gpus)


def job_context(environ: Mapping[str, str]) -> JobContext:
    gpus = parse_gpu_indices(environ.get("SLURM_JOB_GPUS"))
    source = "SLURM_JOB_GPUS"
    if gpus is None:
        gpus, source = parse_gpu_indices(environ.get("CUDA_VISIBLE_DEVICES")), "CUDA_VISIBLE_DEVICES"
    bad = f"{source}={environ.get(source)!r} is not a list of GPU indices" if _bad_indices(gpus) else None
    return JobContext(
        node=node_name(environ),
        job_id=environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"),
        user=environ.get("SLURM_JOB_USER"),
        gpus=None if bad else gpus,
        bad_gpus=bad,
    )


class Watchdog:
    """Bounds a hook. Runs ``on_timeout(step)`` in its own thread, so it fires even
    while the main thread is stuck inside a C call (a hung NVML query)."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[str], None]) -> None:
        self.step = "start"
        self.fired = threading.Event()
        self._handled = threading.Event()
        self._on_timeout = on_timeout
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired.set()
        try:
            self._on_timeout(self.step)
        finally:
            self._handled.set()

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        # Once the watchdog fired, its decision stands: let it finish (it ends the process)
        # instead of racing it with the main thread's own exit.
        if self.fired.is_set():
            self._handled.wait(120)

    def __call__(self, step: str) -> None:
        self.step = step


@record
class Gate:
    settings: Settings
    environ: Mapping[str, str]
    client_factory: Callable[[], SlurmClient]
    # Where the facts come from; None: the node's own sources (engine.source_facts).
    facts: FactsProvider | None = None
    # For tests: what a watchdog does at the end (the real one leaves the process).
    exit: Callable[[int], None] = os._exit
    records: list[dict[str, Any]] = field(default_factory=list)
    # Added to every record (the agent's warm path sets {"path": "agent"}).
    record_extra: dict[str, Any] = field(default_factory=dict)
    # Bookkeeping that failed this run (state dir full or read-only, ...): reported, never
    # a change of the decision.
    bookkeeping_errors: list[str] = field(default_factory=list)
    # Told the verdict's name (or the hook's on_error action) the moment the hook decided:
    # the full path tells the quick client (``slurmgpu.quickgate.tell_decided``).
    on_decided: Callable[[str], None] = _nobody
    # The verdict of this run, once there is one; and when the Slurm share of the watchdog ends.
    verdict: Verdict | None = field(default=None, init=False)
    slurm_deadline: float | None = field(default=None, init=False)
    # Called after the epilog retired a job's directory; None: the epilog sweeps it itself.
    sweep_job_dirs: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        # The hook's SLURMGPU_* variables over the settings (on the agent's warm path:
        # over the agent's own, which had the agent's environment applied).
        self.settings = apply_env(self.settings, self.environ)

    # -- paths -----------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.paths.state_dir)

    @property
    def device_pattern(self) -> str:
        return self.settings.epilog.device_pattern

    @property
    def provider(self) -> FactsProvider:
        if self.facts is None:
            self.facts = source_facts(system_sources(self.settings), self.settings, self.environ)
        return self.facts

    def _actions(self) -> Actions:
        client = self.client_factory()
        if self.slurm_deadline is not None:
            client = bounded(client)
            if isinstance(client, ClientBase):
                client.within(self.slurm_deadline - time.monotonic())
        return Actions(client, self.state_dir)

    def _start_watch(self, timeout_s: float) -> None:
        """A prolog or epilog starts: its Slurm calls end within SLURM_SHARE of its watchdog."""
        self.slurm_deadline = time.monotonic() + SLURM_SHARE * timeout_s

    def _decided(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.on_decided(verdict.severity.name)

    # -- prolog ----------------------------------------------------------------

    def prolog(self) -> int:
        job = job_context(self.environ)
        cfg = self.settings.prolog
        self._start_watch(cfg.timeout_s)
        with Watchdog(cfg.timeout_s, lambda step: self._timed_out("prolog", job, step, cfg.on_error)) as dog:
            if job.bad_gpus:  # a bad request, not a bad node
                return self._internal_error("prolog", job, f"bad request: {job.bad_gpus}", cfg.on_error)
            self._best_effort("replay", self._replay_pending)
            try:
                since = kmsg.xid_window(self.settings, gpus=job.gpus)
                facts = self.provider(job.gpus, xids_since=since, progress=dog)
                verdict = evaluate(facts, self.settings, scope=job.gpus, progress=dog)
            except Exception as exc:  # a bug must not drain the cluster (fail-open by default)
                return self._job_dir_if_ok(job, self._internal_error("prolog", job, _describe(exc),
                                                                      cfg.on_error))
            # Decided. What follows is bookkeeping: it never changes the decision.
            self._decided(verdict)
            dog("act")
            if verdict.severity is Severity.UNKNOWN:
                code = self._internal_error("prolog", job, _unknown_summary(verdict), cfg.on_error)
            else:
                code = self._decide("prolog", job, verdict, drain=cfg.drain)
            self._best_effort("job state", lambda: self._save_job_state(job, facts))
            return self._job_dir_if_ok(job, code)

    # -- epilog ----------------------------------------------------------------

    def epilog(self) -> int:
        """Decide (within the watchdog), then clean up the job's directory (after it: what
        the job left there never delays nor changes the decision)."""
        job = job_context(self.environ)
        cfg = self.settings.epilog
        self._start_watch(cfg.timeout_s)
        with Watchdog(cfg.timeout_s, lambda step: self._timed_out("epilog", job, step, cfg.on_error)) as dog:
            code = self._epilog_decision(job, dog)
        self._best_effort("job directory", lambda: self._remove_job_dir(job))
        return code

    def _epilog_decision(self, job: JobContext, dog: Watchdog) -> int:
        cfg = self.settings.epilog
        if job.bad_gpus:
            return self._internal_error("epilog", job, f"bad request: {job.bad_gpus}", cfg.on_error)
        self._best_effort("replay", self._replay_pending)
        try:
            before = self._load_job_state(job)
            started = before.get("started_at") if before else None
            # All GPUs, so kernel-log XIDs map to the right GPU; the verdict is scoped.
            facts = self.provider(None, xids_since=started, progress=dog)
            verdict = evaluate(facts, self.settings, scope=job.gpus, progress=dog)
            dog("strays")
            strays = self._strays(job)
        except Exception as exc:
            return self._internal_error("epilog", job, _describe(exc), cfg.on_error)
        self._decided(verdict)
        dog("act")
        if verdict.severity is Severity.UNKNOWN:
            code = self._internal_error("epilog", job, _unknown_summary(verdict), cfg.on_error)
        else:
            code = self._decide("epilog", job, verdict, drain=cfg.drain, exit_on_fail=EXIT_OK)
        self._best_effort("job summary", lambda: self._record_summary(job, facts, before, verdict, strays))
        self._best_effort("job state", lambda: self._drop_job_state(job))
        self._best_effort("job end", lambda: kmsg.mark_job_end(self.state_dir, facts.collected_at, job.gpus))
        return code

    # -- healthcheck -----------------------------------------------------------

    def healthcheck(self) -> int:
        job = JobContext(node=node_name(self.environ))
        try:
            self._replay_pending()
            facts = self.provider(None, xids_since=kmsg.xid_window(self.settings))
            verdict = evaluate(facts, self.settings)
            self._decided(verdict)
            actions = self._actions()
            if verdict.severity is Severity.FAIL:
                result = actions.drain(job.node, drain_reason(verdict.findings), actor="healthcheck")
            elif verdict.severity in (Severity.OK, Severity.WARN) and self.settings.healthcheck.resume:
                result = actions.resume_recovered(job.node)
            else:
                result = None
            self._record("healthcheck", job, verdict, action=result.action if result else Action.NONE,
                         reason=result.reason if result else None)
            return verdict.severity.exit_code
        except SlurmUnreachable as exc:
            self._record("healthcheck", job, None, action="drain-deferred", error=str(exc))
            return Severity.UNKNOWN.exit_code
        except Exception as exc:
            self._record("healthcheck", job, None, action=Action.NONE, error=_describe(exc), level="error")
            return Severity.UNKNOWN.exit_code

    # -- shared ------------------------------------------------------------------

    def _decide(self, phase: str, job: JobContext, verdict: Verdict, *, drain: bool,
                exit_on_fail: int = EXIT_REFUSE) -> int:
        if verdict.severity is not Severity.FAIL:
            self._record(phase, job, verdict, action=Action.NONE, exit_code=EXIT_OK)
            return EXIT_OK
        reason = drain_reason(verdict.findings)
        if not drain:
            self._record(phase, job, verdict, action="refuse", reason=reason, exit_code=exit_on_fail)
            return exit_on_fail
        try:
            result = self._actions().drain(job.node, reason, actor=phase)
        except Exception as exc:
            # Exit non-zero: Slurm drains the node itself ("Prolog/Epilog error"); a Slurm
            # error is journalled for the next run. Whatever broke, the FAIL stands.
            error = str(exc) if isinstance(exc, SlurmError) else _describe(exc)
            self._record(phase, job, verdict, action="drain-failed", reason=reason, error=error,
                         level="error", exit_code=EXIT_REFUSE)
            return EXIT_REFUSE
        self._record(phase, job, verdict, action=result.action, reason=result.reason,
                     exit_code=exit_on_fail)
        return exit_on_fail

    def _internal_error(self, phase: str, job: JobContext, error: str, policy: str) -> int:
        if policy == "fail-open":
            self._record(phase, job, None, action="fail-open", error=error, level="error",
                         exit_code=EXIT_OK)
            return EXIT_OK
        reason = drain_reason(text=f"internal error in {phase}: {error}")
        try:
            result = self._actions().drain(job.node, reason, actor=phase)
            action: str = result.action
        except Exception as exc:
            action, error = "drain-failed", f"{error}; drain failed: {_describe(exc)}"
        self._record(phase, job, None, action=f"fail-closed:{action}", reason=reason, error=error,
                     level="error", exit_code=EXIT_REFUSE)
        return EXIT_REFUSE

    def _timed_out(self, phase: str, job: JobContext, step: str, policy: str) -> None:
        """The watchdog fired. Before a verdict (or on an UNKNOWN one): on_error. After a
        verdict it stands: FAIL refuses (exit 1: Slurm drains the node, whatever did not
        finish), OK and WARN let the job run."""
        error = f"watchdog: {phase} exceeded {getattr(self.settings, phase).timeout_s:g} s in {step}"
        verdict = self.verdict
        if verdict is None or verdict.severity is Severity.UNKNOWN:
            self.exit(self._internal_error(phase, job, error, policy))
            return
        failed = verdict.severity is Severity.FAIL
        code = EXIT_REFUSE if failed else EXIT_OK
        self._record(phase, job, verdict, action="timed-out", level="error", error=error, exit_code=code,
                     reason=drain_reason(verdict.findings) if failed else None)
        self.exit(code)

    def _replay_pending(self) -> None:
        if (self.state_dir / "pending-actions.jsonl").exists():
            for result in self._actions().replay_pending():
                self._record("replay", JobContext(node=result.node), None, action=result.action,
                             reason=result.reason)

    # -- per-job state (prolog -> epilog) -----------------------------------------

    def _job_file(self, job: JobContext) -> Path | None:
        if not job.job_id or not job.job_id.isdigit():
            return None
        return self.state_dir / "jobs" / f"{job.job_id}.json"

    def _save_job_state(self, job: JobContext, facts: NodeFacts) -> None:
        path = self._job_file(job)
        if path is None:
            return
        private_dir(self.state_dir)
        private_dir(path.parent)
        data = {"started_at": facts.collected_at, "gpus": sorted(job.gpus) if job.gpus is not None else None,
                "facts": _gpu_snapshot(facts)}
        write_text_atomic(path, json.dumps(data), mode=0o600)

    def _load_job_state(self, job: JobContext) -> dict[str, Any] | None:
        path = self._job_file(job)
        try:
            return json.loads(path.read_text()) if path else None
        except (OSError, ValueError):
            return None

    def _drop_job_state(self, job: JobContext) -> None:
        path = self._job_file(job)
        if path:
            path.unlink(missing_ok=True)

    # -- the job's directory (<jobs_dir>/<job id>/, for checkpoint requests) ---------

    def _jobs_dir(self) -> Path:
        """``[agent] jobs_dir``, as the hook's environment or else this process's (the
        agent, on its warm path: where it writes checkpoint requests) left it."""
        return jobfiles.jobs_dir(self.settings)

    def _job_dir_if_ok(self, job: JobContext, code: int) -> int:
        """After a prolog that lets the job run: make its directory (0700, the job's
        uid/gid). A failure is logged; it never changes the decision."""
        if code != EXIT_OK or not job.job_id:
            return code
        try:
            uid, gid = (self.environ.get(k, "") for k in ("SLURM_JOB_UID", "SLURM_JOB_GID"))
            jobfiles.make_job_dir(self._jobs_dir(), job.job_id,
                                  int(uid) if uid.isdigit() else None,
                                  int(gid) if gid.isdigit() else None)
        except (OSError, ValueError) as exc:
            _log().warning("job_dir_failed", job=job.job_id, error=str(exc))
        return code

    def _remove_job_dir(self, job: JobContext) -> None:
        """Retire the job's directory (one rename), then sweep: here within
        ``jobfiles.SWEEP_S`` (what is left waits for the next sweep), or by whoever set
        ``sweep_job_dirs`` (the agent, in its own loop)."""
        if not job.job_id:
            return
        try:
            jobfiles.retire_job_dir(self._jobs_dir(), job.job_id)
        except (OSError, ValueError) as exc:
            _log().warning("job_dir_remove_failed", job=job.job_id, error=str(exc))
            return
        if self.sweep_job_dirs is not None:
            self.sweep_job_dirs()
            return
        sweep = jobfiles.sweep_trash(self._jobs_dir())
        if not sweep.done:
            _log().warning("job_dir_cleanup_pending", job=job.job_id, removed=sweep.removed,
                           errors=dict(list(sweep.errors.items())[:5]),
                           note="the rest is removed by a later sweep (the next epilog or the agent)")

    # -- epilog extras --------------------------------------------------------------

    def _strays(self, job: JobContext) -> list[dict[str, Any]]:
        mode = self.settings.epilog.strays
        if mode == "ignore" or not job.gpus:
            return []
        devices = {self.device_pattern.format(index=i): i for i in sorted(job.gpus)}
        uid = self.environ.get("SLURM_JOB_UID")
        known_uid = int(uid) if uid and uid.isdigit() else None
        found = self.provider.holders(devices, uid=known_uid, ignore=self.settings.epilog.strays_ignore)
        if mode == "kill" and known_uid is None:
            # Without the job's uid every holder would match, other users' included: report only.
            _log().warning("strays_not_killed", job=job.job_id, reason="SLURM_JOB_UID not set")
        elif mode == "kill":
            for proc in found:
                try:
                    os.kill(proc["pid"], 9)
                    proc["killed"] = True
                except OSError:
                    proc["killed"] = False
        return found

    def _record_summary(self, job: JobContext, facts: NodeFacts, before: dict[str, Any] | None,
                        verdict: Verdict, strays: list[dict[str, Any]]) -> None:
        summary = job_summary(job, facts, before, verdict, strays)
        self._append("job-summaries.jsonl", summary)
        _log().info("job_gpu_summary", **summary)

    # -- records ----------------------------------------------------------------------

    def _record(self, phase: str, job: JobContext, verdict: Verdict | None, *, action: str,
                reason: str | None = None, error: str | None = None, level: str = "info",
                exit_code: int | None = None) -> None:
        """One decision: a log line and a ``gate.jsonl`` line. ``exit_code`` (the record's
        ``"exit"``): the hook's exit code, for prolog/epilog decisions (Slurm requeues a job
        whose prolog exits non-zero; the agent forwards the full path's such records to the
        collector, see ``slurmgpu.agent.gatelog``)."""
        entry: dict[str, Any] = {
            "time": time.time(), "phase": phase, "node": job.node, "job": job.job_id,
            "gpus": sorted(job.gpus) if job.gpus is not None else None,
            "verdict": verdict.severity.name if verdict else None, "action": action,
            **self.record_extra,
        }
        if exit_code is not None:
            entry["exit"] = exit_code
        if reason:
            entry["reason"] = reason
        if error:
            entry["error"] = error
        if verdict:
            entry["problems"] = [f"{f.check}{'' if f.gpu is None else f' GPU {f.gpu}'}: {f.message}"
                                 for f in verdict.problems()]
        self.records.append(entry)
        if phase != "replay":
            self.on_decided(entry["verdict"] or action)
        self._append("gate.jsonl", entry)
        try:
            log = _log()
            if level == "error" or (verdict and verdict.severity is Severity.FAIL):
                log.error(f"{phase}_decision", **entry)
            else:
                log.info(f"{phase}_decision", **entry)
        except Exception as exc:  # the decision line could not be logged: still decided
            self.bookkeeping_errors.append(f"log: {_describe(exc)}")

    def _append(self, name: str, entry: dict[str, Any]) -> None:
        try:
            private_dir(self.state_dir)
            append_private(self.state_dir / name, json.dumps(entry, default=str) + "\n")
        except (OSError, TypeError, ValueError) as exc:  # a full or read-only disk: still decided
            self.bookkeeping_errors.append(f"{self.state_dir / name}: {exc}")
            with contextlib.suppress(Exception):
                _log().warning("state_write_failed", file=name, error=str(exc))

    def _best_effort(self, what: str, work: Callable[[], object]) -> None:
        """Bookkeeping around a decision (job state, summaries, replaying journalled
        drains): a failure is logged and kept in ``bookkeeping_errors`` (the agent turns
        it into an ``agent.state_dir`` finding), never raised into the decision."""
        try:
            work()
        except Exception as exc:
            self.bookkeeping_errors.append(f"{what}: {_describe(exc)}")
            with contextlib.suppress(Exception):
                _log().warning("bookkeeping_failed", what=what, error=_describe(exc))


def _log() -> Any:
    from slurmgpu import log

    return log.get_logger()


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _unknown_summary(verdict: Verdict) -> str:
    bad = [f"{f.check}: {f.message}" for f in verdict.findings if f.severity is Severity.UNKNOWN]
    return "check(s) could not run: " + "; ".join(bad)


def _gpu_snapshot(facts: NodeFacts) -> dict[str, Any]:
    """What the epilog compares against: per GPU ECC counts, remapped rows, temperature."""
    out = {}
    for gpu in facts.gpus:
        out[str(gpu.index)] = {
            "ecc_corrected": gpu.ecc.corrected_volatile if gpu.ecc else None,
            "ecc_uncorrected": gpu.ecc.uncorrected_volatile if gpu.ecc else None,
            "remapped_rows": (gpu.remapped_rows.correctable + gpu.remapped_rows.uncorrectable
                              if gpu.remapped_rows else None),
            "temperature_c": gpu.temperature_c,
        }
    return out


def _delta(now: int | None, then: int | None) -> int | None:
    return None if now is None or then is None else now - then


def job_summary(job: JobContext, facts: NodeFacts, before: dict[str, Any] | None, verdict: Verdict,
                strays: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One line per job: GPUs, hottest temperature seen, throttling, ECC/remap growth, XIDs."""
    then = (before or {}).get("facts", {})
    scope = job.gpus
    gpus = [g for g in facts.gpus if scope is None or g.index in scope]
    now = _gpu_snapshot(facts)
    temps = [t for g in gpus for t in (now[str(g.index)]["temperature_c"],
                                         then.get(str(g.index), {}).get("temperature_c")) if t is not None]
    seen = CLOCKS_EVENT_HW_THROTTLE | CLOCKS_EVENT_SW_THERMAL
    throttle = sorted({name for g in gpus if g.clocks_event_reasons
                       for name in clocks_event_names(g.clocks_event_reasons & seen)})
    deltas: dict[str, dict[str, int | None]] = {}
    for g in gpus:
        a, b = now[str(g.index)], then.get(str(g.index), {})
        d = {k: _delta(a[k], b.get(k)) for k in ("ecc_corrected", "ecc_uncorrected", "remapped_rows")}
        if any(v for v in d.values()):
            deltas[str(g.index)] = d
    return {
        "job": job.job_id, "user": job.user, "node": job.node,
        "gpus": sorted(scope) if scope is not None else [g.index for g in gpus],
        "max_temp_c": max(temps) if temps else None,
        "throttle_seen": throttle,
        "ecc_delta": deltas,
        "xids": [{"xid": x.xid, "gpu": x.gpu} for x in facts.xids if scope is None or x.gpu in scope
                 or x.gpu is None],
        "strays": list(strays),
        "verdict": verdict.severity.name,
    }

