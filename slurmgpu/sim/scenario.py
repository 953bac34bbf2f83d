"""Simulator scenarios: bundled JSON files describing a node's GPUs as NVML reports them.

The format is documented in docs/simulator.md. A scenario is named either by its bundled
name (``h100-sxm-8``, ``fault-ecc-dbe``, ...: the file stem under ``sim/scenarios/``) or by
a path to a JSON file.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from pathlib import Path
from typing import Any

from slurmgpu.errors import SimError
from slurmgpu.fileutil import write_text_atomic

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

#: Environment variables the fake library (and slurmgpu's NVML source) read.
ENV_LIBRARY = "SLURMGPU_NVML_LIBRARY"
ENV_SCENARIO = "SLURMGPU_SIM_SCENARIO"


def _bundled() -> dict[str, Path]:
    if not SCENARIO_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.json"))}


def list_scenarios() -> list[tuple[str, str]]:
    """Bundled scenarios as ``(name, description)``, sorted by name."""
    out = []
    for name, path in _bundled().items():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            desc = str(data.get("description", "")) if isinstance(data, dict) else ""
        except (OSError, ValueError):
            desc = "(unreadable)"
        out.append((name, desc))
    return out


def resolve_scenario(name_or_path: str | os.PathLike[str]) -> Path:
    """The absolute path of a bundled scenario name or of an existing scenario file.

    A value containing a path separator or ending in ``.json`` is taken as a path;
    anything else is looked up among the bundled names first, then as a file.
    """
    text = os.fspath(name_or_path)
    bundled = _bundled()
    looks_like_path = os.sep in text or "/" in text or text.endswith(".json")
    if not looks_like_path and text in bundled:
        return bundled[text]
    candidate = Path(text).expanduser()
    if candidate.is_file():
        return candidate.resolve()
    if looks_like_path:
        raise SimError(f"scenario file not found: {text}")
    hint = difflib.get_close_matches(text, list(bundled), n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise SimError(
        f"unknown scenario '{text}'{suggestion}; see `slurmgpu sim list` or pass a JSON file path"
    )


def load_scenario(name_or_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a scenario; raises SimError with a one-line reason."""
    path = resolve_scenario(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimError(f"cannot read scenario {path}: {exc.strerror or exc}") from exc
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    validate_scenario(data, source=str(path))
    return data


def validate_scenario(data: Any, *, source: str = "<scenario>") -> None:
    """Check the structure the fake library relies on (types of the main keys)."""
    if not isinstance(data, dict):
        raise SimError(f"{source}: a scenario must be a JSON object")
    for key in ("driver_version", "nvml_version", "name", "description"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise SimError(f"{source}: '{key}' must be a string")
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list):
        raise SimError(f"{source}: 'gpus' must be a list")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise SimError(f"{source}: gpus[{i}] must be an object")
        nvlink = gpu.get("nvlink")
        if nvlink is not None and not isinstance(nvlink, list):
            raise SimError(f"{source}: gpus[{i}].nvlink must be a list")
        errors = gpu.get("errors")
        if errors is not None and not isinstance(errors, dict):
            raise SimError(f"{source}: gpus[{i}].errors must be an object")
    for key in ("errors", "host"):
        if key in data and not isinstance(data[key], dict):
            raise SimError(f"{source}: '{key}' must be an object")
    events = data.get("events", [])
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise SimError(f"{source}: 'events' must be a list of objects")


def dump_scenario(data: Any, *, width: int = 120) -> str:
    """JSON text with small objects and lists kept on one line (readable diffs)."""

    def render(value: Any, indent: int) -> str:
        flat = json.dumps(value, ensure_ascii=False)
        if not isinstance(value, (dict, list)) or len(flat) + indent <= width or not value:
            return flat
        pad = " " * (indent + 2)
        if isinstance(value, dict):
            items = [
                f"{pad}{json.dumps(k, ensure_ascii=False)}: {render(v, indent + 2)}"
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        items = [f"{pad}{render(v, indent + 2)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"

    return render(data, 0) + "\n"


def write_scenario(path: str | os.PathLike[str], data: Any) -> Path:
    """Write a scenario atomically (temp file + rename), so a running fake sees old or new."""
    return write_text_atomic(path, dump_scenario(data))


XID_EVENT_TYPE = 0x8  # nvmlEventTypeXidCriticalError


def inject_xid(data: dict[str, Any], gpu: int, xid: int, *, kernel_log: str | os.PathLike[str] | None,
               text: str = "simulated XID", event: bool = True) -> None:
    """XID ``xid`` on GPU ``gpu`` as a driver reports it: a line in the kernel log (a
    kmsg-format file; None: none) and an NVML event in ``data`` (``event``), which the
    caller writes back (``write_scenario``). Raises SimError for a GPU the scenario lacks."""
    from slurmgpu.sources.kmsg import append_xid

    gpus = data.get("gpus") or []
    if not 0 <= gpu < len(gpus):
        raise SimError(f"the scenario has no GPU {gpu} (it has {len(gpus)})")
    if kernel_log is not None:
        try:
            append_xid(os.fspath(kernel_log), str((gpus[gpu].get("pci") or {}).get("bus_id", "")), xid, text)
        except ValueError as exc:
            raise SimError(f"GPU {gpu}: {exc}") from exc
    if event:
        events = data.setdefault("events", [])
        # Ids unique across resets (microseconds): the fake delivers each id once per
        # event set, so a restarted count would hide new events from a running agent.
        next_id = max([int(e.get("id", i + 1)) for i, e in enumerate(events)] +
                      [time.time_ns() // 1000]) + 1
        events.append({"gpu": gpu, "type": XID_EVENT_TYPE, "data": xid, "id": next_id})


def sim_environment(name_or_path: str | os.PathLike[str]) -> dict[str, str]:
    """Environment that points slurmgpu's NVML source at the fake library and a scenario,
    and its host source at the scenario's host tree (``slurmgpu.sim.hostroot``).

    Builds the fake library if needed.
    """
    from slurmgpu.sim.build import build_library
    from slurmgpu.sim.hostroot import host_environment

    scenario = resolve_scenario(name_or_path)
    data = load_scenario(scenario)  # fail early on a broken file
    library = build_library()
    return {ENV_LIBRARY: str(library), ENV_SCENARIO: str(scenario),
            **host_environment(data, library.parent)}
