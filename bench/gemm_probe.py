"""What the built-in GEMM test measures, next to the raw matrix-product rate (GPU only).

    python bench/gemm_probe.py [--backend auto|cupy|torch] [--seconds 3]

Per dtype of the backend: the raw rate (back-to-back products, one sync at the end), the
time of one product digest, and the rate `slurmgpu.validate.probe.gemm_one` reports (the
products plus their digests), with the SM clock, power and clock-event reasons NVML read
right after each. Prints one JSON object. docs/benchmarks.md has the numbers of a real H100.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.validate import probe


def nvml_state() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "reasons": hex(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))}
    except Exception as exc:
        return {"nvml": str(exc)}


def raw_rate(b: probe.CupyBackend, dtype: str, seconds: float) -> dict[str, Any]:
    x, y = b.gemm_inputs(0, dtype)
    with b.on(0):
        out = b.matmul(x, y, None)
        for _ in range(3):
            b.matmul(x, y, out)
        b.sync(0)
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for _ in range(8):
                b.matmul(x, y, out)
            b.sync(0)
            runs += 8
        elapsed = time.perf_counter() - started
        state = nvml_state()
        digest_started = time.perf_counter()
        for _ in range(5):
            b.product_digest(out)
        b.sync(0)
        digest_ms = (time.perf_counter() - digest_started) / 5 * 1000
    return {"raw_tflops": round(2 * probe.GEMM_N**3 * runs / elapsed / 1e12, 1),
            "digest_ms": round(digest_ms, 2), "product_ms": round(elapsed / runs * 1000, 3),
            "nvml_after_raw": state}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["auto", "cupy", "torch"], default="auto")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    b = {"auto": probe.backend, "cupy": probe.CupyBackend, "torch": probe.TorchBackend}[args.backend]()
    rows = []
    for dtype in b.dtypes:
        row = {"backend": b.name, "dtype": dtype, **raw_rate(b, dtype, args.seconds)}
        row["probe_tflops"] = probe.gemm_one(b, 0, dtype, args.seconds)["tflops"]
        row["nvml_after_probe"] = nvml_state()
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"gpu": b.device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
