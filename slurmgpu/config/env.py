"""Every ``SLURMGPU_*`` environment variable, and the one step that applies them.

A setting's value is decided in one order, lowest first::

    built-in default  <  config file (top level, then each matching [[hosts]])
                      <  environment (SLURMGPU_*)  <  command-line flag

``LoadedConfig.settings_for`` runs the whole order (``apply_env`` then ``apply_flags``);
nothing else reads a ``SLURMGPU_*`` variable that names a setting. Where a component is
handed an environment of its own (a hook's, passed to the agent's warm path), it runs
``apply_env`` over its settings once: the step is idempotent.

Design notes: docs/design-notes.md (``slurmgpu/config/env.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from slurmgpu.errors import ConfigError
from slurmgpu.record import record

if TYPE_CHECKING:
    from slurmgpu.config.schema import Range, Settings


@record(frozen=True)
class EnvVar:
    """One ``SLURMGPU_*`` variable and the setting it overrides."""

    name: str
    # "table.key" of the setting it overrides, or None: not a setting.
    setting: str | None
    # Who sets it: "admin" (a site's override), "wrapper" (the hook wrappers and units),
    # "job" (slurmgpu sets it in a job's environment), "test", "sim".
    audience: str
    doc: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("SLURMGPU_CONFIG", None, "admin",
           "The config file, when no `--config` is given (default /etc/slurmgpu/slurmgpu.toml; "
           "a missing default file means the built-in defaults, a missing named file is an error)."),
    EnvVar("SLURMGPU_STATE_DIR", "paths.state_dir", "admin",
           "Per-job state (prolog -> epilog), the gate log, the versions cache."),
    EnvVar("SLURMGPU_KMSG", "paths.kmsg", "admin", "The kernel log XIDs are read from."),
    EnvVar("SLURMGPU_JOBS_DIR", "agent.jobs_dir", "admin",
           "Per-job directories holding checkpoint requests."),
    EnvVar("SLURMGPU_AGENT_SOCKET", "agent.socket", "admin",
           "The agent's local query socket (the hooks' warm path)."),
    EnvVar("SLURMGPU_AGENT_TIMEOUT", "agent.query_timeout_s", "admin",
           "Seconds a hook waits for the agent to accept a request."),
    EnvVar("SLURMGPU_NVML_LIBRARY", "nvml.library", "admin",
           "Absolute path of libnvidia-ml.so.1 (the simulator points it at its fake)."),
    EnvVar("SLURMGPU_DEVICE_PATTERN", "epilog.device_pattern", "admin",
           "GPU device nodes the epilog scans for stray processes (`{index}` is the GPU)."),
    EnvVar("SLURMGPU_DB", "collector.db", "admin",
           "The collector's SQLite database (also what `fleet`, `report`, `breaker`, ... read)."),
    EnvVar("SLURMGPU_KEYS_DIR", "collector.keys_dir", "admin",
           "CURVE keys and the allow-list (the collector, the agent, `slurmgpu keys`)."),
    EnvVar("SLURMGPU_SLURM_BIN_DIR", "slurm.bin_dir", "admin",
           "Where Slurm's commands (scontrol, squeue...) are, when not in $PATH or /usr/bin."),
    EnvVar("SLURMGPU_BIN", None, "wrapper",
           "The `slurmgpu` program the hook wrappers run when the agent cannot answer."),
    EnvVar("SLURMGPU_PYTHON", None, "wrapper",
           "The Python interpreter the hook wrappers run (set by the packages)."),
    EnvVar("SLURMGPU_QUICKGATE", None, "wrapper",
           "The quickgate script the prolog wrapper tries first (the simulator's own copy)."),
    EnvVar("SLURMGPU_WRAPPER", None, "wrapper", "Set by the hook wrappers (not by you): "
           "the quickgate answers with its exit code + 100, unlike an interpreter that cannot run it."),
    EnvVar("SLURMGPU_DECIDED_FD", None, "wrapper", "Set by the quickgate (not by you): the pipe "
           "on which the full path says slurmgpu decided; an exit code without it is no decision."),
    EnvVar("SLURMGPU_REPORT_ARGS", None, "wrapper",
           "Extra arguments for `slurmgpu report-nightly` from the timer (e.g. `--no-mail`), "
           "in /etc/default/slurmgpu or /etc/sysconfig/slurmgpu."),
    EnvVar("SLURMGPU_CHECKPOINT_FILE", None, "job",
           "Set by the TaskProlog in every task: the file a job watches for a checkpoint request "
           "and writes its ack to."),
    EnvVar("SLURMGPU_SYSFS_ROOT", None, "test",
           "Root of the sysfs tree InfiniBand ports are read from (default /sys): fixture trees."),
    EnvVar("SLURMGPU_HOST_ROOT", None, "sim",
           "Root of the host layers (default /): /proc/driver/nvidia, sys/module, bin/systemctl, "
           "disks; the simulator's host tree for a scenario."),
    EnvVar("SLURMGPU_SLURM_PREFIX", None, "test",
           "A Slurm built into this prefix (tools/build_slurm.sh) runs the test fixtures' "
           "mini-cluster instead of Debian's packages."),
    EnvVar("SLURMGPU_VENDOR_DIR", None, "test",
           "Where tools/build_slurm.sh finds the Slurm source tarball and SHA256SUMS "
           "(default <repo>/../shared/vendor)."),
    EnvVar("SLURMGPU_BUILD_JOBS", None, "test",
           "make's -j for tools/build_slurm.sh (default: the number of CPUs)."),
    EnvVar("SLURMGPU_SIM_SCENARIO", None, "sim", "The scenario the fake NVML library plays."),
    EnvVar("SLURMGPU_SIM_HANG_PIDFILE", None, "sim",
           "Where a simulated hung validate test writes its pids (tests check none survives)."),
    EnvVar("SLURMGPU_SIM_DIR", None, "sim", "Where the fake NVML library is built."),
    EnvVar("SLURMGPU_NVML_INCLUDE", None, "sim",
           "Directory holding nvml.h for building the fake library (default: the bundled copy)."),
    EnvVar("SLURMGPU_TOML", None, "sim", "A simulated node's config file, as its hooks see it."),
    EnvVar("SLURMGPU_CLUSTER_DIR", None, "sim", "The Slurm mini-cluster's directory."),
)

BY_NAME: Mapping[str, EnvVar] = {v.name: v for v in ENV_VARS}
SETTING_VARS: tuple[EnvVar, ...] = tuple(v for v in ENV_VARS if v.setting)
CONFIG_ENV = "SLURMGPU_CONFIG"
DEFAULT_CONFIG_PATH = "/etc/slurmgpu/slurmgpu.toml"
ENV_WHERE = "environment"  # where a bad variable's ConfigError says it is


def env_for(setting: str) -> str | None:
    """The variable that overrides ``setting`` ("paths.state_dir"), if any."""
    return next((v.name for v in SETTING_VARS if v.setting == setting), None)


def overrides(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{setting: (variable, raw value)}`` for each setting variable set (non-empty)."""
    return {v.setting: (v.name, environ[v.name]) for v in SETTING_VARS
            if v.setting and environ.get(v.name)}


