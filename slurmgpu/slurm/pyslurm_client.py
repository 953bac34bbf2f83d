"""``SlurmClient`` over pyslurm (the 25.x object API).

API names checked against the pyslurm 25.11.2 sources:
``pyslurm.Node.load(name)``, ``pyslurm.Nodes.load()``,
``pyslurm.Node(name).modify(pyslurm.Node(state="DRAIN", reason=...))`` (states
``DRAIN``/``RESUME``), ``pyslurm.Job.load(int)``, ``pyslurm.Jobs.load()``,
``Job(id).send_signal("SIGUSR1", steps="batch"|"all")`` (names go through
``signal.Signals[...]``, so they need the ``SIG`` prefix), ``Job(id).requeue()``,
``Job(id).modify(pyslurm.JobSubmitDescription(admin_comment=...))``,
``Job.get_resource_layout_per_node()[node]["gres"]`` ->
``{"gpu": {"count": 2, "indexes": "0-1"}}``; errors are ``pyslurm.RPCError``.
pyslurm has no reboot call (``Node`` offers load/create/modify/delete only, and
libslurm's reboot RPC is not part of its object API), so ``reboot`` runs the same
``scontrol reboot`` argv as the CLI client; so do the return-to-service calls
(reservations, the validation's sbatch, scancel, the job list): one code path.

A caller with a deadline (a hook) gets the command client instead (``factory.bounded``):
a libslurm call cannot be cut short. Contract-tested against Slurm 25.11.7 with
pyslurm 25.11.2 (tests/test_slurm_client.py, ``-m pyslurm``).

pyslurm only builds against the Slurm release it was written for (25.11.x needs
Slurm 25.11), so ``available()`` checks major.minor against ``scontrol --version``
and ``make_client`` falls back to the CLI otherwise. pyslurm is imported lazily.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from slurmgpu.slurm import (
    JobGone,
    JobInfo,
    NodeState,
    Reservation,
    SlurmError,
    SlurmUnreachable,
    ended_at,
)
from slurmgpu.slurm.cli import (
    ACTIVE_JOB_STATES,
    CliSlurmClient,
    SlurmCommandError,
    _check_job,
    _check_node,
    expand_hostlist,
    is_unreachable,
    parse_index_list,
    parse_job_state,
    parse_node_state,
    parse_version,
    sanitize_reason,
)
from slurmgpu.slurm.common import ClientBase, ClientOptions
from slurmgpu.slurm.versions import already_resumed, reason_applies, version_text

T = TypeVar("T")


def _import_pyslurm(env: Mapping[str, str] | None = None) -> Any:
    """Import pyslurm. libslurm reads SLURM_CONF from the process environment when
    pyslurm initialises (at import), so a SLURM_CONF in ``env`` is exported first."""
    if "pyslurm" not in sys.modules and importlib.util.find_spec("pyslurm") is None:
        raise ImportError("pyslurm is not installed")
    if "pyslurm" not in sys.modules and env and env.get("SLURM_CONF"):
        os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    import pyslurm

    return pyslurm


def pyslurm_version(mod: Any) -> str | None:
    ver = getattr(mod, "__version__", None)
    if not ver and callable(getattr(mod, "version", None)):
        try:
            ver = mod.version()
        except Exception:
            ver = None
    return str(ver) if ver else None


def installed_version() -> str | None:
    """pyslurm's version from its package metadata, without importing it (importing loads
    the libslurm it was built against, which must not meet another release's slurm.conf)."""
    try:
        return importlib.metadata.version("pyslurm")
    except importlib.metadata.PackageNotFoundError:
        return None


def available(env: Mapping[str, str] | None = None, bin_dir: str | None = None) -> tuple[bool, str]:
    """(True, "pyslurm X matches Slurm Y") or (False, why not). pyslurm is imported only
    once its version matches the running Slurm's major.minor."""
    loaded = sys.modules.get("pyslurm")
    if loaded is None and importlib.util.find_spec("pyslurm") is None:
        return False, "pyslurm is not installed"
    ver = pyslurm_version(loaded) if loaded is not None else installed_version()
    pv = parse_version(ver or "")
    if pv is None and loaded is None:
        return _check_imported(env, bin_dir)
    return _compare(ver, pv, env, bin_dir)


def _check_imported(env: Mapping[str, str] | None, bin_dir: str | None) -> tuple[bool, str]:
    """``available`` for a pyslurm without package metadata: import it, then compare."""
    try:
        mod = _import_pyslurm(env)
    except Exception as exc:  # ImportError, or a libslurm load/symbol error
        return False, f"import pyslurm failed: {type(exc).__name__}: {exc}"
    ver = pyslurm_version(mod)
    return _compare(ver, parse_version(ver or ""), env, bin_dir)


