"""``SlurmClient`` over the command-line tools: scontrol, scancel, squeue, sinfo.

Commands are argv lists (never a shell), so reasons and comments with quotes,
``;`` or ``$(...)`` reach Slurm verbatim. JSON is used where the running Slurm
has it and text is the fallback:

* Slurm >= 23.02: ``scontrol show node NAME --json`` / ``scontrol show job ID --json``
  (data_parser shapes: ``"state": ["IDLE", "DRAIN"]``, numbers as
  ``{"set": true, "number": N}``).
* Slurm 22.05: ``sinfo --json`` and ``squeue --json`` (openapi v0.0.38 shapes:
  ``"state": "idle", "state_flags": ["DRAIN"]``). Both ignore their filters, so
  the filtering happens here.
* Text: ``scontrol -o show node NAME`` and ``scontrol -o show job -d ID``.

A slurmctld that does not answer is retried ``retries`` times (in total) with
``retry_delay_s`` between tries, then ``SlurmUnreachable`` is raised. A definite
rejection (bad node name, invalid job id...) is never retried.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

from slurmgpu.slurm import JobGone, JobInfo, NodeState, SlurmError, SlurmUnreachable, ended_at
from slurmgpu.slurm.common import (
    ClientBase,
    ClientOptions,
    SlurmCommandError,
    _check_job,
    _check_node,
    _first_line,
    expand_hostlist,
    text_pairs,
)
from slurmgpu.slurm.reservations import ReturnToServiceCalls
from slurmgpu.slurm.versions import (
    already_resumed,
    legacy_json,
    parse_version,
    reason_applies,
    scontrol_json,
)

# runner(argv, env, timeout_s) -> CompletedProcess; raises subprocess.TimeoutExpired
# on timeout and OSError when the binary cannot be executed.
Runner = Callable[[Sequence[str], Mapping[str, str], float], "subprocess.CompletedProcess[str]"]

FALLBACK_BIN_DIR = "/usr/bin"

# Output that means "slurmctld did not answer" (retry), as opposed to a rejection.
UNREACHABLE_PATTERNS: tuple[str, ...] = (
    "unable to contact slurm controller",
    "slurm backup controller in standby mode",
    "socket timed out",
    "transport endpoint is not connected",
    "connection refused",
    "communication connection failure",
    "zero bytes were transmitted or received",
    # `scontrol requeue` reports a connect failure as this (22.05, measured).
    "unexpected message received",
)

ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})

_NODE_BASE_STATES = frozenset({
    "unknown", "down", "idle", "allocated", "error", "mixed", "future", "end",
})
_NODE_BASE_ALIASES = {"alloc": "allocated", "mix": "mixed", "unk": "unknown", "fail": "down"}
# Old-style combined names (node_state_string without "_complete").
_NODE_BASE_COMBINED = {
    "drained": ("idle", "DRAIN"),
    "drain": ("idle", "DRAIN"),
    "draining": ("mixed", "DRAIN"),
    "drng": ("mixed", "DRAIN"),
    "completing": ("idle", "COMPLETING"),
}
# sinfo/scontrol suffix characters on a base state.
_NODE_STATE_SUFFIXES = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "$": "MAINTENANCE",
    "-": "PLANNED",
}
_JOB_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})

_SIGNAL = re.compile(r"^[A-Za-z0-9]{1,16}$")


# --------------------------------------------------------------------------- sanitising


def sanitize_reason(text: str, max_len: int = 256) -> str:
    """One printable line for a node reason or job comment.

    Newlines, tabs and every other control/format/separator character become a
    space, runs of whitespace collapse to one, the ends are stripped and the
    result is capped at ``max_len`` characters (ending in "…" when cut). Never
    empty. Quotes, ``;`` and ``$`` are kept: commands are argv lists, no shell.
    """
    max_len = max(2, max_len)
    chars = []
    for ch in str(text):
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp") or ch.isspace():
            chars.append(" ")
        else:
            chars.append(ch)
    out = " ".join("".join(chars).split())
    if not out:
        return "no reason given"
    if len(out) > max_len:
        out = out[: max_len - 1].rstrip() + "…"
    return out


# --------------------------------------------------------------------------- parsers


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0,2,5-7`` -> (0, 2, 5, 6, 7). Anything unparsable (``N/A``) -> ()."""
    out: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            continue
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        out.extend(range(lo, hi + 1))
    return tuple(sorted(set(out)))


