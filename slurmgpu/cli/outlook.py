"""When a drained node comes back, in words for `slurmgpu fleet` and `slurmgpu nodes`:
``auto-resume after 14:05 (resume_after_s = 600)``, or ``stays drained: <why>; `slurmgpu
resume NODE```.

``outlook`` decides from what each resumer would do (docs/admin-guide.md, "Day to day"):
the collector's automation resumes its own drains after ``resume_healthy_reports`` OK
reports over ``resume_after_s`` (never a lemon's); the healthcheck hook resumes the other
slurmgpu drains once the node checks OK, when slurm.conf runs it (``HealthCheckProgram``,
``HealthCheckInterval`` > 0) and ``[healthcheck] resume`` is on; no one resumes an
``xid.recent`` drain or a drain made outside slurmgpu. ``Resumers`` gathers those facts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurmgpu.actions import STICKY_CHECKS
from slurmgpu.config.schema import Settings
from slurmgpu.decision import REASON_PREFIX, reason_actor
from slurmgpu.slurm import NodeState


@dataclass(frozen=True)
class Resumers:
    """What decides whether a drained node comes back by itself."""

    settings: Settings
    # The automation's state (``Automation.status()``), None: no automation state here.
    automation: Mapping[str, Any] | None = None
    # slurm.conf's HealthCheckInterval in seconds (0: never), None: slurm.conf unread;
    # ``healthcheck_program``: whether slurm.conf names a HealthCheckProgram.
    healthcheck_interval: int | None = None
    healthcheck_program: bool = True
    slurm_conf: str | None = None


def outlook(node: NodeState, resumers: Resumers) -> str | None:
    """How ``node`` comes back (None: it is not drained)."""
    if not node.drained:
        return None
    if node.rebooting:
        return "comes back after its reboot (nextstate=RESUME)"
    stays = _stays_drained(node, resumers)
    if stays is not None:
        return f"stays drained: {stays}; `slurmgpu resume {node.name}" + \
            ("` (or `--force`)" if not node.owned_by_slurmgpu else "`")
    auto = resumers.automation
    if auto is not None and node.name in (auto.get("drained") or []):
        return _automation_resume(node.name, resumers)
    return _healthcheck_resume(node, resumers)


def _stays_drained(node: NodeState, resumers: Resumers) -> str | None:
    """Why nothing resumes ``node`` (None: something may)."""
    reason = node.reason or ""
    if not node.owned_by_slurmgpu:
        return "drained outside slurmgpu"
    lemon = (resumers.automation or {}).get("lemons", {}).get(node.name)
    if lemon is not None:
        return f"a lemon ({lemon.get('why', '')}); `slurmgpu lemon clear {node.name}` first"
    body = reason[len(REASON_PREFIX):].strip()
    sticky = next((c for c in STICKY_CHECKS if body.startswith(c)), None)
    if sticky is not None:
        return f"{sticky} drains wait for an admin to look"
    return None


def _automation_resume(node: str, resumers: Resumers) -> str:
    s = resumers.settings.automation
    setting = f"resume_after_s = {s.resume_after_s:g}"
    streak = ((resumers.automation or {}).get("healthy") or {}).get(node)
    if streak:
        count, first = streak
        at = time.strftime("%H:%M", time.localtime(float(first) + s.resume_after_s))
        return (f"auto-resume after {at} ({setting}; {int(count)} of {s.resume_healthy_reports} "
                "OK reports so far)")
    return f"auto-resume {s.resume_after_s:g} s after it reports OK again ({setting})"


def _healthcheck_resume(node: NodeState, resumers: Resumers) -> str:
    actor = reason_actor(node.reason)
    by = f"the {actor[0]}'s drain" if actor else "this drain"
    where = resumers.slurm_conf or "slurm.conf"
    if not resumers.settings.healthcheck.resume:
        why = "[healthcheck] resume = false"
    elif resumers.healthcheck_interval is None:
        return f"auto-resume by the healthcheck once {node.name} checks OK, if {where} runs it"
    elif not resumers.healthcheck_program:
        why = f"{where} names no HealthCheckProgram"
    elif resumers.healthcheck_interval <= 0:
        why = f"HealthCheckInterval=0 in {where}: the healthcheck never runs to resume {by}"
    else:
        return (f"auto-resume by the healthcheck once {node.name} checks OK "
                f"(HealthCheckInterval = {resumers.healthcheck_interval} s)")
    return f"stays drained: {why}; `slurmgpu resume {node.name}`"


def slurm_healthcheck(environ: Mapping[str, str]) -> tuple[int | None, bool, str | None]:
    """(HealthCheckInterval, HealthCheckProgram set, slurm.conf path) from the slurm.conf
    the Slurm clients read; (None, True, None) when it cannot be read."""
    from slurmgpu.slurm.conf import SlurmConfError, find_slurm_conf, parse_slurm_conf

    path, _ = find_slurm_conf(None, environ)
    if path is None:
        return None, True, None
    try:
        conf = parse_slurm_conf(path)
    except SlurmConfError:
        return None, True, path
    interval = conf.get("HealthCheckInterval")
    try:
        seconds = int(interval.value) if interval is not None else 0
    except ValueError:
        return None, True, path
    return seconds, conf.get("HealthCheckProgram") is not None, path


def resumers(settings: Settings, automation: Mapping[str, Any] | None,
             environ: Mapping[str, str]) -> Resumers:
    """The resumers of this cluster: the automation's state as read, slurm.conf's healthcheck."""
    interval, program, conf = slurm_healthcheck(environ)
    return Resumers(settings, automation, interval, program, conf)