def apply_env(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """``settings`` with every setting variable set in ``environ`` applied (a new object
    when any is; the same one when none is). A bad value is a ``ConfigError`` naming
    the variable, as a bad value in the file names its key."""
    found = overrides(environ)
    if not found:
        return settings
    return _replace(settings, {key: _parse(key, name, raw) for key, (name, raw) in found.items()})


def setting_value(key: str, configured: Any, environ: Mapping[str, str]) -> Any:
    """One setting by the same order, for code that holds only its configured value (a
    source built without ``Settings``): ``environ``'s variable for ``key``, else
    ``configured``."""
    name = env_for(key)
    raw = environ.get(name) if name else None
    return _parse(key, name, raw) if name and raw else configured


def apply_flags(settings: Settings, flags: Mapping[str, Any] | None) -> Settings:
    """``settings`` with command-line values (``{"collector.db": "/x.db"}``) applied;
    None values are flags not given."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    return _replace(settings, given) if given else settings


def _replace(settings: Settings, values: Mapping[str, Any]) -> Settings:
    by_table: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        table, name = key.split(".", 1)
        by_table.setdefault(table, {})[name] = value
    changes = {table: dataclasses.replace(getattr(settings, table), **fields)
               for table, fields in by_table.items()}
    return dataclasses.replace(settings, **changes)


def _parse(key: str, name: str, raw: str) -> Any:
    """The value of setting ``key`` spelled ``raw`` in variable ``name``."""
    kind, bounds = _field_type(key)
    if kind is str:
        return raw
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw[:40]!r} is not a number", path=ENV_WHERE, key=key) from None
    if not math.isfinite(value) or (bounds is not None and value not in bounds):
        allowed = bounds.describe() if bounds else "a finite number"
        raise ConfigError(f"${name}={raw[:40]!r} is out of range (allowed: {allowed})",
                          path=ENV_WHERE, key=key)
    return value


@functools.cache
def _field_type(key: str) -> tuple[type, Range | None]:
    """The kind (str or float) and Range of setting ``key``, from the schema's annotations
    (the validator's cached hints: parsing the config file has mostly read them already)."""
    from typing import Annotated, get_args, get_origin

    from slurmgpu.config.schema import Range, Settings
    from slurmgpu.config.validate import type_hints

    table, name = key.split(".", 1)
    hint = type_hints(type_hints(Settings)[table])[name]
    bounds = None
    if get_origin(hint) is Annotated:
        hint, *extras = get_args(hint)
        bounds = next((x for x in extras if isinstance(x, Range)), None)
    return (float if hint in (int, float) else str), bounds


def markdown(rows: Iterable[EnvVar] = ENV_VARS) -> str:
    """docs/environment.md (a test keeps the file equal to this)."""
    lines = [
        "# Environment variables",
        "",
        "Generated from `slurmgpu/config/env.py` by `slurmgpu config env`; do not edit.",
        "",
        "A setting is decided in one order, lowest first: the built-in default, the config",
        "file (its top level, then each matching `[[hosts]]` section), the environment, a",
        "command-line flag. An empty variable is unset. A bad value is a config error naming",
        "the variable (exit 3; a hook fails open). `slurmgpu config explain` shows which",
        "layer set each setting.",
        "",
        "| Variable | Overrides | Set by | What |",
        "|---|---|---|---|",
    ]
    for v in rows:
        setting = f"`{v.setting}`" if v.setting else "-"
        lines.append(f"| `{v.name}` | {setting} | {v.audience} | {v.doc} |")
    return "\n".join(lines) + "\n"