_GRES_GPU_IDX = re.compile(r"(?:^|,)\s*(?:gres[:/])?gpu(?::[^,(]*)?\(IDX:([^)]*)\)")


def parse_gres_gpu_indices(gres: str | None) -> tuple[int, ...]:
    """GPU indices from a GRES detail string: ``gpu:3(IDX:0-2)``, ``gpu(IDX:0,2,5-7)``,
    ``gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3)`` -> sorted indices; no IDX -> ()."""
    out: set[int] = set()
    for m in _GRES_GPU_IDX.finditer(gres or ""):
        out.update(parse_index_list(m.group(1)))
    return tuple(sorted(out))


def parse_node_state(state: str | Iterable[str], flags: Iterable[str] = ()) -> tuple[str, frozenset[str]]:
    """Base state (lower case) and flags (upper case) from any shape Slurm prints.

    ``"IDLE+DRAIN"`` -> ("idle", {"DRAIN"}); ``"DOWN*"`` -> ("down", {"NOT_RESPONDING"});
    ``["IDLE", "DRAIN"]`` (>= 23.02 JSON); ``"idle"`` + ``["DRAIN"]`` (22.05 JSON).
    """
    tokens: list[str] = []
    if isinstance(state, str):
        tokens = [t for t in state.split("+") if t]
    else:
        tokens = [str(t) for t in state if t]
    tokens.extend(str(f) for f in flags if f)
    out_flags: set[str] = set()
    base: str | None = None
    for raw in tokens:
        tok = raw.strip()
        while tok and tok[-1] in _NODE_STATE_SUFFIXES:
            out_flags.add(_NODE_STATE_SUFFIXES[tok[-1]])
            tok = tok[:-1]
        low = tok.lower()
        low = _NODE_BASE_ALIASES.get(low, low)
        if base is None and low in _NODE_BASE_STATES:
            base = low
        elif base is None and low in _NODE_BASE_COMBINED:
            base, flag = _NODE_BASE_COMBINED[low]
            out_flags.add(flag)
        elif tok:
            out_flags.add(tok.upper())
    if base is None:
        base = "unknown"
    return base, frozenset(out_flags)


def parse_job_state(state: str | Iterable[str] | None) -> str:
    """``"RUNNING"`` (22.05) or ``["COMPLETED", "COMPLETING"]`` (>= 23.02) -> one
    upper-case name; the COMPLETING flag wins, as in ``job_state_string``."""
    if state is None:
        return "UNKNOWN"
    tokens = [state] if isinstance(state, str) else [str(s) for s in state]
    tokens = [t.upper() for t in tokens if t]
    if "COMPLETING" in tokens:
        return "COMPLETING"
    for t in tokens:
        if t in _JOB_BASE_STATES:
            return t
    return tokens[0] if tokens else "UNKNOWN"


