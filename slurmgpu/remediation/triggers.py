"""When a ladder or a validation starts, as pure functions: whether an operator's drain
opted in to validation before resume, and which nodes are due an idle-time validation
(``[validate] every_days``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slurmgpu.config.schema import RemediationSettings
from slurmgpu.decision import REASON_PREFIX, reason_actor

DAY = 86400.0


def operator_opted_in(reason: str, settings: RemediationSettings) -> bool:
    """An operator's drain (a reason not written by slurmgpu's automation or hooks, or a
    ``slurmgpu drain`` by an operator) is validated before resume when its reason holds
    ``operator_tag``, or every one with ``operator_drains``."""
    actor = reason_actor(reason)
    by_operator = not reason.startswith(REASON_PREFIX) or (actor is not None and actor[0] == "operator")
    return by_operator and (settings.operator_drains or settings.operator_tag in reason)


def due_for_idle_validation(nodes: Iterable[str], last_validated: Mapping[str, float], now: float,
                            every_days: float, limit: int) -> list[str]:
    """Of ``nodes``, at most ``limit`` whose last validation (any trigger) is
    ``every_days`` old or more, never-validated first, then the oldest; none with
    ``every_days`` 0 (off)."""
    if every_days <= 0 or limit <= 0:
        return []
    cutoff = now - every_days * DAY
    due = [n for n in nodes if last_validated.get(n, float("-inf")) <= cutoff]
    return sorted(due, key=lambda n: (last_validated.get(n, float("-inf")), n))[:limit]
