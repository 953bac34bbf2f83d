#!/usr/bin/env python3
"""Python side of ``bench/real_gpu.sh`` (one subcommand per measuring step).

Run by the shell script, each call under its own ``timeout``; every subcommand writes
one JSON file and exits 0 when it could record something (a failed NVML/CUDA call is
data, not an error). Only the standard library at import time: ``probe``, ``phase``
and ``gpu-count`` import pynvml, ``load`` imports torch or cupy when present, ``load``
and ``xid`` otherwise talk to ``libcuda.so.1`` through ctypes (hand-written PTX,
JIT-compiled by the driver: no nvcc, no CUDA toolkit). ``footprint`` decodes spooled
frames with msgpack when it can. Python 3.8+ (it must run where slurmgpu cannot).

pynvml honours ``$SLURMGPU_NVML_LIBRARY`` (the simulator's fake library), as slurmgpu does.

    python3 bench/real_gpu_helper.py SUBCOMMAND --help
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
EVENT_CLOCK = 0x10
EVENT_XID = 0x8

# ----------------------------------------------------------------------- small utilities


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: str | Path | None, default: Any = None) -> Any:
    if not path:
        return default
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def stats(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def pct(p: float) -> float:
        k = (len(ordered) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {"n": len(ordered), "min_ms": round(ordered[0], 1), "p50_ms": round(statistics.median(ordered), 1),
            "p90_ms": round(pct(0.9), 1), "max_ms": round(ordered[-1], 1),
            "mean_ms": round(statistics.fmean(ordered), 1)}


def struct_dict(obj: Any) -> Any:
    """A ctypes Structure/array as plain JSON-able values."""
    if isinstance(obj, (ctypes.Structure, ctypes.Union)):
        return {name: struct_dict(getattr(obj, name)) for name, *_ in obj._fields_}
    if isinstance(obj, ctypes.Array):
        items = list(obj)
        if items and all(isinstance(i, int) for i in items) and len(items) == 16:
            return "".join(f"{i:02x}" for i in items)  # uuids
        return [struct_dict(i) for i in items]
    return text(obj)


def error_dict(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "value", None)
    return {"ok": False, "error": type(exc).__name__, "code": code if isinstance(code, int) else None,
            "message": str(exc)[:300]}


def timed(fn: Any) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        out: dict[str, Any] = {"ok": True, "value": fn()}
    except Exception as exc:  # every failure is a result here
        out = error_dict(exc)
    out["ms"] = ms(time.perf_counter() - start)
    return out


def load_pynvml() -> Any:
    import pynvml

    lib = os.environ.get("SLURMGPU_NVML_LIBRARY")
    if lib and getattr(pynvml, "nvmlLib", None) is None:
        pynvml.nvmlLib = ctypes.CDLL(lib)
    return pynvml


def pynvml_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("nvidia-ml-py")
    except Exception:
        return None


def event_names(nvml: Any, mask: int) -> list[str]:
    names = {}
    for attr in dir(nvml):
        if attr.startswith("nvmlEventType") and attr not in ("nvmlEventTypeAll", "nvmlEventTypeNone"):
            value = getattr(nvml, attr)
            if isinstance(value, int) and value and value & (value - 1) == 0:
                names.setdefault(value, attr[len("nvmlEventType"):])
    out = [names.get(1 << bit, f"0x{1 << bit:x}") for bit in range(64) if mask & (1 << bit)]
    return out


# ----------------------------------------------------------------------------- gpu-count


def cmd_gpu_count(args: argparse.Namespace) -> int:
    nvml = load_pynvml()
    nvml.nvmlInit()
    try:
        print(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()
    return 0


# --------------------------------------------------------------------------------- probe

_FIELD_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
PROBE_FIELDS = {82: "memory temperature (NVML_FI_DEV_MEMORY_TEMP)",
                94: "PCIe replay counter (NVML_FI_DEV_PCIE_REPLAY_COUNTER)",
                226: "reset status (NVML_FI_DEV_RESET_STATUS, deprecated)",
                227: "drain and reset status (NVML_FI_DEV_DRAIN_AND_RESET_STATUS, deprecated)",
                230: "GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"}
VIOLATION_POLICIES = {0: "power", 1: "thermal", 3: "board_limit", 5: "reliability"}


def field_values(nvml: Any, h: Any, ids: list[int]) -> list[dict[str, Any]]:
    out = []
    values = nvml.nvmlDeviceGetFieldValues(h, ids)
    for i, fid in enumerate(ids):
        value = values[i]
        ret = int(value.nvmlReturn)
        item: dict[str, Any] = {"field": fid, "nvmlReturn": ret}
        if ret == 0:
            attr = _FIELD_VALUE_ATTR.get(int(value.valueType), "uiVal")
            item["value"] = getattr(value.value, attr, None)
            item["valueType"] = int(value.valueType)
        else:
            with contextlib.suppress(Exception):
                item["error"] = text(nvml.nvmlErrorString(ret))
        out.append(item)
    return out


def probe_gpu(nvml: Any, index: int, repeat: int) -> dict[str, Any]:
    calls: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return {"index": index, "handle": {**error_dict(exc), "ms": ms(time.perf_counter() - start)}}
    gpu: dict[str, Any] = {"index": index, "handle": {"ok": True, "ms": ms(time.perf_counter() - start)}}

    def p(name: str, fn: Any) -> None:
        calls[name] = timed(fn)

    def struct_call(fn_name: str, cls_name: str) -> Any:
        info = getattr(nvml, cls_name)()
        getattr(nvml, fn_name)(h, ctypes.byref(info))
        return struct_dict(info)

    p("nvmlDeviceGetName", lambda: text(nvml.nvmlDeviceGetName(h)))
    p("nvmlDeviceGetPciInfo.busId", lambda: text(nvml.nvmlDeviceGetPciInfo(h).busId))
    p("nvmlDeviceGetUUID", lambda: text(nvml.nvmlDeviceGetUUID(h)))
    p("nvmlDeviceGetPersistenceMode", lambda: nvml.nvmlDeviceGetPersistenceMode(h))
    p("nvmlDeviceGetSupportedEventTypes", lambda: (lambda m: {
        "mask": hex(m), "types": event_names(nvml, m)})(nvml.nvmlDeviceGetSupportedEventTypes(h)))
    # Temperature: the V call arrived in R555; the plain call is the fallback.
    p("nvmlDeviceGetTemperatureV(GPU)", lambda: nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU))
    p("nvmlDeviceGetTemperature(GPU)", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
    for name, sensor in (("shutdown", 0), ("slowdown", 1), ("mem_max", 2), ("gpu_max", 3)):
        p(f"nvmlDeviceGetTemperatureThreshold({name})",
          lambda sensor=sensor: nvml.nvmlDeviceGetTemperatureThreshold(h, sensor))
    # nvidia-ml-py returns the struct on some releases and the int margin on others (13.610).
    p("nvmlDeviceGetMarginTemperature",
      lambda: (lambda m: getattr(m, "margin", m))(nvml.nvmlDeviceGetMarginTemperature(h)))
    # Fabric: v3 struct (R560+?), v2 struct (R550), the deprecated v1 call (R535).
    p("nvmlDeviceGetGpuFabricInfoV(v3)",
      lambda: struct_call("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"))
    p("nvmlDeviceGetGpuFabricInfoV(v2)",
      lambda: struct_call("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"))
    p("nvmlDeviceGetGpuFabricInfo(v1)",
      lambda: struct_call("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))
    for fid, label in PROBE_FIELDS.items():
        p(f"nvmlDeviceGetFieldValues([{fid}]) {label}", lambda fid=fid: field_values(nvml, h, [fid]))
    p("nvmlDeviceGetFieldValues(all probed fields at once)",
      lambda: field_values(nvml, h, list(PROBE_FIELDS)))
    for pol, name in VIOLATION_POLICIES.items():
        p(f"nvmlDeviceGetViolationStatus({pol}={name})",
          lambda pol=pol: (lambda s: {"referenceTime": s.referenceTime, "violationTime_ns": s.violationTime})(
              nvml.nvmlDeviceGetViolationStatus(h, pol)))
    p("nvmlDeviceGetClockInfo(SM)", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
    p("nvmlDeviceGetMaxClockInfo(SM)", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
    p("nvmlDeviceGetCurrentClocksEventReasons",
      lambda: hex(nvml.nvmlDeviceGetCurrentClocksEventReasons(h)))
    p("nvmlDeviceGetSramEccErrorStatus(v1)",
      lambda: struct_call("nvmlDeviceGetSramEccErrorStatus", "c_nvmlEccSramErrorStatus_v1_t"))
    p("nvmlDeviceGetPcieReplayCounter", lambda: nvml.nvmlDeviceGetPcieReplayCounter(h))
    p("nvmlDeviceGetRemappedRows", lambda: list(nvml.nvmlDeviceGetRemappedRows(h)))
    p("nvmlDeviceGetRetiredPagesPendingStatus", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
    p("nvmlDeviceGetNvLinkState(0)", lambda: nvml.nvmlDeviceGetNvLinkState(h, 0))
    p("nvmlDeviceGetTotalEnergyConsumption", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
    p("nvmlDeviceGetPowerUsage", lambda: nvml.nvmlDeviceGetPowerUsage(h))
    p("nvmlDeviceGetPerformanceState", lambda: nvml.nvmlDeviceGetPerformanceState(h))
    if index == 0:  # slow (~70 ms on the H200): once
        p("nvmlDeviceValidateInforom", lambda: nvml.nvmlDeviceValidateInforom(h))
    gpu["calls"] = calls
    if repeat:
        for name, fn in (("nvmlDeviceGetTemperature", lambda: nvml.nvmlDeviceGetTemperature(h, 0)),
                         ("nvmlDeviceGetTemperatureV", lambda: nvml.nvmlDeviceGetTemperatureV(h, 0))):
            t = time.perf_counter()
            try:
                for _ in range(repeat):
                    fn()
                gpu[f"{name} x{repeat}"] = {"ok": True, "ms": ms(time.perf_counter() - t)}
            except Exception as exc:
                gpu[f"{name} x{repeat}"] = error_dict(exc)
    return gpu


def cmd_probe(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"python": sys.version.split()[0], "nvidia_ml_py": pynvml_version(),
                           "nvml_library": os.environ.get("SLURMGPU_NVML_LIBRARY") or "libnvidia-ml.so.1",
                           "time": time.time()}
    try:
        nvml = load_pynvml()
    except Exception as exc:
        out["import"] = error_dict(exc)
        write_json(args.out, out)
        return 1
    init = timed(nvml.nvmlInit)
    out["nvmlInit"] = init
    if not init["ok"]:
        write_json(args.out, out)
        return 1
    try:
        out["nvmlSystemGetDriverVersion"] = timed(lambda: text(nvml.nvmlSystemGetDriverVersion()))
        out["nvmlSystemGetNVMLVersion"] = timed(lambda: text(nvml.nvmlSystemGetNVMLVersion()))
        out["nvmlSystemGetCudaDriverVersion_v2"] = timed(nvml.nvmlSystemGetCudaDriverVersion_v2)
        count = timed(nvml.nvmlDeviceGetCount)
        out["nvmlDeviceGetCount"] = count
        n = count.get("value") or 0
        indices = range(n) if args.all_gpus else range(min(n, 1))
        out["gpus"] = [probe_gpu(nvml, i, args.repeat if i == 0 else 0) for i in indices]
        if n > 1 and args.all_gpus:  # one line per call: the GPUs whose result differs from GPU 0's
            diff = {}
            base = out["gpus"][0].get("calls", {})
            for gpu in out["gpus"][1:]:
                for name, res in gpu.get("calls", {}).items():
                    ref = base.get(name, {})
                    if (res.get("ok"), res.get("error")) != (ref.get("ok"), ref.get("error")):
                        diff.setdefault(name, []).append(gpu["index"])
            out["outcome_differs_from_gpu0"] = diff
    finally:
        out["nvmlShutdown"] = timed(nvml.nvmlShutdown)
    write_json(args.out, out)
    return 0


# -------------------------------------------------------------------------------- timeit


def _records(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    out.append(rec)
    return out


def cmd_timeit(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    env = dict(os.environ)
    for item in args.env or []:
        key, _, value = item.partition("=")
        env[key] = value
    for key in args.unset or []:
        env.pop(key, None)
    samples: list[float] = []
    codes: dict[str, int] = {}
    paths: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    last_err = ""
    total = args.runs + args.warmup
    for i in range(total):
        if args.job_id_base is not None:
            env["SLURM_JOB_ID"] = str(args.job_id_base + i)
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if not args.keep_stdout else subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=args.per_run_timeout, check=False)
            elapsed = (time.perf_counter() - start) * 1000
            code = proc.returncode
            err = proc.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            elapsed, code, err = (time.perf_counter() - start) * 1000, "timeout", ""
        except OSError as exc:
            write_json(args.out, {"name": args.name, "cmd": cmd, "error": f"cannot run: {exc}"})
            return 1
        if i < args.warmup:
            continue
        samples.append(elapsed)
        codes[str(code)] = codes.get(str(code), 0) + 1
        for rec in _records(err):
            if "path" in rec:
                paths[str(rec["path"])] = paths.get(str(rec["path"]), 0) + 1
            if "verdict" in rec:
                verdicts[str(rec["verdict"])] = verdicts.get(str(rec["verdict"]), 0) + 1
        last_err = err
    out = {"name": args.name, "cmd": cmd, "env": args.env or [], "runs": args.runs, "warmup": args.warmup,
           **stats(samples), "exit_codes": codes, "samples_ms": [round(s, 2) for s in samples],
           "stderr_last_run_tail": last_err[-1500:]}
    if paths:
        out["record_paths"] = paths
    if verdicts:
        out["record_verdicts"] = verdicts
    if args.note:
        out["note"] = args.note
    write_json(args.out, out)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    rows = []
    for path in args.files:
        data = read_json(path)
        if data is not None:
            rows.append(data)
    skipped = []
    if args.skipped and Path(args.skipped).exists():
        for line in Path(args.skipped).read_text().splitlines():
            with contextlib.suppress(ValueError):
                skipped.append(json.loads(line))
    out = {"meta": read_json(args.meta, {}), "rows": rows, "skipped": skipped}
    write_json(args.out, out)
    return 0


# ---------------------------------------------------------------------------- wait-agent


def cmd_wait_agent(args: argparse.Namespace) -> int:
    import socket as socketlib

    start = time.monotonic()
    out: dict[str, Any] = {"socket": args.socket}
    deadline = start + args.timeout
    while time.monotonic() < deadline:
        if args.pid and not Path(f"/proc/{args.pid}").exists():
            out["error"] = "agent exited"
            break
        if os.path.exists(args.socket):
            with contextlib.suppress(OSError), socketlib.socket(socketlib.AF_UNIX) as s:
                s.settimeout(1.0)
                s.connect(args.socket)
                s.sendall(b'{"op": "status"}\n')
                reply = s.recv(65536).decode("utf-8", "replace")
                out["status_reply"] = reply[:500]
                out["socket_s"] = round(time.monotonic() - start, 3)
                break
        time.sleep(0.05)
    if "socket_s" not in out:
        out.setdefault("error", f"no answer on {args.socket} within {args.timeout} s")
        write_json(args.out, out)
        return 1
    if args.log and args.events_timeout > 0:  # the NVML event thread registered (or gave up)
        end = time.monotonic() + args.events_timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                log = Path(args.log).read_text(errors="replace")
                for marker in ("nvml_events_watching", "nvml_events_unavailable", "nvml_events_init_failed"):
                    if marker in log:
                        out["events_marker"] = marker
                        out["events_s"] = round(time.monotonic() - start, 3)
                        line = next(ln for ln in log.splitlines() if marker in ln)
                        out["events_line"] = line[:400]
                        break
            if "events_marker" in out:
                break
            time.sleep(0.1)
    write_json(args.out, out)
    return 0


# ---------------------------------------------------------------------------------- phase


def proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


class ClockCounter(threading.Thread):
    """Counts the NVML clock-change events the driver emits, per GPU, while ``counting``."""

    def __init__(self, mask: int = EVENT_CLOCK) -> None:
        super().__init__(name="clock-counter", daemon=True)
        self.mask = mask
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.counting = False
        self.counts: dict[int, int] = {}
        self.types: dict[str, int] = {}
        self.info: dict[str, Any] = {"mask": hex(mask)}

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.info["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def _run(self) -> None:
        nvml = load_pynvml()
        nvml.nvmlInit()
        try:
            event_set = nvml.nvmlEventSetCreate()
            by_handle: dict[Any, int] = {}
            registered, errors = [], {}
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    h = nvml.nvmlDeviceGetHandleByIndex(index)
                    supported = nvml.nvmlDeviceGetSupportedEventTypes(h)
                    if not supported & self.mask:
                        errors[str(index)] = f"clock events not supported (mask {supported:#x})"
                        continue
                    nvml.nvmlDeviceRegisterEvents(h, self.mask & supported, event_set)
                    by_handle[ctypes.cast(h, ctypes.c_void_p).value] = index
                    registered.append(index)
                    self.counts[index] = 0
                except Exception as exc:
                    errors[str(index)] = f"{type(exc).__name__}: {exc}"
            self.info.update(registered=registered, register_errors=errors)
            self.ready.set()
            while not self.stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, 100)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as exc:
                    self.info["wait_error"] = str(exc)
                    time.sleep(0.1)
                    continue
                if not self.counting:
                    continue
                index = by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value)
                if index is None:
                    with contextlib.suppress(Exception):
                        index = int(nvml.nvmlDeviceGetIndex(data.device))
                key = -1 if index is None else index
                self.counts[key] = self.counts.get(key, 0) + 1
                kind = hex(int(data.eventType))
                self.types[kind] = self.types.get(kind, 0) + 1
            with contextlib.suppress(Exception):
                nvml.nvmlEventSetFree(event_set)
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()


def _write_scenario(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".scenario.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)  # atomic: running fakes re-read it at their next call


def sim_events(scenario: str, add: list[dict[str, Any]]) -> list[int]:
    """Append events to a simulator scenario."""
    path = Path(scenario)
    data = json.loads(path.read_text())
    events = list(data.get("events") or [])
    ids = []
    next_id = max([int(e.get("id", 0)) for e in events if isinstance(e.get("id"), int)] + [len(events), 1_000_000]) + 1
    for event in add:
        event = {**event, "id": next_id}
        ids.append(next_id)
        next_id += 1
        events.append(event)
    data["events"] = events
    _write_scenario(path, data)
    return ids


def cmd_sim_load(args: argparse.Namespace) -> int:
    """Set or clear the simulator's per-GPU "load" flag (clock events at its load rate)."""
    path = Path(args.scenario)
    data = json.loads(path.read_text())
    gpus = _gpus(args.gpus, len(data.get("gpus") or []))
    for i in gpus:
        if args.off:
            data["gpus"][i].pop("load", None)
        else:
            data["gpus"][i]["load"] = True
    _write_scenario(path, data)
    if args.out:
        write_json(args.out, {"load": "simulated", "method": "the simulator's per-GPU \"load\" flag "
                              "(clock events at its load rate; no GPU work)", "gpus": gpus, "time": time.time()})
    return 0