def _num(value: Any) -> float | None:
    """A number from 22.05 (plain) or >= 23.02 (``{"set": bool, "infinite": bool,
    "number": N}``) JSON; unset/infinite -> None."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    s = str(value)
    return s if s and s not in ("(null)", "N/A") else None


def _job_reason(value: Any) -> str | None:
    """A job's pending/state reason; Slurm's "None" means there is none."""
    s = _str_or_none(value)
    return None if s in (None, "None") else s


def parse_node_json(obj: Mapping[str, Any]) -> NodeState:
    """One node from ``sinfo --json`` (22.05) or ``scontrol show node --json`` (>= 23.02)."""
    flags_in = obj.get("state_flags") or ()
    state, flags = parse_node_state(obj.get("state") or "unknown", flags_in)
    reason = _str_or_none(obj.get("reason")) if reason_applies(state, flags) else None
    when = _num(obj.get("reason_changed_at"))
    return NodeState(
        name=str(obj.get("name") or obj.get("hostname") or ""),
        state=state,
        flags=flags,
        reason=reason,
        reason_user=_str_or_none(obj.get("reason_set_by_user")) if reason else None,
        reason_time=when if reason and when else None,
    )


def json_errors(doc: Mapping[str, Any]) -> list[str]:
    """The ``errors`` array of a Slurm JSON document, as strings."""
    out = []
    for err in doc.get("errors") or ():
        if isinstance(err, Mapping):
            out.append(str(err.get("description") or err.get("error") or err))
        else:
            out.append(str(err))
    return out


def parse_nodes_json(doc: Mapping[str, Any]) -> list[NodeState]:
    """Every node of a JSON document (``{"nodes": [...]}``); duplicates dropped."""
    seen: dict[str, NodeState] = {}
    for obj in doc.get("nodes") or ():
        if isinstance(obj, Mapping):
            node = parse_node_json(obj)
            seen.setdefault(node.name, node)
    return list(seen.values())


def _job_node_order(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """Node names in allocation order (the order of ``gres_detail``)."""
    jr = obj.get("job_resources")
    if isinstance(jr, Mapping):
        # 22.05 / v0.0.40: allocated_nodes[].nodename
        alloc = jr.get("allocated_nodes")
        if isinstance(alloc, list) and alloc:
            names = [a.get("nodename") for a in alloc if isinstance(a, Mapping)]
            if all(names):
                return tuple(str(n) for n in names)
        # v0.0.41+: nodes: {list, allocation: [{name}]}
        nodes = jr.get("nodes")
        if isinstance(nodes, Mapping):
            alloc = nodes.get("allocation")
            if isinstance(alloc, list) and alloc:
                names = [a.get("name") for a in alloc if isinstance(a, Mapping)]
                if all(names):
                    return tuple(str(n) for n in names)
            if isinstance(nodes.get("list"), str):
                return expand_hostlist(nodes["list"])
    return expand_hostlist(obj.get("nodes") if isinstance(obj.get("nodes"), str) else None)


def parse_job_json(obj: Mapping[str, Any]) -> JobInfo:
    """One job from ``squeue --json`` (22.05) or ``scontrol show job --json`` (>= 23.02)."""
    nodes = _job_node_order(obj)
    gpus: dict[str, tuple[int, ...]] = {}
    detail = obj.get("gres_detail") or []
    if isinstance(detail, str):
        detail = [detail]
    for node, gres in zip(nodes, detail, strict=False):
        idx = parse_gres_gpu_indices(str(gres))
        if idx:
            gpus[node] = idx
    restarts = _num(obj.get("restart_cnt"))
    state = parse_job_state(obj.get("job_state"))
    return JobInfo(
        job_id=str(obj.get("job_id")),
        state=state,
        user=_str_or_none(obj.get("user_name")),
        nodes=nodes,
        gpus=gpus,
        batch_host=_str_or_none(obj.get("batch_host")),
        restart_count=int(restarts or 0),
        state_reason=_job_reason(obj.get("state_reason")),
        admin_comment=_str_or_none(obj.get("admin_comment")),
        name=_str_or_none(obj.get("name")),
        exit_code=_json_exit_code(obj.get("exit_code")),
        start_time=_epoch(obj.get("start_time")),
        end_time=ended_at(state, _epoch(obj.get("end_time"))),
    )


def _epoch(value: Any) -> float | None:
    """A JSON time (a number, or ``{"set", "number"}``); 0 (not yet) reads None."""
    number = _num(value)
    return float(number) if number else None


def _text_time(value: str | None) -> float | None:
    """``2026-11-28T02:00:00`` (scontrol's local time); ``Unknown``, ``None`` read None."""
    try:
        return time.mktime(time.strptime(value or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _json_exit_code(value: Any) -> int | None:
    """22.05: the raw wait status (exit 3 reads 768, measured); >= 23.02:
    ``{"status": [...], "return_code": {number}}``. A signal's death reads 128 + signal."""
    if isinstance(value, Mapping):
        number = _num(value.get("return_code"))
        return int(number) if number is not None else None
    number = _num(value)
    if number is None:
        return None
    status = int(number)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _job_json_matches(obj: Mapping[str, Any], job_id: str) -> bool:
    if str(obj.get("job_id")) == job_id:
        return True
    if "_" in job_id:
        arr, task = job_id.split("_", 1)
        arr_id, task_id = _num(obj.get("array_job_id")), _num(obj.get("array_task_id"))
        return (arr_id is not None and task_id is not None
                and (int(arr_id), int(task_id)) == (int(arr), int(task)))
    return False


_REASON_WITH_STAMP = re.compile(
    r"(?:^|\s)Reason=(.*?) \[([^\[\]@\s]*)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\](?=\s|$)"
)
_REASON_BARE = re.compile(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Z][A-Za-z0-9_:/]*=|\s*$)")


def _parse_slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_node_text(line: str) -> NodeState:
    """One line of ``scontrol -o show node``. ``Reason=`` is taken out first: it
    may hold spaces and ``=`` and ends with `` [user@time]``."""
    reason = user = None
    when: float | None = None
    m = _REASON_WITH_STAMP.search(line)
    if m:
        reason, user, when = m.group(1), m.group(2) or None, _parse_slurm_time(m.group(3))
        line = line[: m.start()] + " " + line[m.end():]
    else:
        m = _REASON_BARE.search(line)
        if m:
            reason = m.group(1)
            line = line[: m.start()] + " " + line[m.end():]
    first: dict[str, str] = {}
    for k, v in text_pairs(line):
        first.setdefault(k, v)
    state, flags = parse_node_state(first.get("State", "UNKNOWN"))
    reason = _str_or_none(reason.strip()) if reason and reason_applies(state, flags) else None
    return NodeState(
        name=first.get("NodeName", ""),
        state=state,
        flags=flags,
        reason=reason,
        reason_user=user if reason else None,
        reason_time=when if reason else None,
    )


def parse_nodes_text(text: str) -> list[NodeState]:
    return [parse_node_text(line) for line in text.splitlines() if line.startswith("NodeName=")]


def parse_job_text(line: str) -> JobInfo:
    """One line of ``scontrol -o show job -d``. GPU indices come from the detail
    groups ``Nodes=gpu-n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)``.

    Free-text values (JobName, Comment, AdminComment) that themselves contain
    ``Key=`` can confuse text parsing; JSON is preferred wherever Slurm has it.
    """
    pairs = text_pairs(line)
    first: dict[str, str] = {}
    for k, v in pairs:
        first.setdefault(k, v)
    gpus: dict[str, tuple[int, ...]] = {}
    group: tuple[str, ...] = ()
    for k, v in pairs:
        if k == "Nodes":
            group = expand_hostlist(v)
        elif k == "GRES" and group:
            idx = parse_gres_gpu_indices(v)
            if idx:
                for node in group:
                    gpus[node] = idx
            group = ()
    user = first.get("UserId")
    if user:
        user = user.split("(", 1)[0] or None
    try:
        restarts = int(first.get("Restarts", "0"))
    except ValueError:
        restarts = 0
    state = parse_job_state(first.get("JobState"))
    return JobInfo(
        job_id=first.get("JobId", ""),
        state=state,
        user=user,
        nodes=expand_hostlist(first.get("NodeList")),
        gpus=gpus,
        batch_host=_str_or_none(first.get("BatchHost")),
        restart_count=restarts,
        state_reason=_job_reason(first.get("Reason")),
        admin_comment=_str_or_none(first.get("AdminComment")),
        name=_str_or_none(first.get("JobName")),
        exit_code=_text_exit_code(first.get("ExitCode")),
        start_time=_text_time(first.get("StartTime")),
        end_time=ended_at(state, _text_time(first.get("EndTime"))),
    )


def _text_exit_code(value: str | None) -> int | None:
    """``ExitCode=2:0`` (status:signal) -> 2; ``0:9`` (killed) -> 137."""
    m = re.match(r"(\d+):(\d+)$", value or "")
    if not m:
        return None
    return 128 + int(m.group(2)) if int(m.group(2)) else int(m.group(1))


def parse_jobs_text(text: str) -> list[JobInfo]:
    return [parse_job_text(line) for line in text.splitlines() if line.startswith("JobId=")]


# --------------------------------------------------------------------------- errors


def is_unreachable(output: str) -> bool:
    low = output.lower()
    return any(p in low for p in UNREACHABLE_PATTERNS)


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return ""


def _label(argv: Sequence[str]) -> str:
    name = os.path.basename(argv[0]) if argv else "?"
    if name == "scontrol":
        words = [a for a in argv[1:] if not a.startswith("-")][:2]
        if words and words[0] != "show":
            words = words[:1]
        return " ".join([name, *words])
    return name


def _default_runner(
    argv: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env=dict(env), capture_output=True, text=True, errors="replace",
        timeout=timeout, stdin=subprocess.DEVNULL, check=False,
    )


def _no_reboot_program(node: str, exc: SlurmCommandError) -> SlurmCommandError | None:
    """The clear error for a reboot refused for want of a RebootProgram, else None."""
    if "rebootprogram" not in exc.output.lower():
        return None
    return SlurmCommandError(
        f"cannot reboot {node}: Slurm has no RebootProgram configured "
        f"(slurm.conf RebootProgram=...): {_first_line(exc.output)}",
        output=exc.output, returncode=exc.returncode)


# --------------------------------------------------------------------------- client


class CliSlurmClient(ClientBase, ReturnToServiceCalls):
    """``SlurmClient`` backed by scontrol/scancel/squeue/sinfo."""

    def __init__(self, *, runner: Runner | None = None, **options: Unpack[ClientOptions]) -> None:
        super().__init__(**options)
        self._runner: Runner = runner or _default_runner
        merged = dict(os.environ)
        env = options.get("env")
        if env is not None:
            merged.update(env)
        # Timestamps in text output: ISO 8601, whatever the caller's environment says.
        merged["SLURM_TIME_FORMAT"] = "standard"
        self.env = merged
        self._bins: dict[str, str] = {}
        self._version: tuple[int, int] | None = None
        self._json_broken: set[str] = set()

    # ----------------------------------------------------------------- plumbing

    def binary(self, name: str) -> str:
        """Absolute path of a Slurm tool: bin_dir, else PATH, else /usr/bin."""
        if name not in self._bins:
            found = None
            if self.bin_dir:
                cand = os.path.join(self.bin_dir, name)
                if os.access(cand, os.X_OK):
                    found = cand
            if found is None and self.env.get("PATH"):
                found = shutil.which(name, path=self.env["PATH"])
            self._bins[name] = found or os.path.join(FALLBACK_BIN_DIR, name)
        return self._bins[name]

    def run(self, tool: str, *args: str, tries: int | None = None) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command, retrying while slurmctld does not answer.

        Returns the finished process (exit 0). Raises ``SlurmUnreachable`` after
        ``retries`` tries (or ``tries``, when fewer) and ``SlurmCommandError`` (a
        ``SlurmError``) at once for any other failure.
        """
        argv = [self.binary(tool), *args]
        label = _label(argv)
        last = ""
        for attempt in range(1, self.retries + 1):
            timeout = self.try_timeout()
            try:
                cp = self._runner(argv, self.env, timeout)
            except subprocess.TimeoutExpired:
                last = f"{label} timed out after {timeout:g}s"
            except OSError as exc:
                raise SlurmCommandError(f"{label}: cannot run {argv[0]}: {exc}") from exc
            else:
                if cp.returncode == 0:
                    return cp
                out = f"{cp.stderr or ''}\n{cp.stdout or ''}"
                if not is_unreachable(out):
                    line = _first_line(cp.stderr, cp.stdout) or f"exit status {cp.returncode}"
                    raise SlurmCommandError(f"{label}: {line}", output=out, returncode=cp.returncode)
                last = _last_line(cp.stderr, cp.stdout)
            if (tries is not None and attempt >= tries) or not self.may_retry(attempt):
                break
            self._log_retry(label, attempt, last)
            self._sleep(self.retry_delay_s)
        raise SlurmUnreachable(f"slurmctld unreachable after {attempt} tries: {last}")

    def _log_retry(self, label: str, attempt: int, last: str) -> None:
        from slurmgpu.log import get_logger

        get_logger(component="slurm").warning(
            "slurm.retry", command=label, attempt=attempt, tries=self.retries,
            delay_s=self.retry_delay_s, error=last,
        )

    def version(self) -> tuple[int, int] | None:
        """(major, minor) from ``scontrol --version``, detected once; None if unknown."""
        if self._version is None:
            try:
                cp = self._runner([self.binary("scontrol"), "--version"], self.env,
                                  self.try_timeout())
            except (OSError, subprocess.TimeoutExpired):
                return None
            if cp.returncode == 0:
                self._version = parse_version(cp.stdout)
        return self._version

    def _json(self, key: str, tool: str, *args: str) -> dict[str, Any] | None:
        """A JSON document, or None when this JSON command is unavailable, failed
        (other than slurmctld unreachable) or reported errors: use text then."""
        if key in self._json_broken:
            return None
        try:
            cp = self.run(tool, *args)
        except SlurmUnreachable:
            raise
        except SlurmCommandError as exc:
            out = exc.output.lower()
            if "unrecognized option" in out or "plugin" in out or "invalid option" in out:
                self._json_broken.add(key)
            return None
        try:
            doc = json.loads(cp.stdout)
        except ValueError:
            self._json_broken.add(key)
            return None
        if not isinstance(doc, dict) or json_errors(doc):
            # 22.05 sinfo/squeue --json exit 0 with {"errors": [...]} when slurmctld
            # is unreachable: the text path then detects that (and retries).
            return None
        return doc

    def controller_version(self) -> tuple[int, int] | None:
        """(major, minor) of the slurmctld this client talks to (``SLURM_VERSION`` of
        ``scontrol show config``, which the controller fills in); None if it has none."""
        for line in self.run("scontrol", "show", "config").stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "SLURM_VERSION":
                return parse_version(value)
        return None

    def _scontrol_json(self) -> bool:
        return scontrol_json(self.version())

    def _legacy_json(self) -> bool:
        return legacy_json(self.version())

    # ----------------------------------------------------------------- nodes

    def node(self, name: str) -> NodeState:
        name = _check_node(name)
        doc = None
        if self._scontrol_json():
            doc = self._json("scontrol-node", "scontrol", "show", "node", name, "--json")
        elif self._legacy_json():
            doc = self._json("sinfo", "sinfo", "--all", "--json")
        if doc is not None:
            for node in parse_nodes_json(doc):
                if node.name == name:
                    return node
        return self._node_text(name)

    def _node_text(self, name: str) -> NodeState:
        try:
            cp = self.run("scontrol", "-o", "show", "node", name)
        except SlurmCommandError as exc:
            if "not found" in exc.output.lower() or "invalid node name" in exc.output.lower():
                raise SlurmError(f"no such node: {name}") from exc
            raise
        for node in parse_nodes_text(cp.stdout):
            if node.name == name:
                return node
        raise SlurmError(f"no such node: {name}")

    def nodes(self) -> list[NodeState]:
        doc = None
        if self._scontrol_json():
            doc = self._json("scontrol-node", "scontrol", "show", "node", "--json")
        elif self._legacy_json():
            doc = self._json("sinfo", "sinfo", "--all", "--json")
        if doc is not None:
            nodes = parse_nodes_json(doc)
            if nodes:
                return nodes
        return parse_nodes_text(self.run("scontrol", "-o", "show", "node").stdout)

    def drain(self, node: str, reason: str) -> None:
        node = _check_node(node)
        self.run("scontrol", "update", f"nodename={node}", "state=drain",
                 f"reason={sanitize_reason(reason)}")

    def resume(self, node: str) -> None:
        node = _check_node(node)
        try:
            self.run("scontrol", "update", f"nodename={node}", "state=resume")
        except SlurmCommandError as exc:
            if already_resumed(exc.output):
                return  # not drained/down: already resumed
            raise

    def reboot(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=RESUME reason=... NODE``.

        Slurm 22.05 without a ``RebootProgram`` refuses (exit 1, measured):
        ``scontrol: error: RebootProgram isn't defined`` /
        ``scontrol_reboot_nodes error: Unspecified error``; that becomes a
        ``SlurmCommandError`` naming the missing setting. With one, an idle node
        shows ``IDLE+DRAIN+REBOOT_REQUESTED``, then ``DOWN+DRAIN+REBOOT_ISSUED``
        with ``" : reboot issued"`` appended to the reason.
        """
        self._reboot(node, reason, "RESUME")

    def reboot_and_hold(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=DOWN reason=... NODE``. 22.05 refuses
        ``nextstate=DRAIN`` ("Invalid state: DRAIN / Valid states: DOWN, RESUME", measured);
        after the boot the node is DOWN with ``" : reboot issued : reboot complete"``
        appended to the reason, and takes jobs only once resumed."""
        self._reboot(node, reason, "DOWN")

    def _reboot(self, node: str, reason: str, next_state: str) -> None:
        node = _check_node(node)
        try:
            self.run("scontrol", "reboot", "ASAP", f"nextstate={next_state}",
                     f"reason={sanitize_reason(reason)}", node)
        except SlurmCommandError as exc:
            clear = _no_reboot_program(node, exc)
            if clear is None:
                raise
            raise clear from exc

    # ----------------------------------------------------------------- jobs

    def _jobs_json(self, node: str | None = None) -> list[JobInfo] | None:
        if self._scontrol_json():
            args = ["--all", "--json"]
            if node:
                args += ["--nodelist", node]
            doc = self._json("squeue", "squeue", *args)
        elif self._legacy_json():
            doc = self._json("squeue", "squeue", "--all", "--json")
        else:
            return None
        if doc is None:
            return None
        return [parse_job_json(j) for j in doc.get("jobs") or () if isinstance(j, Mapping)]

    def jobs_on_node(self, node: str) -> list[JobInfo]:
        node = _check_node(node)
        jobs = self._jobs_json(node)
        if jobs is None:
            jobs = parse_jobs_text(self.run("scontrol", "-o", "show", "job", "-d").stdout)
        return [j for j in jobs if j.state in ACTIVE_JOB_STATES and node in j.nodes]

    def job(self, job_id: str) -> JobInfo:
        jid = _check_job(job_id)
        doc = None
        if self._scontrol_json():
            doc = self._json("scontrol-job", "scontrol", "show", "job", jid, "--json")
        elif self._legacy_json():
            doc = self._json("squeue", "squeue", "--all", "--json")
        if doc is not None:
            for obj in doc.get("jobs") or ():
                if isinstance(obj, Mapping) and _job_json_matches(obj, jid):
                    return parse_job_json(obj)
        try:
            cp = self.run("scontrol", "-o", "show", "job", "-d", jid)
        except SlurmCommandError as exc:
            if "invalid job id" in exc.output.lower():
                raise JobGone(f"no such job: {jid}") from exc
            raise
        jobs = parse_jobs_text(cp.stdout)
        if not jobs:
            raise JobGone(f"no such job: {jid}")
        return jobs[0]

    def all_jobs(self) -> list[JobInfo]:
        jobs = self._jobs_json()
        if jobs is None:
            jobs = parse_jobs_text(self.run("scontrol", "-o", "show", "job", "-d").stdout)
        return jobs

    def signal_job(self, job_id: str, signal: str = "USR1", *, full: bool = False) -> None:
        jid = _check_job(job_id)
        if not _SIGNAL.match(str(signal)):
            raise SlurmError(f"invalid signal: {signal!r}")
        self.run("scancel", f"--signal={signal}", "--full" if full else "--batch", jid)

    def requeue(self, job_id: str) -> None:
        self.run("scontrol", "requeue", _check_job(job_id))

    def set_admin_comment(self, job_id: str, comment: str) -> None:
        jid = _check_job(job_id)
        self.run("scontrol", "update", f"jobid={jid}",
                 f"AdminComment={sanitize_reason(comment, max_len=1024)}")
