"""`slurmgpu doctor`: check an installation on a GPU node or on the head node and say
what to fix, one finding per line.

Each check is a small function in ``local`` (config, keys, directories, NVML, the agent
socket), ``slurmconf`` (slurm.conf, the hook programs, slurmctld) or ``collector`` (the
CURVE link and the clock), built on the code the daemons and hooks themselves use: the
config loader, ``slurmgpu.keys``, the Slurm CLI client, the NVML source and the engine's
``gpu.count`` check, the hooks' agent client and the wire protocol. The messages, their
causes and fixes are listed in docs/troubleshooting.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from slurmgpu.doctor.collector import (
    check_clock,
    check_collector,
    check_events_port,
    collector_budget_s,
)
from slurmgpu.doctor.idlevalidate import check_idle_validation
from slurmgpu.doctor.local import check_agent, check_config, check_dirs, check_keys, check_nvml
from slurmgpu.doctor.model import (
    HEAD,
    NODE,
    RUNNER_SLACK_S,
    STEP_TIMEOUT_S,
    Check,
    Context,
    Finding,
    Level,
    exit_code,
    run_all,
    run_check,
)
from slurmgpu.doctor.scontrol import check_scontrol_version
from slurmgpu.doctor.slurmconf import (
    check_slurm_conf,
    check_slurm_hooks,
    check_slurm_settings,
    check_slurmctld,
    check_task_prolog,
)

__all__ = ["CHECKS", "HEAD", "NODE", "Context", "Finding", "Level", "diagnose", "exit_code"]

CONFIG_CHECK = Check("config", check_config)
# In this order: later checks read what earlier ones found (the parsed slurm.conf, the
# collector's answer for the clock).
CHECKS = (
    Check("keys", check_keys),
    Check("slurm.conf", check_slurm_conf),
    Check("slurm.settings", check_slurm_settings),
    Check("slurm.preempt", check_idle_validation),
    Check("slurm.hooks", check_slurm_hooks),
    Check("slurm.task_prolog", check_task_prolog),
    # (ping, the Slurm version slurmctld runs, the nodes slurmgpu drained: three scontrol calls)
    Check("slurmctld", check_slurmctld, 3 * STEP_TIMEOUT_S + RUNNER_SLACK_S),
    Check("slurm.scontrol", check_scontrol_version),
    Check("nvml", check_nvml, hung_fix="if `nvidia-smi` hangs too, a GPU or the driver is wedged "
                                       "(see the kernel log); with persistence mode off NVML starts "
                                       "slowly: `nvidia-smi -pm 1`"),
    Check("agent", check_agent),
    Check("collector", check_collector, collector_budget_s),
    Check("collector.events", check_events_port),
    Check("dirs", check_dirs),
    Check("clock", check_clock),
)


def diagnose(*, node: str, role: str = "auto", config_file: str | None = None,
             slurm_conf: str | None = None, keys_dir: str | None = None,
             environ: Mapping[str, str] = os.environ) -> tuple[Context, list[Finding], float]:
    """Run every check; (the context they filled in, the findings, seconds taken)."""
    from slurmgpu.config.env import apply_env
    from slurmgpu.config.load import config_path
    from slurmgpu.config.schema import Settings

    started = time.monotonic()
    ctx = Context(role=NODE, role_reason="", node=node, keys_dir="", config_file=config_file,
                  config_path=config_path(config_file, environ)[0], slurm_conf_file=slurm_conf,
                  environ=environ)
    findings = run_check(CONFIG_CHECK, ctx)
    # The keys directory, and with it the role, come from the config: settled after it.
    # --keys-dir, else [collector] keys_dir as $SLURMGPU_KEYS_DIR leaves it.
    settings = ctx.settings if ctx.settings is not None else apply_env(Settings(), environ)
    ctx.keys_dir = keys_dir or settings.collector.keys_dir
    ctx.role, ctx.role_reason = detect_role(role, ctx.keys_dir)
    findings += run_all(CHECKS, ctx)
    return ctx, findings, time.monotonic() - started


def detect_role(requested: str, keys_dir: str) -> tuple[str, str]:
    """(role, why). auto: head where the collector's keypair is, else node."""
    if requested in (NODE, HEAD):
        return requested, "--role"
    root = Path(keys_dir)
    if (root / "collector.key_secret").exists():
        return HEAD, f"collector keys in {keys_dir}"
    if (root / "node.key_secret").exists():
        return NODE, f"node bundle in {keys_dir}"
    return NODE, f"no keys in {keys_dir}"