def cmd_phase(args: argparse.Namespace) -> int:
    pid = args.pid
    out: dict[str, Any] = {"label": args.label, "pid": pid, "requested_s": args.seconds}
    counter = None
    if args.clock_events:
        counter = ClockCounter()
        counter.start()
        counter.ready.wait(30)
    cpu0 = proc_cpu_s(pid)
    st0 = proc_status(pid)
    t_start, m_start = time.time(), time.monotonic()
    if counter is not None:
        counter.counting = True
    rss_peak = st0.get("VmRSS", 0)
    samples = []
    alive = cpu0 is not None
    while alive and time.monotonic() - m_start < args.seconds:
        time.sleep(min(args.sample_s, max(0.0, args.seconds - (time.monotonic() - m_start))))
        st = proc_status(pid)
        if "VmRSS" not in st:  # gone, or a zombie
            alive = False
            break
        rss_peak = max(rss_peak, st.get("VmRSS", 0))
        samples.append(st.get("VmRSS", 0))
    cpu1 = proc_cpu_s(pid)
    st1 = proc_status(pid)
    m_end, t_end = time.monotonic(), time.time()
    if counter is not None:
        counter.counting = False
        counter.stop.set()
        counter.join(5)
    elapsed = m_end - m_start
    out.update(t_start=t_start, t_end=t_end, seconds=round(elapsed, 3), agent_alive=alive)
    if cpu0 is not None and cpu1 is not None and elapsed > 0:
        out["agent_cpu_s"] = round(cpu1 - cpu0, 3)
        out["agent_cpu_pct_of_one_core"] = round(100 * (cpu1 - cpu0) / elapsed, 2)
    out["agent_rss_mb"] = {"start": round(st0.get("VmRSS", 0) / 1024, 1), "peak_sampled": round(rss_peak / 1024, 1),
                           "final": round(st1.get("VmRSS", 0) / 1024, 1) if st1 else None,
                           "vmhwm": round(st1.get("VmHWM", 0) / 1024, 1) if st1 else None,
                           "samples": len(samples)}
    out["agent_threads"] = st1.get("Threads") if st1 else None
    if counter is not None:
        gpus = sorted(k for k in counter.counts if k >= 0)
        total = sum(counter.counts.values())
        per_gpu = {str(k): counter.counts[k] for k in sorted(counter.counts)}
        out["clock_events"] = {**counter.info, "total": total, "per_gpu": per_gpu, "types": counter.types,
                               "per_s_per_gpu": round(total / elapsed / len(gpus), 2) if gpus and elapsed > 0 else None,
                               "max_per_s_one_gpu": round(max(counter.counts.values()) / elapsed, 2)
                               if counter.counts and elapsed > 0 else None}
    write_json(args.out, out)
    return 0


