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
        self.message = message
        where = path or "<config>"
        if line is not None:
            where = f"{where}:{line}"
        if key:
            where = f"{where}: {key}"
        super().__init__(f"{where}: {message}")


class ConfigErrors(ConfigError):
    """Every problem of one config file (``errors``, in file order): as one line, the
    first and how many more."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        self.errors = errors
        more = len(errors) - 1
        super().__init__(f"{first.message}{f' (and {more} more: slurmgpu config check lists them)' if more else ''}",
                         path=first.path, key=first.key, line=first.line)


class UsageError(SlurmGpuError):
    """A bad command-line argument."""


class SimError(SlurmGpuError):
    """The GPU simulator could not be built or a scenario is invalid."""


class WireError(SlurmGpuError):
    """A frame that is not a valid message (too big, not msgpack, bad version/fields).
    (``slurmgpu.wire.WireError``.)"""