def _compare(ver: str | None, pv: tuple[int, int] | None, env: Mapping[str, str] | None,
             bin_dir: str | None) -> tuple[bool, str]:
    if pv is None:
        return False, f"pyslurm version unknown ({ver!r})"
    sv = CliSlurmClient(bin_dir=bin_dir, env=env).version()
    if sv is None:
        return False, "Slurm version unknown (scontrol --version failed)"
    if pv != sv:
        return False, f"pyslurm {ver} is for Slurm {version_text(pv)}, running Slurm is {version_text(sv)}"
    try:
        _import_pyslurm(env)
    except Exception as exc:  # a libslurm load/symbol error
        return False, f"import pyslurm failed: {type(exc).__name__}: {exc}"
    return True, f"pyslurm {ver} matches Slurm {version_text(sv)}"


def _gpu_indices_from_layout(gres: Any) -> tuple[int, ...]:
    """``{"gpu": {"count": 2, "indexes": "0-1"}, "gpu:a100": {...}}`` -> indices."""
    out: set[int] = set()
    if isinstance(gres, Mapping):
        for name, val in gres.items():
            if str(name).split(":", 1)[0] != "gpu" or not isinstance(val, Mapping):
                continue
            out.update(parse_index_list(str(val.get("indexes") or "")))
    return tuple(sorted(out))


def _epoch(value: Any) -> float | None:
    """pyslurm's time (epoch seconds; 0 or None: not yet); anything else reads None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _exit_code(value: Any) -> int | None:
    """pyslurm's ``Job.exit_code``: an int once the job ended."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _signal_name(signal: str) -> str:
    s = str(signal).strip().upper()
    if s.isdigit() or s.startswith("SIG"):
        return s
    return f"SIG{s}"