def cmd_proc(args: argparse.Namespace) -> int:
    st = proc_status(args.pid)
    write_json(args.out, {"pid": args.pid, "time": time.time(), "cpu_s": proc_cpu_s(args.pid),
                          "vmrss_mb": round(st.get("VmRSS", 0) / 1024, 1) if st else None,
                          "vmhwm_mb": round(st.get("VmHWM", 0) / 1024, 1) if st else None,
                          "threads": st.get("Threads")})
    return 0 if st else 1


# ------------------------------------------------------------------------ CUDA via ctypes

PTX_VERSION = "7.0"
FAULT_PTX = """
.version {version}
.target {target}
.address_size 64

.visible .entry slurmgpu_fault(
    .param .u64 slurmgpu_fault_param_0
)
{{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [slurmgpu_fault_param_0];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 31;
    st.volatile.global.u32 [%rd2], %r1;
    ret;
}}
"""
SPIN_PTX = """
.version {version}
.target {target}
.address_size 64

.visible .entry slurmgpu_spin(
    .param .u64 slurmgpu_spin_param_0,
    .param .u32 slurmgpu_spin_param_1
)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .f32 %f<12>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [slurmgpu_spin_param_0];
    ld.param.u32 %r1, [slurmgpu_spin_param_1];
    mov.u32 %r2, %tid.x;
    cvt.rn.f32.u32 %f1, %r2;
    add.f32 %f2, %f1, 0f3F800000;
    add.f32 %f3, %f1, 0f40000000;
    add.f32 %f4, %f1, 0f40400000;
    mov.f32 %f5, 0f3F7FFFFE;
    mov.f32 %f9, 0f3F000000;
    mov.u32 %r3, 0;
$L_spin:
    fma.rn.f32 %f1, %f1, %f5, %f9;
    fma.rn.f32 %f2, %f2, %f5, %f9;
    fma.rn.f32 %f3, %f3, %f5, %f9;
    fma.rn.f32 %f4, %f4, %f5, %f9;
    add.u32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r1;
    @%p1 bra $L_spin;
    add.f32 %f6, %f1, %f2;
    add.f32 %f7, %f3, %f4;
    add.f32 %f8, %f6, %f7;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f8;
    ret;
}}
"""
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6


