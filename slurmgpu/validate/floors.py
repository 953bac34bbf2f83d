"""Built-in floors per GPU model: the value below which a measurement fails when the
host's ``[validate]`` sets none. Deliberately loose (about 70-80 % of what a healthy part
measures in the field): they catch a part at a fraction of its speed, not a tuning
question; site thresholds from `slurmgpu validate baseline` are the tight ones. GEMM is
the probe's first dtype (bf16, or fp16 with CuPy: one Tensor Core rate on these parts) in
dense TFLOP/s sustained at the power cap, HBM the copy kernel's read+write GB/s, PCIe
pinned host<->device GB/s per direction, P2P one direction per GPU pair, NCCL all-reduce
bus bandwidth (8 GPUs)."""

from __future__ import annotations

from dataclasses import dataclass

#: metric -> the [validate] key that overrides its floor
SETTING = {"gemm_tflops": "gemm_tflops", "hbm_gbps": "hbm_gbps", "pcie_gbps": "pcie_gbps",
           "p2p_gbps": "p2p_gbps", "nccl_busbw_gbps": "nccl_busbw_gbps", "ib_gbps": "ib_gbps"}

# (substring of the NVML name, floors); the first match wins.
_MODELS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"gemm_tflops": 500.0, "hbm_gbps": 3000.0, "pcie_gbps": 40.0, "p2p_gbps": 250.0,
              "nccl_busbw_gbps": 350.0}),
    ("H100 80GB HBM3", {"gemm_tflops": 500.0, "hbm_gbps": 2200.0, "pcie_gbps": 40.0,
                        "p2p_gbps": 250.0, "nccl_busbw_gbps": 350.0}),
    # (the A100s' HBM floors follow from their peaks: docs/validation.md, "Thresholds and tuning")
    ("A100-SXM4-40GB", {"gemm_tflops": 200.0, "hbm_gbps": 1000.0, "pcie_gbps": 18.0, "p2p_gbps": 160.0,
                        "nccl_busbw_gbps": 160.0}),
    ("A100-SXM4", {"gemm_tflops": 200.0, "hbm_gbps": 1300.0, "pcie_gbps": 18.0, "p2p_gbps": 160.0,
                   "nccl_busbw_gbps": 160.0}),
)


@dataclass(frozen=True)
class Floor:
    value: float
    source: str  # "[validate] pcie_gbps" or "built-in floor for <model>"


def builtin(model: str | None, metric: str) -> Floor | None:
    for key, floors in _MODELS:
        if model and key in model and metric in floors:
            return Floor(floors[metric], f"built-in floor for {model}")
    return None


def floor_for(configured: float | None, model: str | None, metric: str) -> Floor | None:
    """The host's threshold when set, else the model's built-in floor, else none."""
    if configured is not None:
        return Floor(float(configured), f"[validate] {SETTING.get(metric, metric)}")
    return builtin(model, metric)
