"""What both ``SlurmClient`` implementations share: where the Slurm tools are, the
caller's environment, and how often and how patiently to retry slurmctld."""

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


class ClientBase:
    """Retry settings, normalised: at least one try, no negative delay."""

    env: dict[str, str]

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