class CudaError(Exception):
    pass


class Cuda:
    """The few CUDA driver API calls this needs, each logged with its result."""

    def __init__(self) -> None:
        name = os.environ.get("REAL_GPU_LIBCUDA") or "libcuda.so.1"
        self.lib = ctypes.CDLL(name)
        self.calls: list[dict[str, Any]] = []
        vp, u = ctypes.c_void_p, ctypes.c_uint
        self.lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), vp]
        self.lib.cuLaunchKernel.restype = ctypes.c_int

    def err_name(self, code: int) -> str:
        s = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            if self.lib.cuGetErrorName(ctypes.c_int(code), ctypes.byref(s)) == 0 and s.value:
                return s.value.decode()
        return f"CUresult {code}"

    def call(self, name: str, *args: Any, check: bool = True, log: bool = True) -> int:
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        code = int(fn(*args))
        if log:
            self.calls.append({"call": name, "code": code, "result": self.err_name(code) if code else "CUDA_SUCCESS"})
        if code and check:
            raise CudaError(f"{name}: {self.err_name(code)} ({code})")
        return code

    def init(self) -> dict[str, Any]:
        self.call("cuInit", ctypes.c_uint(0))
        version, count = ctypes.c_int(), ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(version))
        self.call("cuDeviceGetCount", ctypes.byref(count))
        return {"cuda_driver_version": version.value, "device_count": count.value}

    def device(self, ordinal: int) -> tuple[int, dict[str, Any]]:
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
        info: dict[str, Any] = {"ordinal": ordinal}
        buf = ctypes.create_string_buffer(256)
        if self.call("cuDeviceGetName", buf, ctypes.c_int(256), dev, check=False) == 0:
            info["name"] = buf.value.decode(errors="replace")
        if self.call("cuDeviceGetPCIBusId", buf, ctypes.c_int(256), dev, check=False) == 0:
            info["pci_bus_id"] = buf.value.decode(errors="replace")
        for key, attr in (("sm_count", CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                          ("cc_major", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                          ("cc_minor", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)):
            value = ctypes.c_int()
            if self.call("cuDeviceGetAttribute", ctypes.byref(value), ctypes.c_int(attr), dev, check=False) == 0:
                info[key] = value.value
        return dev.value, info

    def context(self, dev: int) -> ctypes.c_void_p:
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), ctypes.c_int(dev))
        self.call("cuCtxSetCurrent", ctx)
        return ctx

    def function(self, ptx: str, name: str) -> ctypes.c_void_p:
        module = ctypes.c_void_p()
        log = ctypes.create_string_buffer(4096)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(4096))
        code = self.call("cuModuleLoadDataEx", ctypes.byref(module), ctypes.c_char_p(ptx.encode()),
                         ctypes.c_uint(2), options, values, check=False)
        if code:
            raise CudaError(f"cuModuleLoadDataEx: {self.err_name(code)} ({code}): "
                            f"{log.value.decode(errors='replace').strip()}")
        fn = ctypes.c_void_p()
        self.call("cuModuleGetFunction", ctypes.byref(fn), module, ctypes.c_char_p(name.encode()))
        return fn

    def launch(self, fn: ctypes.c_void_p, grid: int, block: int, params: list[Any], *,
               log: bool = True) -> int:
        """params: ctypes values (kept alive by the caller's list until the launch returns)."""
        array = (ctypes.c_void_p * len(params))(*[ctypes.addressof(p) for p in params])
        return self.call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, 0, None, array, None, log=log)


def ptx_target(info: dict[str, Any]) -> str:
    cc = info.get("cc_major", 7) * 10 + info.get("cc_minor", 5)
    return "sm_75" if cc >= 75 else f"sm_{cc}"


def cmd_xid(args: argparse.Namespace) -> int:
    addr = int(args.addr, 0)
    out: dict[str, Any] = {"method": "CUDA driver API (ctypes on libcuda.so.1), hand-written PTX kernel "
                                     "storing to an unmapped device address", "gpu": args.gpu,
                           "address": hex(addr), "provoked": False,
                           "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER")}
    try:
        cuda = Cuda()
    except OSError as exc:
        out.update(skipped=True, reason=f"cannot load libcuda.so.1: {exc}")
        write_json(args.out, out)
        return 0
    try:
        out.update(cuda.init())
        dev, info = cuda.device(args.gpu)
        out["device"] = info
        cuda.context(dev)
        fn = cuda.function(FAULT_PTX.format(version=PTX_VERSION, target=ptx_target(info)), "slurmgpu_fault")
        param = ctypes.c_uint64(addr)
        out["launched_at"] = time.time()
        cuda.launch(fn, 1, 1, [param])
        code = cuda.call("cuCtxSynchronize", check=False)
        out["finished_at"] = time.time()
        out["sync_result"] = cuda.err_name(code) if code else "CUDA_SUCCESS"
        # CUDA_ERROR_ILLEGAL_ADDRESS (700) is the expected outcome of an MMU fault.
        out["provoked"] = code != 0
        out["expected_sync_result"] = "CUDA_ERROR_ILLEGAL_ADDRESS"
    except (CudaError, OSError, AttributeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["calls"] = cuda.calls
    write_json(args.out, out)
    return 0


# ----------------------------------------------------------------------------------- load


class _Stop:
    def __init__(self, stop_file: str | None, deadline: float) -> None:
        self.flag = False
        self.stop_file = stop_file
        self.deadline = deadline
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, *_: Any) -> None:
        self.flag = True

    def __bool__(self) -> bool:
        if self.flag or time.monotonic() >= self.deadline:
            return True
        return bool(self.stop_file and os.path.exists(self.stop_file))


def _gpus(spec: str, count: int) -> list[int]:
    if spec in ("", "all"):
        return list(range(count))
    return [int(x) for x in spec.split(",") if x.strip() and int(x) < count]


def _load_torch(args: argparse.Namespace, out: dict[str, Any], stop: _Stop) -> None:
    import torch

    out["torch"] = torch.__version__
    devs = _gpus(args.gpus, torch.cuda.device_count())
    if not devs:
        raise RuntimeError("torch sees no CUDA device")
    n = args.size
    mats = []
    for d in devs:
        dev = torch.device("cuda", d)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        mats.append((a, b, torch.empty(n, n, device=dev, dtype=torch.bfloat16)))
    for a, b, c in mats:
        torch.matmul(a, b, out=c)
    for d in devs:
        torch.cuda.synchronize(d)
    _ready(args, out, "torch bf16 matmul", devs)
    rounds, start = 0, time.monotonic()
    while not stop:
        for _ in range(args.batch):
            for a, b, c in mats:
                torch.matmul(a, b, out=c)
        for d in devs:
            torch.cuda.synchronize(d)
        rounds += args.batch
    _done(out, start, rounds, 2.0 * n ** 3)