class PyslurmClient(ClientBase):
    """``SlurmClient`` backed by pyslurm (needs a pyslurm built for this Slurm).

    ``command_timeout_s`` is kept for interface parity: libslurm has its own timeouts
    (MessageTimeout)."""

    def __init__(self, *, module: Any = None, **options: Unpack[ClientOptions]) -> None:
        super().__init__(**options)
        self._mod = module

    @staticmethod
    def available(env: Mapping[str, str] | None = None, bin_dir: str | None = None) -> tuple[bool, str]:
        return available(env, bin_dir)

    @property
    def pyslurm(self) -> Any:
        if self._mod is None:
            self._mod = _import_pyslurm(self.env)
        return self._mod

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        rpc_error = getattr(self.pyslurm, "RPCError", None)
        base_error = getattr(self.pyslurm, "PyslurmError", rpc_error)
        errors: tuple[type[BaseException], ...] = tuple(
            e for e in (rpc_error, base_error)
            if isinstance(e, type) and issubclass(e, BaseException)
        ) or (RuntimeError,)
        last = ""
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except errors as exc:
                msg = str(exc) or type(exc).__name__
                if not is_unreachable(msg):
                    raise SlurmCommandError(f"{what}: {msg}", output=msg) from exc
                last = msg
            if not self.may_retry(attempt):
                break
            self._sleep(self.retry_delay_s)
        raise SlurmUnreachable(f"slurmctld unreachable after {attempt} tries: {last}")

    # ----------------------------------------------------------------- nodes

    @staticmethod
    def _node_state(n: Any) -> NodeState:
        state, flags = parse_node_state(str(getattr(n, "state", None) or "UNKNOWN"))
        reason = (getattr(n, "reason", None) or None) if reason_applies(state, flags) else None
        when = getattr(n, "reason_time", None)
        return NodeState(
            name=str(n.name),
            state=state,
            flags=flags,
            reason=reason,
            reason_user=(getattr(n, "reason_user", None) or None) if reason else None,
            reason_time=float(when) if reason and when else None,
        )

    def node(self, name: str) -> NodeState:
        name = _check_node(name)
        try:
            n = self._call("Node.load", lambda: self.pyslurm.Node.load(name))
        except SlurmCommandError as exc:
            low = exc.output.lower()
            if "does not exist" in low or "invalid node name" in low or "not found" in low:
                raise SlurmError(f"no such node: {name}") from exc
            raise
        return self._node_state(n)

    def nodes(self) -> list[NodeState]:
        nodes = self._call("Nodes.load", lambda: self.pyslurm.Nodes.load())
        return [self._node_state(n) for n in nodes.values()]

    def drain(self, node: str, reason: str) -> None:
        node = _check_node(node)
        text = sanitize_reason(reason)
        mod = self.pyslurm
        self._call("Node.modify", lambda: mod.Node(node).modify(mod.Node(state="DRAIN", reason=text)))

    def resume(self, node: str) -> None:
        node = _check_node(node)
        mod = self.pyslurm
        try:
            self._call("Node.modify", lambda: mod.Node(node).modify(mod.Node(state="RESUME")))
        except SlurmCommandError as exc:
            if already_resumed(exc.output):
                return
            raise

    def reboot(self, node: str, reason: str) -> None:
        """pyslurm has no reboot API: ``scontrol reboot ASAP nextstate=RESUME ...``
        through ``CliSlurmClient`` (same argv, sanitising, retries and errors)."""
        self.command_client().reboot(node, reason)

    def reboot_and_hold(self, node: str, reason: str) -> None:
        self.command_client().reboot_and_hold(node, reason)

    # ---- return to service: through the command client (its argv, idempotency, error
    # texts), as on a site without pyslurm: one code path, tested on the mini-cluster.

    def reservations(self) -> list[Reservation]:
        return self.command_client().reservations()

    def create_reservation(self, node: str, *, duration_min: int, users: Sequence[str]) -> Reservation:
        return self.command_client().create_reservation(node, duration_min=duration_min, users=users)

    def delete_reservation(self, name: str) -> bool:
        return self.command_client().delete_reservation(name)

    def submit_validation(self, node: str, command: Sequence[str], *, reservation: str,
                          time_limit_min: int, output: str = "/dev/null") -> str:
        return self.command_client().submit_validation(
            node, command, reservation=reservation, time_limit_min=time_limit_min, output=output)

    def submit_idle_validation(self, node: str, command: Sequence[str], *, qos: str = "", partition: str = "",
                               time_limit_min: int, start_within_min: int) -> str:
        return self.command_client().submit_idle_validation(
            node, command, qos=qos, partition=partition, time_limit_min=time_limit_min,
            start_within_min=start_within_min)

    def all_jobs(self) -> list[JobInfo]:
        return self.command_client().all_jobs()

    def cancel_job(self, job_id: str) -> None:
        self.command_client().cancel_job(job_id)

    def command_client(self) -> CliSlurmClient:
        """The command client with this client's settings and deadline."""
        cli = CliSlurmClient(bin_dir=self.bin_dir, env=self.env, retries=self.retries,
                             retry_delay_s=self.retry_delay_s,
                             command_timeout_s=self.command_timeout_s, sleep=self._sleep)
        cli.deadline = self.deadline
        return cli

    # ----------------------------------------------------------------- jobs

    @staticmethod
    def _job_info(j: Any) -> JobInfo:
        nodes = expand_hostlist(getattr(j, "allocated_nodes", None))
        gpus: dict[str, tuple[int, ...]] = {}
        try:
            layout = j.get_resource_layout_per_node() or {}
        except Exception:
            layout = {}
        for node, res in layout.items():
            idx = _gpu_indices_from_layout(res.get("gres") if isinstance(res, Mapping) else None)
            if idx:
                gpus[str(node)] = idx
        reason = getattr(j, "state_reason", None)
        state = parse_job_state(getattr(j, "state", None))
        return JobInfo(
            job_id=str(j.id),
            state=state,
            user=getattr(j, "user_name", None) or None,
            nodes=nodes,
            gpus=gpus,
            batch_host=getattr(j, "batch_host", None) or None,
            restart_count=int(getattr(j, "requeue_count", 0) or 0),
            state_reason=None if reason in (None, "", "None") else str(reason),
            admin_comment=getattr(j, "admin_comment", None) or None,
            name=getattr(j, "name", None) or None,
            exit_code=_exit_code(getattr(j, "exit_code", None)),
            start_time=_epoch(getattr(j, "start_time", None)),
            end_time=ended_at(state, _epoch(getattr(j, "end_time", None))),
        )

    def jobs_on_node(self, node: str) -> list[JobInfo]:
        node = _check_node(node)
        jobs = self._call("Jobs.load", lambda: self.pyslurm.Jobs.load())
        out = []
        for j in jobs.values():
            info = self._job_info(j)
            if info.state in ACTIVE_JOB_STATES and node in info.nodes:
                out.append(info)
        return out

    def _job_num(self, job_id: str) -> int:
        jid = _check_job(job_id)
        if not jid.isdigit():
            raise SlurmError(f"pyslurm client needs a numeric job id, got {jid!r}")
        return int(jid)

    def job(self, job_id: str) -> JobInfo:
        num = self._job_num(job_id)
        try:
            j = self._call("Job.load", lambda: self.pyslurm.Job.load(num))
        except SlurmCommandError as exc:
            if "invalid job id" in exc.output.lower():
                raise JobGone(f"no such job: {num}") from exc
            raise
        return self._job_info(j)

    def signal_job(self, job_id: str, signal: str = "USR1", *, full: bool = False) -> None:
        num = self._job_num(job_id)
        sig = _signal_name(signal)
        steps = "all" if full else "batch"
        try:
            self._call("Job.send_signal",
                       lambda: self.pyslurm.Job(num).send_signal(sig, steps=steps))
        except ValueError as exc:  # pyslurm: "Invalid Signal"
            raise SlurmError(f"invalid signal: {signal!r}") from exc

    def requeue(self, job_id: str) -> None:
        num = self._job_num(job_id)
        self._call("Job.requeue", lambda: self.pyslurm.Job(num).requeue())

    def set_admin_comment(self, job_id: str, comment: str) -> None:
        num = self._job_num(job_id)
        text = sanitize_reason(comment, max_len=1024)
        mod = self.pyslurm
        self._call("Job.modify",
                   lambda: mod.Job(num).modify(mod.JobSubmitDescription(admin_comment=text)))
