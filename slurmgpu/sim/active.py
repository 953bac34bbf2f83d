"""The simulator's active-test tools: ``python -m slurmgpu.sim.active TOOL ARGS...``
plays ``all_reduce_perf``, ``dcgmi``, ``ib_write_bw``, ``nvbandwidth`` or the built-in
probe (``probe TEST``) on the node of ``$SLURMGPU_SIM_SCENARIO``, reading its ``active``
section (docs/simulator.md) and printing what the real tool prints (the formats of the
samples under tests/data/validate/), so `slurmgpu validate` parses and judges it as on a
real node. ``"hang": TEST`` makes that test's tool start a child and sleep until killed
(their pids go to ``$SLURMGPU_SIM_HANG_PIDFILE`` when set)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

DIGEST = hashlib.sha256(b"slurmgpu-validate-gemm-bf16").hexdigest()[:32]
WRONG = hashlib.sha256(b"a wrong product").hexdigest()[:32]
TEST_OF = {"all_reduce_perf": "nccl", "dcgmi": "dcgm", "ib_write_bw": "ib", "nvbandwidth": "p2p"}
# A healthy part of each model (no ``active`` section: every GPU measures these).
DEFAULTS = {"gemm_tflops": 700.0, "hbm_gbps": 2900.0, "pcie_gbps": 53.0, "p2p_gbps": 370.0,
            "nccl_busbw_gbps": 480.0}
A100 = {"gemm_tflops": 270.0, "hbm_gbps": 1650.0, "pcie_gbps": 24.0, "p2p_gbps": 230.0,
        "nccl_busbw_gbps": 230.0}
H200 = {**DEFAULTS, "hbm_gbps": 4000.0}


def _scenario() -> dict[str, Any]:
    with open(os.environ["SLURMGPU_SIM_SCENARIO"], encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


class Node:
    def __init__(self, scenario: dict[str, Any]) -> None:
        self.active: dict[str, Any] = scenario.get("active") or {}
        names = [str(g.get("name", "GPU")) for g in scenario.get("gpus", [])]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.gpus = [int(x) for x in visible.split(",") if x.strip()] if visible else list(range(len(names)))
        self.names = names
        model = names[0] if names else ""
        self.defaults = A100 if "A100" in model else H200 if "H200" in model else DEFAULTS

    def value(self, gpu: int, key: str) -> Any:
        per_gpu = (self.active.get("gpus") or {}).get(str(gpu)) or {}
        return per_gpu.get(key, self.active.get(key, self.defaults.get(key)))

    def pair(self, src: int, dst: int) -> float:
        pairs = self.active.get("p2p_pairs") or {}
        for key in (f"{src}-{dst}", f"{dst}-{src}"):
            if key in pairs:
                return float(pairs[key])
        return float(min(self.value(src, "p2p_gbps"), self.value(dst, "p2p_gbps")))


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


# ------------------------------------------------------------------ the probe


def probe(node: Node, test: str) -> int:
    for ordinal, gpu in enumerate(node.gpus):
        base = {"test": test, "gpu": ordinal, "name": node.names[gpu]}
        error = node.value(gpu, "cuda_error")
        if error and test in ("gemm", "hbm", "pcie"):  # (the real probe's line for a GPU it broke on)
            _emit({"test": test, "gpu": ordinal, "error": str(error), "cuda": not str(error).startswith("TypeError")})
        elif test == "gemm":
            wrong = node.value(gpu, "wrong_result")
            digests = [DIGEST, WRONG] if wrong == "sometimes" else [WRONG] if wrong else [DIGEST]
            tflops = float(node.value(gpu, "gemm_tflops"))
            _emit({**base, "dtype": "bf16", "tflops": tflops, "digests": digests, "iterations": 640})
            _emit({**base, "dtype": "fp32", "tflops": round(tflops / 14, 2), "digests": [DIGEST[::-1]],
                   "iterations": 48})
        elif test == "hbm":
            _emit({**base, "copy_gbps": node.value(gpu, "hbm_gbps"), "checked_bytes": 8 << 30,
                   "mismatches": int(node.value(gpu, "hbm_mismatches") or 0)})
        elif test == "pcie":
            gbps = node.value(gpu, "pcie_gbps")
            _emit({**base, "h2d_gbps": gbps, "d2h_gbps": round(gbps * 1.02, 2)})
    if test == "p2p":
        for a, src in enumerate(node.gpus):
            for b, dst in enumerate(node.gpus):
                if a != b:
                    _emit({"test": "p2p", "src": a, "dst": b, "gbps": node.pair(src, dst)})
    if test == "nccl":
        _emit({"test": "nccl", "gpus": len(node.gpus), "busbw_gbps": node.value(node.gpus[0], "nccl_busbw_gbps")})
    return 0


# ------------------------------------------------------------------ nvbandwidth


def nvbandwidth(node: Node) -> int:
    gpus = node.gpus
    print("nvbandwidth Version: v0.8\nBuilt from Git version: v0.8\n")
    print("CUDA Runtime Version: 12040\nCUDA Driver Version: 12040\nDriver Version: 550.90.07\n")
    for ordinal, gpu in enumerate(gpus):
        print(f"Device {ordinal}: {node.names[gpu]}")
    print("\nRunning device_to_device_memcpy_read_ce.")
    print("memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)")
    print("    " + "".join(f"{i:>10}" for i in range(len(gpus))))
    total = 0.0
    for a, src in enumerate(gpus):
        cells = []
        for b, dst in enumerate(gpus):
            value = node.pair(src, dst) if a != b else None
            total += value or 0.0
            cells.append(f"{value:>10.2f}" if value is not None else f"{'N/A':>10}")
        print(f"{a:>2}  " + "".join(cells))
    print(f"\nSUM device_to_device_memcpy_read_ce {total:.2f}")
    return 0


# ------------------------------------------------------------------ all_reduce_perf


def all_reduce_perf(node: Node) -> int:
    n = len(node.gpus)
    busbw = float(node.value(node.gpus[0], "nccl_busbw_gbps"))
    wrong = int(node.active.get("nccl_wrong") or 0)
    print(f"# nThread 1 nGpus {n} minBytes 268435456 maxBytes 1073741824 step: 2(factor) warmup iters: 5 "
          "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices")
    for ordinal, gpu in enumerate(node.gpus):
        print(f"#  Rank {ordinal:>2} Group  0 Pid  4242 on    simnode device {ordinal:>2} [0x{gpu:02x}] {node.names[gpu]}")
    print("#\n#{:>62}{:>35}".format("out-of-place", "in-place"))
    print("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
          "algbw   busbw #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
          "(GB/s)  (GB/s)       ")
    for size in (268435456, 536870912, 1073741824):
        algbw = busbw * n / (2 * (n - 1)) if n > 1 else busbw
        us = size / (algbw * 1e3)
        print(f"{size:>12} {size // 4:>13}     float     sum      -1 {us:>8.1f} {algbw:>7.2f} {busbw:>7.2f} "
              f"{wrong:>6} {us:>8.1f} {algbw:>7.2f} {busbw:>7.2f} {0:>6}")
    print(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {busbw:.4f} \n#")
    return 0


# ------------------------------------------------------------------ dcgmi diag -r N -j


def _dcgm_test(name: str, gpus: list[int], failures: list[dict[str, Any]]) -> dict[str, Any]:
    results = []
    for gpu in gpus:
        bad = [f for f in failures if f.get("test") == name and f.get("gpu") in (None, gpu)]
        result: dict[str, Any] = {"entity_group": "GPU", "entity_id": gpu, "status": "Pass"}
        if bad:
            result["status"] = str(bad[0].get("status", "Fail"))
            result["warnings"] = [{"error_category": 1, "error_id": int(f.get("error_id", 95)),
                                   "error_severity": 2, "warning": str(f.get("warning", ""))} for f in bad]
        results.append(result)
    summary = "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"
    return {"name": name, "results": results, "test_summary": {"status": summary}}


def dcgmi(node: Node, argv: list[str]) -> int:
    level = int(argv[argv.index("-r") + 1]) if "-r" in argv else 1
    gpus = [int(x) for x in argv[argv.index("-i") + 1].split(",")] if "-i" in argv else node.gpus
    failures = list(node.active.get("dcgm") or [])
    categories = [("Deployment", ["software"])]
    if level >= 2:
        categories += [("Integration", ["pcie"]), ("Hardware", ["memory"])]
    if level >= 3:
        categories += [("Stress", ["targeted_stress", "targeted_power", "memory_bandwidth"])]
    named = {f.get("test") for f in failures} - {t for _, tests in categories for t in tests}
    if named:
        categories.append(("Hardware", sorted(str(t) for t in named)))
    doc = {"DCGM Diagnostic": {"test_categories": [
        {"category": c, "tests": [_dcgm_test(t, gpus, failures) for t in tests]} for c, tests in categories]},
        "metadata": {"version": "4.2.3", "Driver Version Detected": "550.90.07"}}
    print(json.dumps(doc, indent=3))
    return 226 if failures else 0


# ------------------------------------------------------------------ ib_write_bw


def ib_write_bw(node: Node, argv: list[str]) -> int:
    device = argv[argv.index("-d") + 1] if "-d" in argv else "mlx5_0"
    print("---------------------------------------------------------------------------------------")
    print("                    RDMA_Write BW Test")
    print(f" Dual-port       : OFF\t\tDevice         : {device}")
    print(" Number of qps   : 1\t\tTransport type : IB\n Connection type : RC\t\tUsing SRQ      : OFF")
    print(" Mtu             : 4096[B]\n Link type       : IB\n rdma_cm QPs\t : OFF\n Data ex. method : Ethernet")
    print("---------------------------------------------------------------------------------------")
    if argv and not argv[-1].startswith("-") and argv[-1] in ("localhost", "127.0.0.1"):  # the client
        ports = node.active.get("ib") or {}
        peer = sorted(ports)[(sorted(ports).index(device) - 1) % len(ports)] if device in ports else device
        gbps = min(float(ports.get(device, 0.0)), float(ports.get(peer, 0.0)))
        print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
        print(f" 65536      {int(gbps * 1e9 / 8 / 65536 * 2):<10}       {gbps * 1.01:.2f}            "
              f"{gbps:.2f}\t\t   {gbps * 1e3 / 8 / 65536:.6f}")
        print("---------------------------------------------------------------------------------------")
    return 0


# ------------------------------------------------------------------ hang, main


def hang() -> int:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    pidfile = os.environ.get("SLURMGPU_SIM_HANG_PIDFILE")
    if pidfile:
        with open(pidfile, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {child.pid}\n")
    time.sleep(3600)
    return 1


def _test(argv: list[str]) -> str:
    return argv[1] if argv[0] == "probe" and len(argv) > 1 else TEST_OF.get(argv[0], "?")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m slurmgpu.sim.active TOOL ARGS...", file=sys.stderr)
        return 2
    node = Node(_scenario())
    client_side = argv[0] != "ib_write_bw" or argv[-1] in ("localhost", "127.0.0.1")
    if node.active.get("hang") == _test(argv) and client_side:
        return hang()
    if argv[0] == "probe":
        return probe(node, argv[1])
    tools = {"nvbandwidth": lambda: nvbandwidth(node), "all_reduce_perf": lambda: all_reduce_perf(node),
             "dcgmi": lambda: dcgmi(node, argv), "ib_write_bw": lambda: ib_write_bw(node, argv)}
    return tools[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