def _load_cupy(args: argparse.Namespace, out: dict[str, Any], stop: _Stop) -> None:
    import cupy as cp

    out["cupy"] = cp.__version__
    devs = _gpus(args.gpus, cp.cuda.runtime.getDeviceCount())
    if not devs:
        raise RuntimeError("cupy sees no CUDA device")
    n = args.size
    mats = []
    for d in devs:
        with cp.cuda.Device(d):
            a = cp.random.random((n, n), dtype=cp.float32).astype(cp.float16)
            b = cp.random.random((n, n), dtype=cp.float32).astype(cp.float16)
            mats.append((d, a, b, cp.empty((n, n), dtype=cp.float16)))
    for d, a, b, c in mats:
        with cp.cuda.Device(d):
            cp.matmul(a, b, out=c)
    for d in devs:
        cp.cuda.Device(d).synchronize()
    _ready(args, out, "cupy fp16 matmul", devs)
    rounds, start = 0, time.monotonic()
    while not stop:
        for _ in range(args.batch):
            for d, a, b, c in mats:
                with cp.cuda.Device(d):
                    cp.matmul(a, b, out=c)
        for d in devs:
            cp.cuda.Device(d).synchronize()
        rounds += args.batch
    _done(out, start, rounds, 2.0 * n ** 3)


def _load_cuda(args: argparse.Namespace, out: dict[str, Any], stop: _Stop) -> None:
    cuda = Cuda()
    out["cuda"] = cuda.init()
    devs = _gpus(args.gpus, out["cuda"]["device_count"])
    if not devs:
        raise RuntimeError("libcuda sees no device")
    work = []
    for ordinal in devs:
        dev, info = cuda.device(ordinal)
        ctx = cuda.context(dev)
        fn = cuda.function(SPIN_PTX.format(version=PTX_VERSION, target=ptx_target(info)), "slurmgpu_spin")
        buf = ctypes.c_uint64()
        cuda.call("cuMemAlloc_v2", ctypes.byref(buf), ctypes.c_size_t(4096))
        blocks = max(1, info.get("sm_count", 80)) * 8
        work.append((ctx, fn, [ctypes.c_uint64(buf.value), ctypes.c_uint32(args.spin_iters)], blocks))
    _ready(args, out, "CUDA driver API FP32 FMA spin kernel (PTX)", devs)
    rounds, start = 0, time.monotonic()
    while not stop:
        for ctx, fn, params, blocks in work:
            cuda.call("cuCtxSetCurrent", ctx, log=False)
            cuda.launch(fn, blocks, 256, params, log=rounds == 0)
        for ctx, *_ in work:
            cuda.call("cuCtxSetCurrent", ctx, log=False)
            cuda.call("cuCtxSynchronize", log=False)
        rounds += 1
    _done(out, start, rounds, 0.0)
    out["launch_rounds"] = rounds
    out["calls"] = cuda.calls[:50]


def _ready(args: argparse.Namespace, out: dict[str, Any], method: str, devs: list[int]) -> None:
    out.update(method=method, gpus=devs, ready_at=time.time())
    write_json(args.ready, {"method": method, "gpus": devs, "time": time.time()})


def _done(out: dict[str, Any], start: float, rounds: int, flop: float) -> None:
    elapsed = time.monotonic() - start
    out["load_seconds"] = round(elapsed, 3)
    out["iterations_per_gpu"] = rounds
    if flop and elapsed > 0:
        out["tflops_per_gpu"] = round(rounds * flop / elapsed / 1e12, 1)


def cmd_load(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"requested_method": args.method, "attempts": {}}
    stop = _Stop(args.stop_file, time.monotonic() + args.seconds)
    order = ["torch", "cupy", "cuda"] if args.method == "auto" else [args.method]
    runners = {"torch": _load_torch, "cupy": _load_cupy, "cuda": _load_cuda}
    for name in order:
        if stop:
            break
        try:
            runners[name](args, out, stop)
            out["attempts"][name] = "ok"
            break
        except ImportError as exc:
            out["attempts"][name] = f"not importable: {exc}"
        except Exception as exc:
            out["attempts"][name] = f"{type(exc).__name__}: {exc}"[:500]
            if "method" in out:  # it ran and then failed: keep what it measured
                break
    else:
        out["load"] = "unavailable"
    out.setdefault("load", "ran" if "method" in out else "unavailable")
    write_json(args.out, out)
    return 0 if out["load"] == "ran" else 3


# ----------------------------------------------------------------------------- sim-inject


def cmd_sim_inject(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"time": time.time()}
    scenario = json.loads(Path(args.scenario).read_text())
    if args.xid is not None:
        out["event_ids"] = sim_events(args.scenario, add=[{"gpu": args.gpu, "type": EVENT_XID, "data": args.xid}])
        out["nvml_event"] = {"gpu": args.gpu, "xid": args.xid}
    if args.kmsg:
        bus = scenario["gpus"][args.gpu]["pci"]["bus_id"]
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from slurmgpu.sources.kmsg import append_xid

        append_xid(args.kmsg, bus, args.xid if args.xid is not None else 31,
                   "simulated by bench/real_gpu.sh --sim (MMU Fault: ENGINE GRAPHICS)")
        out["kmsg"] = {"path": args.kmsg, "pci_bus_id": bus}
    write_json(args.out, out)
    return 0


# ------------------------------------------------------------------------------ kmsg-xids


def cmd_kmsg_xids(args: argparse.Namespace) -> int:
    """What slurmgpu's own kernel-log reader (the epilog's) finds since ``--since``."""
    from slurmgpu.sources.kmsg import pci_key, read_xids

    by_pci = {}
    with contextlib.suppress(Exception):
        nvml = load_pynvml()
        nvml.nvmlInit()
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                key = pci_key(text(nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId))
                if key:
                    by_pci[key] = i
        finally:
            nvml.nvmlShutdown()
    start = time.perf_counter()
    events = read_xids(args.path, by_pci, since=args.since)
    write_json(args.out, {"path": args.path, "since": args.since, "gpus_by_pci": len(by_pci),
                          "read_ms": ms(time.perf_counter() - start),
                          "xids": [{"xid": e.xid, "gpu": e.gpu, "timestamp": e.timestamp, "source": e.source}
                                   for e in events]})
    return 0


# ----------------------------------------------------------------------- footprint / spool


def read_spool(spool_dir: str) -> tuple[list[dict[str, Any]], str | None]:
    """Every row of <spool_dir>/spool.db (a copy is opened: the WAL may still be there)."""
    src = Path(spool_dir) / "spool.db"
    if not src.exists():
        return [], f"no spool at {src}"
    try:
        import msgpack
    except ImportError:
        msgpack = None
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{src}{suffix}").exists():
                shutil.copy2(f"{src}{suffix}", f"{tmp}/spool.db{suffix}")
        conn = sqlite3.connect(f"{tmp}/spool.db")
        try:
            rows = conn.execute("SELECT seq, type, created, frame FROM messages ORDER BY seq").fetchall()
        finally:
            conn.close()
    out = []
    for seq, mtype, created, frame in rows:
        item: dict[str, Any] = {"seq": seq, "type": mtype, "created": created, "bytes": len(frame)}
        if msgpack is not None:
            try:
                body = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=False).get("body") or {}
            except Exception as exc:
                body = {"decode_error": str(exc)}
            if mtype == "event":
                item.update({k: body.get(k) for k in ("kind", "gpu", "data", "verdict")})
                item["findings"] = [
                    {k: f.get(k) for k in ("check", "severity", "gpu", "message")}
                    for f in body.get("findings") or [] if isinstance(f, dict) and f.get("severity") != "OK"]
            elif mtype == "report":
                item["verdict"] = body.get("verdict")
        out.append(item)
    return out, None if msgpack is not None else "msgpack not importable: event kinds unknown"


