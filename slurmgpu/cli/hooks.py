"""The Slurm hooks' entry: ``run_hook(phase, config_file)`` for `slurmgpu prolog`,
`epilog` and `healthcheck`, with the standard library and slurmgpu's own modules only
(no click), so the full path of every job imports no more than it runs. It loads the
settings under a watchdog, runs the gate, and turns slurmgpu's own trouble into the
phase's ``on_error`` decision (fail-open unless the site says otherwise); a FAIL verdict
stays a refusal."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmgpu.config.schema import Settings


def _settings(config_file: str | None, node: str | None) -> Settings:
    from slurmgpu.cli.loading import load_settings

    return load_settings(config_file, node=node, known_checks=True).settings


def _client(settings: Settings) -> Any:
    from slurmgpu.slurm.factory import make_client

    return make_client(settings.slurm, env=os.environ)


def run_hook(phase: str, config_file: str | None) -> int:
    """Run hook ``phase``; its exit code."""
    try:
        from slurmgpu import log
        from slurmgpu.config.schema import Settings
        from slurmgpu.errors import SlurmGpuError
        from slurmgpu.gate import Watchdog

        log.configure("info", json=True, lean=True)
    except Exception as exc:  # a missing dependency, a broken module: no verdict possible
        return _cannot_start(phase, config_file, f"{type(exc).__name__}: {exc}")
    # The config itself may hang (a stuck NFS home, a huge hostlist): bound it with the
    # packaged default timeout and policy until the site's are known.
    timeout = float(getattr(getattr(Settings(), phase, None), "timeout_s", 30.0))
    with Watchdog(timeout, lambda step: os._exit(_hook_failed(phase, config_file, "watchdog: loading "
                                                             f"the config exceeded {timeout:g} s"))):
        try:
            gate = _make_gate(config_file)
        except (ImportError, SyntaxError) as exc:  # a broken install, as above
            return _cannot_start(phase, config_file, f"{type(exc).__name__}: {exc}")
        except SlurmGpuError as exc:  # a bad config must not drain the cluster
            return _hook_failed(phase, config_file, f"config: {exc}")
        except Exception as exc:  # nor a bug before the gate runs (the gate catches its own)
            return _hook_failed(phase, config_file, f"setup: {type(exc).__name__}: {exc}")
    try:
        code = int(getattr(gate, phase)())
    except Exception as exc:  # a bug outside the gate's own guards: a FAIL verdict stands
        if gate.verdict is not None and gate.verdict.severity.name == "FAIL":
            return 1
        return _hook_failed(phase, config_file, f"{phase}: {type(exc).__name__}: {exc}")
    from slurmgpu.sources.deadline import leave_if_stuck

    leave_if_stuck(code)  # a hung GPU's gather thread must not hold the hook's exit
    return code


def _make_gate(config_file: str | None) -> Any:
    from slurmgpu.cli.loading import versions_cache
    from slurmgpu.engine import source_facts, system_sources
    from slurmgpu.gate import Gate, job_context
    from slurmgpu.quickgate import tell_decided

    settings = _settings(config_file, job_context(os.environ).node)
    # The sources the gate would make itself, plus the versions cache in the state dir.
    sources = system_sources(settings, versions_cache=versions_cache(settings))
    return Gate(settings, os.environ, lambda: _client(settings),
                facts=source_facts(sources, settings, os.environ), on_decided=tell_decided)


def _cannot_start(phase: str, config_file: str | None, error: str) -> int:
    """slurmgpu cannot even start here (an import failed). Run by the quick client: say
    why on stderr and exit CANNOT_START, undecided (it tries another interpreter, then
    follows on_error itself); else follow on_error with the quick client's own line."""
    from slurmgpu import quickgate

    if os.environ.get(quickgate.DECIDED_FD_ENV):
        sys.stderr.write(f"slurmgpu cannot start with {sys.executable}: {error}\n")
        return quickgate.CANNOT_START
    args = ["--config", config_file] if config_file else []
    return quickgate.cannot_run(phase, args, os.environ, error)


def _hook_failed(phase: str, config_file: str | None, error: str) -> int:
    """The hook cannot judge the node (its own config is broken): follow ``[<phase>]
    on_error`` as far as the file still says it (read leniently), else the packaged
    default (fail-open). Fail-open exits 0 with one loud line; fail-closed refuses the job
    (exit 1: Slurm drains the node, as the admin asked). The healthcheck says UNKNOWN."""
    from slurmgpu import log
    from slurmgpu.quickgate import tell_decided

    policy = _lenient_on_error(phase, config_file)
    if phase == "healthcheck":
        code, action = 3, "none"
    else:
        code, action = (0, "fail-open") if policy == "fail-open" else (1, "fail-closed")
    log.get_logger().error(f"{phase}_decision", phase=phase, action=action, error=error,
                           node=os.environ.get("SLURMD_NODENAME"), job=os.environ.get("SLURM_JOB_ID"))
    tell_decided(action)
    return code


def _lenient_on_error(phase: str, config_file: str | None) -> str:
    """``[<phase>] on_error`` from the raw TOML when it is readable and valid there."""
    import tomllib

    from slurmgpu.config.load import MAX_CONFIG_BYTES, config_path
    from slurmgpu.config.schema import Settings

    default = getattr(Settings(), phase, None)
    fallback = str(getattr(default, "on_error", "fail-open"))
    try:
        path, _ = config_path(config_file)
        with open(path, "rb") as f:
            raw = tomllib.loads(f.read(MAX_CONFIG_BYTES).decode("utf-8"))
        value = raw.get(phase, {}).get("on_error")
    except Exception:  # unreadable, not TOML, not a table: the packaged default
        return fallback
    return value if value in ("fail-open", "fail-closed") else fallback
