"""One exception hierarchy. A bad GPU is a Finding, never an exception."""

from __future__ import annotations


class SlurmGpuError(Exception):
    """Base of every error slurmgpu raises on purpose."""


class ConfigError(SlurmGpuError):
    """A configuration file is missing, unreadable or invalid.

    The message is one line naming the file, the key path and (where known) the line.
    """

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        self.path = path
        self.key = key
        self.line = line
        where = path or "<config>"
        if line is not None:
            where = f"{where}:{line}"
        if key:
            where = f"{where}: {key}"
        super().__init__(f"{where}: {message}")


class UsageError(SlurmGpuError):
    """A bad command-line argument."""


class SimError(SlurmGpuError):
    """The GPU simulator could not be built or a scenario is invalid."""


class WireError(SlurmGpuError):
    """A frame that is not a valid message (too big, not msgpack, bad version/fields).
    (``slurmgpu.wire.WireError``.)"""