def _bucket(messages: list[dict[str, Any]], t0: float | None, t1: float | None) -> dict[str, Any]:
    chosen = [m for m in messages if (t0 is None or m["created"] >= t0) and (t1 is None or m["created"] < t1)]
    by_type: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for m in chosen:
        by_type[m["type"]] = by_type.get(m["type"], 0) + 1
        if m["type"] == "event":
            kinds[str(m.get("kind"))] = kinds.get(str(m.get("kind")), 0) + 1
    out: dict[str, Any] = {"messages": len(chosen), "by_type": by_type, "events_by_kind": kinds,
                           "bytes": sum(m["bytes"] for m in chosen)}
    if t0 is not None and t1 is not None and t1 > t0:
        out["messages_per_s"] = round(len(chosen) / (t1 - t0), 2)
        out["events_per_s"] = round(by_type.get("event", 0) / (t1 - t0), 2)
    return out


def cmd_footprint(args: argparse.Namespace) -> int:
    meta = read_json(args.meta, {})
    phases = {}
    for path in args.phase or []:
        data = read_json(path)
        if data:
            phases[data["label"]] = data
    messages, spool_note = read_spool(args.spool_dir)
    out: dict[str, Any] = {"agent": meta, "phases": {}}
    for label, data in phases.items():
        data = dict(data)
        data["spool"] = _bucket(messages, data.get("t_start"), data.get("t_end"))
        out["phases"][label] = data
    load = read_json(args.load)
    if load is not None:
        out["load"] = load
    elif args.load_note:
        out["load"] = {"load": "skipped", "reason": args.load_note}
    out["spool_total"] = _bucket(messages, None, None)
    out["spool_total"]["note"] = spool_note
    if meta.get("started_at") and meta.get("stopped_at"):
        out["spool_total"]["over_agent_life_s"] = round(meta["stopped_at"] - meta["started_at"], 1)
    final = read_json(args.final)
    if final:
        out["agent_final"] = final
        if final.get("cpu_s") is not None and meta.get("started_at"):
            life = final["time"] - meta["started_at"]
            out["agent_final"]["cpu_pct_of_one_core_over_life"] = round(100 * final["cpu_s"] / life, 2) if life > 0 else None
    write_json(args.out, out)
    if args.messages_out:
        slim = [{k: v for k, v in m.items() if k != "findings" or m.get("kind") not in ("clock",)} for m in messages]
        if len(slim) > 3000:  # keep the fixture small: every non-clock message, a sample of the clock ones
            keep = [m for m in slim if m.get("kind") != "clock"]
            clock = [m for m in slim if m.get("kind") == "clock"]
            slim = sorted(keep + clock[:500] + clock[-500:], key=lambda m: m["seq"])
        write_json(args.messages_out, {"messages": slim, "total": len(messages)})
    return 0


def cmd_xid_report(args: argparse.Namespace) -> int:
    provoke = read_json(args.provoke, {})
    out: dict[str, Any] = {"mode": args.mode, "provocation": provoke or {"skipped": True, "reason": args.note}}
    if args.note and not provoke.get("provoked"):
        out["note"] = args.note
    msgs = read_json(args.messages, {}).get("messages", [])
    since = provoke.get("launched_at") or provoke.get("time")
    events = [m for m in msgs if m.get("type") == "event" and m.get("kind") not in ("clock",)]
    out["agent_events"] = events
    out["agent_xid_events"] = [m for m in events if m.get("kind") == "xid"]
    if since:
        out["agent_xid_events_after_provocation"] = [m for m in out["agent_xid_events"]
                                                     if m.get("created", 0) >= since - 1]
        found = out["agent_xid_events_after_provocation"]
        if found:
            out["agent_event_latency_s"] = round(found[0]["created"] - since, 3)
    kmsg = read_json(args.kmsg_reader)
    if kmsg is not None:
        out["slurmgpu_kmsg_reader"] = kmsg
    if args.dmesg and Path(args.dmesg).exists():
        lines = Path(args.dmesg).read_text(errors="replace").splitlines()
        out["kernel_log_xid_lines"] = [ln for ln in lines if "xid" in ln.lower() and not ln.startswith("#")][-20:]
    check = read_json(args.check)
    if check is not None:
        out["check"] = {"verdict": check.get("verdict"), "exit_code": check.get("exit_code"),
                        "xid_findings": [f for f in check.get("findings", [])
                                         if str(f.get("check", "")).startswith("xid")]}
    elif args.check and Path(args.check).exists():
        out["check"] = {"unparsed_output": Path(args.check).read_text(errors="replace")[-2000:]}
    write_json(args.out, out)
    return 0


# -------------------------------------------------------------------------------- summary


def _fmt(value: Any, unit: str = "") -> str:
    if value is None or value == "":
        return "—"
    return f"{value}{unit}"


def _probe_value(res: dict[str, Any]) -> str:
    if not res:
        return "—"
    if res.get("ok"):
        value = res.get("value")
        if isinstance(value, list) and value and isinstance(value[0], dict) and "nvmlReturn" in value[0]:
            return ", ".join(f"{v['field']}: " + (f"{v.get('value')}" if v["nvmlReturn"] == 0
                                                  else f"return {v['nvmlReturn']} ({v.get('error', '')})")
                             for v in value)
        if isinstance(value, dict) and "mask" in value:
            return f"{value['mask']}: {' '.join(value['types'])}"
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items() if k != "version")
        return f"`{str(value)[:160]}`"
    return f"**{res.get('error')}** {(res.get('message') or '')[:100]}"


