"""What both ``SlurmClient`` implementations share: where the Slurm tools are, the
caller's environment, and how often and how patiently to retry slurmctld; for a hook,
a deadline that no try or pause goes past (``within``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Self, TypedDict

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
