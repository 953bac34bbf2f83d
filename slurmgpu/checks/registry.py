"""The one registry of checks.

A check is a small pure function over ``CheckContext`` registered with
``@check(id, ...)``. It returns findings; the runner stamps the check id on
them, turns an exception into one UNKNOWN finding, and adds an OK finding
when a check had nothing to say. Check ids are stable: configs, policies and
history refer to them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.config.schema import Settings
from slurmgpu.facts import GpuFacts, NodeFacts
from slurmgpu.result import Finding, Severity
from slurmgpu.xid import XidPolicy


@dataclass(frozen=True)
class CheckContext:
    facts: NodeFacts
    settings: Settings
    xid_policy: XidPolicy
    # NVML indices of the GPUs this run is about (a job's GPUs), or None for all.
    scope: frozenset[int] | None = None

    def gpus(self) -> list[GpuFacts]:
        """GPUs in scope, including lost ones."""
        return [g for g in self.facts.gpus if self.scope is None or g.index in self.scope]

    def live_gpus(self) -> list[GpuFacts]:
        """GPUs in scope that answered NVML; ``gpu.lost`` reports the others."""
        return [g for g in self.gpus() if not g.lost]


CheckFunc = Callable[[CheckContext], Iterable[Finding]]


@dataclass(frozen=True)
class CheckSpec:
    id: str
    func: CheckFunc = field(compare=False)
    # The worst severity this check raises with default settings.
    severity: Severity
    # Which facts it reads, for `slurmgpu checks list`.
    reads: tuple[str, ...]
    summary: str


_REGISTRY: dict[str, CheckSpec] = {}


def check(check_id: str, *, severity: Severity, reads: Iterable[str], summary: str
          ) -> Callable[[CheckFunc], CheckFunc]:
    def register(func: CheckFunc) -> CheckFunc:
        if check_id in _REGISTRY:
            raise RuntimeError(f"check {check_id!r} registered twice")
        _REGISTRY[check_id] = CheckSpec(check_id, func, severity, tuple(reads), summary)
        return func
    return register


def all_checks() -> list[CheckSpec]:
    import slurmgpu.checks  # noqa: F401  (imports every check module, filling the registry)

    return sorted(_REGISTRY.values(), key=lambda s: s.id)


def enabled_checks(disabled: Iterable[str]) -> list[CheckSpec]:
    patterns = list(disabled)
    return [s for s in all_checks()
            if not any(fnmatch.fnmatchcase(s.id, p) for p in patterns)]


# Helpers that keep check bodies short. The runner fills in ``check``.

def ok(message: str, *, gpu: int | None = None, subject: str | None = None, **data: Any) -> Finding:
    return Finding("", Severity.OK, message, gpu=gpu, subject=subject, data=data)


def not_applicable(message: str, *, gpu: int | None = None, subject: str | None = None) -> Finding:
    return Finding("", Severity.OK, message, gpu=gpu, subject=subject, not_applicable=True)


def problem(severity: Severity | str, message: str, *, gpu: int | None = None,
            subject: str | None = None, **data: Any) -> Finding:
    if isinstance(severity, str):
        severity = Severity.parse(severity)
    return Finding("", severity, message, gpu=gpu, subject=subject, data=data)


def unknown(message: str, *, gpu: int | None = None, subject: str | None = None) -> Finding:
    return Finding("", Severity.UNKNOWN, message, gpu=gpu, subject=subject)