def cmd_summary(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    env = read_json(d / "env.json", {})
    lines = [f"# Real GPU run: {env.get('host', '?')} ({env.get('mode', '?')} mode), {env.get('date', '')}", ""]
    gpu_line = env.get("gpus") or "—"
    lines += [f"- GPUs: {gpu_line}",
              f"- driver {_fmt(env.get('driver_version'))}, CUDA {_fmt(env.get('cuda_version'))}, "
              f"kernel {_fmt(env.get('kernel'))}, {_fmt(env.get('cpus'))} CPUs",
              f"- Python for slurmgpu: {_fmt(env.get('python'))} ({_fmt(env.get('python_setup'))}); "
              f"nvidia-ml-py {_fmt(env.get('nvidia_ml_py'))}; slurmgpu commit {_fmt(env.get('git_commit'))} "
              f"(sources sha256 {_fmt(env.get('source_sha256'))}, {_fmt(env.get('git_modified_files'))} modified files)",
              f"- durations: idle {_fmt(env.get('idle_s'), ' s')}, load {_fmt(env.get('load_s'), ' s')}, "
              f"agent interval_s {_fmt(env.get('agent_interval_s'))}", ""]
    if env.get("mode") == "sim":
        lines += ["**Simulated run** (`--sim`): the fake libnvidia-ml.so.1, scenario "
                  f"`{env.get('sim_scenario')}`. No nvidia-smi, no GPU load, no real XID: these "
                  "numbers test the script, not a GPU.", ""]

    # Timings
    timings = read_json(d / "timings.json", {})
    lines += ["## Timings (whole process, wall ms)", "",
              "| what | runs | min | p50 | p90 | max | exit codes | notes |", "|---|---|---|---|---|---|---|---|"]
    for row in timings.get("rows", []):
        if "error" in row:
            lines.append(f"| {row.get('name')} | — | — | — | — | — | — | {row['error']} |")
            continue
        notes = []
        if row.get("record_paths"):
            notes.append("path " + ", ".join(f"{k} ({v}x)" for k, v in row["record_paths"].items()))
        if row.get("record_verdicts"):
            notes.append("verdict " + ", ".join(f"{k} ({v}x)" for k, v in row["record_verdicts"].items()))
        if row.get("note"):
            notes.append(row["note"])
        codes = ", ".join(f"{k} ({v}x)" for k, v in (row.get("exit_codes") or {}).items())
        lines.append(f"| {row.get('name')} | {row.get('n')} | {_fmt(row.get('min_ms'))} | "
                     f"**{_fmt(row.get('p50_ms'))}** | {_fmt(row.get('p90_ms'))} | {_fmt(row.get('max_ms'))} | "
                     f"{codes} | {'; '.join(notes)} |")
    for skipped in timings.get("skipped", []):
        lines.append(f"| {skipped.get('name')} | — | — | — | — | — | — | skipped: {skipped.get('reason')} |")
    lines.append("")

    # Footprint
    fp = read_json(d / "footprint.json", {})
    lines += ["## Agent footprint and NVML clock events", ""]
    if fp:
        lines += ["| phase | seconds | raw clock events/s per GPU (max one GPU) | agent messages (events by kind) "
                  "| agent msgs/s | agent CPU (of one core) | agent RSS peak / VmHWM |",
                  "|---|---|---|---|---|---|---|"]
        for label, ph in fp.get("phases", {}).items():
            ce = ph.get("clock_events") or {}
            raw = (f"{_fmt(ce.get('per_s_per_gpu'))} ({_fmt(ce.get('max_per_s_one_gpu'))}); "
                   f"{ce.get('total', '—')} in all") if ce else "not counted"
            if ce.get("error"):
                raw = f"error: {ce['error']}"
            sp = ph.get("spool", {})
            kinds = ", ".join(f"{k} {v}" for k, v in sp.get("events_by_kind", {}).items())
            types = ", ".join(f"{k} {v}" for k, v in sp.get("by_type", {}).items())
            msgs = f"{sp.get('messages', 0)}" + (f": {types}" if types else "") + (f" (events: {kinds})" if kinds else "")
            rss = ph.get("agent_rss_mb", {})
            lines.append(f"| {label} | {ph.get('seconds')} | {raw} | {msgs} | "
                         f"{_fmt(sp.get('messages_per_s'))} | {_fmt(ph.get('agent_cpu_pct_of_one_core'), ' %')} | "
                         f"{_fmt(rss.get('peak_sampled'))} / {_fmt(rss.get('vmhwm'))} MB |")
        load = fp.get("load") or {}
        lines += ["", f"- load: {load.get('load', '—')}" + (f", {load.get('method')}" if load.get("method") else "")
                  + (f", {load.get('tflops_per_gpu')} TFLOP/s per GPU" if load.get("tflops_per_gpu") else "")
                  + (f", GPUs {load.get('gpus')}" if load.get("gpus") is not None else "")
                  + (f" ({load.get('reason')})" if load.get("reason") else "")
                  + (f"; attempts: {load.get('attempts')}" if load.get("attempts") else "")]
        tot = fp.get("spool_total", {})
        lines += [f"- spooled over the agent's life ({_fmt(tot.get('over_agent_life_s'), ' s')}): "
                  f"{tot.get('messages', 0)} messages, {tot.get('bytes', 0)} bytes; by type {tot.get('by_type')}; "
                  f"events by kind {tot.get('events_by_kind')}"]
        final = fp.get("agent_final") or {}
        if final:
            lines.append(f"- agent at the end: VmHWM {_fmt(final.get('vmhwm_mb'))} MB, VmRSS "
                         f"{_fmt(final.get('vmrss_mb'))} MB, {final.get('threads')} threads, CPU over its life "
                         f"{_fmt(final.get('cpu_pct_of_one_core_over_life'), ' %')}")
    else:
        lines.append("not measured (see steps below)")
    lines.append("")

    # XID
    xid = read_json(d / "xid.json", {})
    lines += ["## Application XID", ""]
    if xid:
        pv = xid.get("provocation") or {}
        if pv.get("provoked"):
            lines.append(f"- provoked on GPU {pv.get('gpu')} ({(pv.get('device') or {}).get('pci_bus_id')}): "
                         f"store to {pv.get('address')}, cuCtxSynchronize → {pv.get('sync_result')}")
        else:
            lines.append(f"- not provoked: {pv.get('reason') or pv.get('error') or xid.get('note') or pv.get('sync_result')}")
        if xid.get("note") and pv.get("provoked"):
            lines.append(f"- {xid['note']}")
        found = xid.get("agent_xid_events", [])
        lines.append(f"- agent XID events: {len(found)}"
                     + (f", the first {xid['agent_event_latency_s']} s after the fault"
                        if "agent_event_latency_s" in xid else "")
                     + "".join(f"; kind {e.get('kind')} gpu {e.get('gpu')} data {e.get('data')} "
                               f"verdict {e.get('verdict')}" for e in found[:3]))
        if not xid.get("kernel_log_xid_lines"):
            lines.append("- kernel log: no XID line")
        for line in xid.get("kernel_log_xid_lines", [])[-3:]:
            lines.append(f"- kernel log: `{line.strip()[:220]}`")
        kr = xid.get("slurmgpu_kmsg_reader")
        if kr:
            lines.append(f"- slurmgpu's kmsg reader ({kr.get('path')}): "
                         + (", ".join(f"XID {x['xid']} GPU {x['gpu']}" for x in kr.get("xids", [])) or "nothing"))
        chk = xid.get("check")
        if chk:
            lines.append(f"- `slurmgpu check --xid 31:0 --json`: verdict {chk.get('verdict')}, exit "
                         f"{chk.get('exit_code')}; " + "; ".join(
                             f"{f.get('check')} {f.get('severity')}: {f.get('message')}" for f in chk.get("xid_findings", [])))
    else:
        lines.append("not run (see steps below)")
    lines.append("")

    # Probe
    probe = read_json(d / "probe.json", {})
    lines += ["## NVML calls (GPU 0)", ""]
    if probe.get("gpus"):
        lines += [f"nvidia-ml-py {probe.get('nvidia_ml_py')}; nvmlInit {_fmt((probe.get('nvmlInit') or {}).get('ms'))} ms; "
                  f"driver {_probe_value(probe.get('nvmlSystemGetDriverVersion', {}))}; first handle "
                  f"{_fmt(probe['gpus'][0].get('handle', {}).get('ms'))} ms.", "",
                  "| call | result | ms |", "|---|---|---|"]
        for name, res in probe["gpus"][0].get("calls", {}).items():
            lines.append(f"| `{name}` | {_probe_value(res).replace('|', '/')} | {_fmt(res.get('ms'))} |")
        for key, value in probe["gpus"][0].items():
            if " x" in key:
                lines.append(f"| `{key}` | {'ok' if value.get('ok') else value.get('error')} | {_fmt(value.get('ms'))} |")
        differs = probe.get("outcome_differs_from_gpu0")
        if differs:
            lines += ["", f"Calls whose outcome differs on other GPUs: {differs}"]
    else:
        lines.append(f"not available: {probe.get('import') or probe.get('nvmlInit') or 'see steps'}")
    lines.append("")

    lines += _validate_lines(d)

    # Steps
    lines += ["## Steps", "", "| step | status | seconds | note |", "|---|---|---|---|"]
    steps_file = d / "steps.jsonl"
    if steps_file.exists():
        for line in steps_file.read_text().splitlines():
            with contextlib.suppress(ValueError):
                s = json.loads(line)
                lines.append(f"| {s.get('step')} | {s.get('status')} | {s.get('seconds', '')} | "
                             f"{str(s.get('note', '')).replace('|', '/')[:200]} |")
    lines += ["", "Files: " + ", ".join(sorted(p.name for p in d.iterdir() if p.is_file())), ""]
    (d / "summary.md").write_text("\n".join(lines))
    return 0


# ------------------------------------------------------------------------------- validate


def cmd_validate_report(args: argparse.Namespace) -> int:
    """`slurmgpu validate --tier quick --json` on the node: each test's result and duration,
    the time inside the tools, and the overhead outside them (process start, CUDA context
    creation per GPU from the probe's `context` run, parsing and judging)."""
    doc = read_json(Path(args.validate), {})
    contexts = [json.loads(x) for x in Path(args.context).read_text().splitlines()
                if x.startswith("{")] if args.context and Path(args.context).is_file() else []
    tests = doc.get("tests") or []
    wall = float(args.wall)
    in_tools = sum(float(t.get("tool_s") or 0) for t in tests)
    inside = float(doc.get("duration_ms") or 0) / 1000
    out = {"verdict": doc.get("verdict"), "exit_code": doc.get("exit_code"), "tier": doc.get("tier"),
           "tests": tests, "wall_s": round(wall, 3), "validate_s": round(inside, 3),
           "process_start_s": round(wall - inside, 3), "in_tools_s": round(in_tools, 3),
           "overhead_s": round(wall - in_tools, 3),
           "overhead_pct": round(100 * (wall - in_tools) / wall, 2) if wall > 0 else None,
           "cuda_context_s_per_gpu": [c.get("seconds") for c in contexts if c.get("test") == "context"],
           "problems": [f"{f.get('check')} {f.get('severity')}: {f.get('message')}" for f in doc.get("findings", [])
                        if f.get("severity") != "OK"][:20]}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _validate_lines(d: Path) -> list[str]:
    v = read_json(d / "validate-summary.json", {})
    lines = ["## `slurmgpu validate --tier quick`", ""]
    if not v:
        return [*lines, "not run (see steps below)", ""]
    lines += [f"- verdict {v.get('verdict')} (exit {v.get('exit_code')}); wall {_fmt(v.get('wall_s'), ' s')}, "
              f"of which in the tools {_fmt(v.get('in_tools_s'), ' s')}; overhead outside them "
              f"{_fmt(v.get('overhead_s'), ' s')} ({_fmt(v.get('overhead_pct'), ' %')}): process start "
              f"{_fmt(v.get('process_start_s'), ' s')}, CUDA context per GPU {v.get('cuda_context_s_per_gpu') or '—'} s",
              "", "| test | result | seconds | in tools |", "|---|---|---|---|"]
    for t in v.get("tests", []):
        lines.append(f"| {t.get('test')} | {t.get('result')} | {t.get('duration_s')} | {t.get('tool_s')} |")
    lines += [f"- {p}" for p in v.get("problems", [])]
    return [*lines, ""]


# ------------------------------------------------------------------------------- env/deps


def cmd_deps(args: argparse.Namespace) -> int:
    """The [project] dependencies of pyproject.toml, one per line (no tomllib needed)."""
    source = Path(args.pyproject).read_text()
    match = re.search(r"^dependencies\s*=\s*\[(.*?)\]", source, re.S | re.M)
    for item in re.findall(r"\"([^\"]+)\"", match.group(1) if match else ""):
        print(item)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    out = read_json(args.out, {}) or {}
    for item in args.set or []:
        key, _, value = item.partition("=")
        out[key] = value
    for item in args.set_int or []:
        key, _, value = item.partition("=")
        with contextlib.suppress(ValueError):
            out[key] = float(value) if "." in value else int(value)
    if args.jsonl and Path(args.jsonl[1]).exists():
        out[args.jsonl[0]] = [json.loads(ln) for ln in Path(args.jsonl[1]).read_text().splitlines() if ln.strip()]
    probe = read_json(args.probe, {})
    if probe:
        out.setdefault("nvidia_ml_py", probe.get("nvidia_ml_py"))
        drv = (probe.get("nvmlSystemGetDriverVersion") or {}).get("value")
        if drv and not out.get("driver_version"):
            out["driver_version"] = drv
        cuda = (probe.get("nvmlSystemGetCudaDriverVersion_v2") or {}).get("value")
        if cuda and not out.get("cuda_version"):
            out["cuda_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        names = [((g.get("calls") or {}).get("nvmlDeviceGetName") or {}).get("value") for g in probe.get("gpus", [])]
        if names and not out.get("gpus"):
            out["gpus"] = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(map(str, names))
    write_json(args.out, out)
    return 0


# ----------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("gpu-count").set_defaults(fn=cmd_gpu_count)

    p = sub.add_parser("probe")
    p.add_argument("--out", required=True)
    p.add_argument("--all-gpus", action="store_true")
    p.add_argument("--repeat", type=int, default=100)
    p.set_defaults(fn=cmd_probe)

    p = sub.add_parser("timeit")
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--env", action="append")
    p.add_argument("--unset", action="append")
    p.add_argument("--job-id-base", type=int)
    p.add_argument("--per-run-timeout", type=float, default=60.0)
    p.add_argument("--keep-stdout", action="store_true")
    p.add_argument("--note")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_timeit)

    p = sub.add_parser("merge")
    p.add_argument("--out", required=True)
    p.add_argument("--meta")
    p.add_argument("--skipped")
    p.add_argument("files", nargs="*")
    p.set_defaults(fn=cmd_merge)

    p = sub.add_parser("wait-agent")
    p.add_argument("--socket", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--pid", type=int)
    p.add_argument("--log")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--events-timeout", type=float, default=15.0)
    p.set_defaults(fn=cmd_wait_agent)

    p = sub.add_parser("phase")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sample-s", type=float, default=0.5)
    p.add_argument("--clock-events", action="store_true")
    p.set_defaults(fn=cmd_phase)

    p = sub.add_parser("proc")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_proc)

    p = sub.add_parser("load")
    p.add_argument("--seconds", type=float, required=True, help="upper bound; --stop-file/SIGTERM end it earlier")
    p.add_argument("--ready", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--gpus", default="all")
    p.add_argument("--method", choices=["auto", "torch", "cupy", "cuda"], default="auto")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--spin-iters", type=int, default=1 << 19)
    p.set_defaults(fn=cmd_load)

    p = sub.add_parser("xid")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--addr", default="0xdead00000000")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_xid)

    p = sub.add_parser("sim-inject")
    p.add_argument("--scenario", required=True)
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--xid", type=int)
    p.add_argument("--kmsg")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_sim_inject)

    p = sub.add_parser("sim-load")
    p.add_argument("--scenario", required=True)
    p.add_argument("--gpus", default="all")
    p.add_argument("--off", action="store_true")
    p.add_argument("--out")
    p.set_defaults(fn=cmd_sim_load)

    p = sub.add_parser("kmsg-xids")
    p.add_argument("--path", required=True)
    p.add_argument("--since", type=float)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_kmsg_xids)

    p = sub.add_parser("footprint")
    p.add_argument("--spool-dir", required=True)
    p.add_argument("--meta")
    p.add_argument("--phase", action="append")
    p.add_argument("--load")
    p.add_argument("--load-note")
    p.add_argument("--final")
    p.add_argument("--out", required=True)
    p.add_argument("--messages-out")
    p.set_defaults(fn=cmd_footprint)

    p = sub.add_parser("xid-report")
    p.add_argument("--mode", default="real")
    p.add_argument("--provoke")
    p.add_argument("--messages")
    p.add_argument("--kmsg-reader")
    p.add_argument("--dmesg")
    p.add_argument("--check")
    p.add_argument("--note")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_xid_report)

    p = sub.add_parser("summary")
    p.add_argument("--dir", required=True)
    p.set_defaults(fn=cmd_summary)

    p = sub.add_parser("validate-report")
    p.add_argument("--validate", required=True)
    p.add_argument("--wall", required=True)
    p.add_argument("--context")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_validate_report)

    p = sub.add_parser("deps")
    p.add_argument("pyproject")
    p.set_defaults(fn=cmd_deps)

    p = sub.add_parser("env")
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append")
    p.add_argument("--set-int", action="append")
    p.add_argument("--jsonl", nargs=2, metavar=("KEY", "FILE"))
    p.add_argument("--probe")
    p.set_defaults(fn=cmd_env)

    args = parser.parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
