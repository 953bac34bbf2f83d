"""What both ``SlurmClient`` implementations share: where the Slurm tools are, the
caller's environment, and how often and how patiently to retry slurmctld; for a hook,
a deadline that no try or pause goes past (``within``). Also what every command-line
call shares: the argument checks, ``scontrol -o`` records, the definite-error type."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Self, TypedDict

from slurmgpu.slurm import SlurmError

if TYPE_CHECKING:
    from slurmgpu.config.schema import SlurmSettings


class ClientOptions(TypedDict, total=False):
    """The keyword arguments every client takes (defaults: ``ClientBase.__init__``)."""

    bin_dir: str | None
    env: Mapping[str, str] | None
    retries: int
    retry_delay_s: float
    command_timeout_s: float
    sleep: Callable[[float], object]


#: The shortest try a deadline leaves a Slurm command (the first try always runs).
MIN_TRY_S = 0.05


class ClientBase:
    """Retry settings, normalised: at least one try, no negative delay."""

    env: dict[str, str]
    #: time.monotonic() past which no try runs nor pause waits (None: no bound).
    deadline: float | None = None

    def __init__(
        self,
        *,
        bin_dir: str | None = None,
        env: Mapping[str, str] | None = None,
        retries: int = 3,
        retry_delay_s: float = 1.0,
        command_timeout_s: float = 10.0,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.bin_dir = bin_dir
        self.env = dict(env or {})
        self.retries = max(1, int(retries))
        self.retry_delay_s = max(0.0, float(retry_delay_s))
        self.command_timeout_s = float(command_timeout_s)
        self._sleep = sleep

    @classmethod
    def from_settings(cls, settings: SlurmSettings, env: Mapping[str, str] | None = None) -> Self:
        return cls(
            bin_dir=settings.bin_dir,
            env=env,
            retries=settings.retries,
            retry_delay_s=settings.retry_delay_s,
            command_timeout_s=settings.command_timeout_s,
        )

    def within(self, seconds: float) -> Self:
        """Bound every later call, its tries and pauses together, to ``seconds`` from now
        (a hook's share of its watchdog): each try's timeout is cut to what is left, and
        no retry starts that could not end in time."""
        self.deadline = time.monotonic() + max(MIN_TRY_S, seconds)
        return self

    def try_timeout(self) -> float:
        """The timeout of the next try: ``command_timeout_s``, cut to the deadline."""
        if self.deadline is None:
            return self.command_timeout_s
        return max(MIN_TRY_S, min(self.command_timeout_s, self.deadline - time.monotonic()))

    def may_retry(self, attempt: int) -> bool:
        """Whether try ``attempt`` + 1 runs: tries are left and, with a deadline, the pause
        and a minimal try still fit before it."""
        if attempt >= self.retries:
            return False
        return self.deadline is None or time.monotonic() + self.retry_delay_s + MIN_TRY_S < self.deadline


# --------------------------------------------------------------------------- commands

_BAD_NODE_NAME = re.compile(r"[\s,\[\]=\x00-\x1f\x7f]")
_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
# Keys in `scontrol -o` output start with an upper-case letter and follow a space.
_TEXT_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_:/]*)=")


def expand_hostlist(expr: str | None) -> tuple[str, ...]:
    """``gpu-n[1-2],cpu1`` -> ("gpu-n1", "gpu-n2", "cpu1"); "" / "(null)" -> ()."""
    if not expr or expr in ("(null)", "None", "N/A"):
        return ()
    from ClusterShell.NodeSet import NodeSet

    return tuple(str(n) for n in NodeSet(expr))


def text_pairs(line: str) -> list[tuple[str, str]]:
    """``Key=value`` pairs of one ``scontrol -o`` record, in order (keys may repeat:
    ``Nodes=``/``GRES=`` per node group). A value runs to the next ``Key=``, so
    values with spaces (``OS=Linux 6.1 #1 SMP``) survive."""
    matches = list(_TEXT_KEY.finditer(line))
    out = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.append((m.group(1), line[m.end():end].strip()))
    return out


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero with a definite answer (not retried)."""

    def __init__(self, message: str, *, output: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.output = output
        self.returncode = returncode


def _first_line(*texts: str) -> str:
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return ""


def _check_node(name: str) -> str:
    if not isinstance(name, str) or not name or name.startswith("-") or _BAD_NODE_NAME.search(name):
        raise SlurmError(f"invalid node name: {name!r}")
    return name


def _check_job(job_id: str | int) -> str:
    jid = str(job_id).strip()
    if not _JOB_ID.match(jid):
        raise SlurmError(f"invalid job id: {job_id!r}")
    return jid
