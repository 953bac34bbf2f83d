"""What a doctor check says, what it is given, and the runner that bounds each check.

A check is a function ``(Context) -> Iterable[Finding]``. The runner runs each one in a
thread of its own with a time budget: a check that hangs (an NVML call on a sick GPU, a
stuck NFS mount under a hook path) becomes one FAIL line saying so, and a check that
raises becomes one FAIL line with the exception, never a traceback; the other checks
still run.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmgpu.config.load import LoadedConfig
    from slurmgpu.config.schema import Settings
    from slurmgpu.slurm.conf import SlurmConf

# Every wait inside a check (a subprocess, a socket, a handshake) is at most this long.
STEP_TIMEOUT_S = 3.0
# What the runner allows a check beyond its own waits before it gives up on it.
RUNNER_SLACK_S = 2.0

NODE, HEAD = "node", "head"
EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2
# The project-wide exit status for a bad config (`slurmgpu config check`, every command).
EXIT_CONFIG = 3


class Level(enum.Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"  # not applicable here (no collector configured, no GPUs on a head node)

    @property
    def exit_code(self) -> int:
        return {Level.WARN: EXIT_WARN, Level.FAIL: EXIT_FAIL}.get(self, EXIT_OK)


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    message: str
    fix: str = ""  # one line: what to run or change; empty when there is nothing to do

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.level.value, "message": self.message,
                "fix": self.fix or None}


def ok(check: str, message: str) -> Finding:
    return Finding(check, Level.OK, message)


def skip(check: str, message: str) -> Finding:
    return Finding(check, Level.SKIP, message)


def warn(check: str, message: str, fix: str) -> Finding:
    return Finding(check, Level.WARN, message, fix)


def fail(check: str, message: str, fix: str) -> Finding:
    return Finding(check, Level.FAIL, message, fix)


@dataclass
class Context:
    """What the checks share. Filled in by the command and by earlier checks (``loaded``
    by the config check, ``slurm_conf`` by the slurm.conf check, ``collector_reply`` by
    the collector check), so a later check never repeats an earlier one's work."""

    role: str  # NODE or HEAD
    role_reason: str
    node: str
    keys_dir: str
    config_file: str | None  # --config
    config_path: str  # the file actually read (or looked for)
    slurm_conf_file: str | None  # --slurm-conf
    environ: Mapping[str, str]
    loaded: LoadedConfig | None = None
    settings: Settings | None = None  # this node's effective settings; None: config invalid
    config_error: str | None = None
    slurm_conf: SlurmConf | None = None
    collector_reply: CollectorReply | None = None

    def configured(self, key: str) -> bool:
        """Whether the config file itself sets ``table.key`` (not only the default)."""
        if self.loaded is None:
            return False
        return any(row.key == key and row.source != "default" for row in self.loaded.explain(self.node))


@dataclass(frozen=True)
class CollectorReply:
    """The collector's first frame after this node's heartbeat."""

    ts: float  # the collector's clock when it sent the frame (envelope ts)
    received_at: float  # this host's clock when the frame arrived
    waited_s: float


CheckFunc = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    id: str
    func: CheckFunc
    # Seconds the runner waits for the check; its own waits are STEP_TIMEOUT_S each.
    budget_s: float | Callable[[Context], float] = STEP_TIMEOUT_S + RUNNER_SLACK_S
    # The fix printed when the check overran its budget.
    hung_fix: str = ("run that step by hand (docs/troubleshooting.md names each check's "
                     "command) to see where it hangs")

    def budget(self, ctx: Context) -> float:
        return self.budget_s(ctx) if callable(self.budget_s) else self.budget_s


def run_check(check: Check, ctx: Context) -> list[Finding]:
    """The check's findings; a crash or an overrun is one FAIL finding instead."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["findings"] = list(check.func(ctx))
        except Exception as exc:  # one broken check must not hide the others
            box["error"] = exc

    # A daemon thread: one that hangs in C (nvmlInit on a wedged GPU) is abandoned, and
    # does not keep the process alive after the report is printed.
    thread = threading.Thread(target=target, name=f"doctor-{check.id}", daemon=True)
    budget = check.budget(ctx)
    thread.start()
    thread.join(budget)
    if thread.is_alive():
        return [fail(check.id, f"did not finish within {budget:g} s (hung?)", check.hung_fix)]
    if "error" in box:
        exc = box["error"]
        return [fail(check.id, f"check crashed: {type(exc).__name__}: {exc}",
                     "a slurmgpu bug: report it with this line (`slurmgpu doctor --json`)")]
    return box["findings"] or [ok(check.id, "ok")]


def run_all(checks: Iterable[Check], ctx: Context) -> list[Finding]:
    """Every check in order: later ones read what earlier ones left in ``ctx``."""
    findings: list[Finding] = []
    for check in checks:
        findings.extend(run_check(check, ctx))
    return findings


def exit_code(findings: Iterable[Finding], ctx: Context) -> int:
    """0 all OK/SKIP, 1 a WARN, 2 a FAIL; 3 when the config is invalid (every command's
    status for a bad config: the checks that need it could not run)."""
    if ctx.config_error is not None:
        return EXIT_CONFIG
    return max((f.level.exit_code for f in findings), default=EXIT_OK)
