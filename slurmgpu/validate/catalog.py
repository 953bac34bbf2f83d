"""The tests: what each runs (its tool, or the built-in probe) and how its output is
judged into ``validate.<test>`` findings. Each is ``fn(ctx) -> findings``; raising
``NotApplicable``, ``Hung``, ``ToolFailed`` or ``ParseError`` is the session's to word."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from slurmgpu.result import Finding, Severity
from slurmgpu.validate.context import Context, NotApplicable, failed
from slurmgpu.validate.judge import Measured, Metric, judge
from slurmgpu.validate.parsers import (
    DcgmResult,
    parse_dcgm,
    parse_ib_write_bw,
    parse_nccl,
    parse_nvbandwidth,
    parse_probe,
)
from slurmgpu.validate.platform import PROBE

Test = Callable[[Context], list[Finding]]
IB_PORT_BASE = 18515
IB_SERVER_WAIT_S = 0.3

HBM = Metric("validate.hbm", "hbm_gbps", "GB/s", "device memory copy")
PCIE = Metric("validate.pcie", "pcie_gbps", "GB/s", "host<->device, pinned (slower direction)")
P2P = Metric("validate.p2p", "p2p_gbps", "GB/s", "GPU to GPU")
NCCL = Metric("validate.nccl", "nccl_busbw_gbps", "GB/s", "all-reduce bus bandwidth")
IB = Metric("validate.ib", "ib_gbps", "Gb/s", "RDMA write, HCA loopback")


def _probe(ctx: Context, test: str, *extra: str) -> list[dict[str, Any]]:
    ctx.need_gpus()
    result = ctx.run([*ctx.need(PROBE), test, "--seconds", f"{ctx.burn_s:g}", *extra])
    if result.rc != 0:
        raise failed(result)
    items = [item for item in parse_probe(result.stdout) if item.get("test") == test]
    unsupported = [str(item["unsupported"]) for item in items if item.get("unsupported")]
    if unsupported:
        raise NotApplicable(unsupported[0])
    return items


def _measured(ctx: Context, test: str, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The probe's results, and a finding for each GPU without one: a CUDA error on some
    GPUs is theirs (FAIL); one on every GPU alike, another error, or no line is UNKNOWN."""
    results = [i for i in items if "error" not in i]
    errors = [i for i in items if "error" in i]
    everywhere = len({int(e["gpu"]) for e in errors}) == len(ctx.gpus)
    out = []
    for e in errors:
        gpu = ctx.gpu(int(e["gpu"])).index
        theirs = bool(e.get("cuda")) and not everywhere
        why = "could not run on this GPU" if theirs else "broke on this GPU, slurmgpu could not judge it"
        out.append(Finding(f"validate.{test}", Severity.FAIL if theirs else Severity.UNKNOWN,
                           f"gpu{gpu}: the {test} test {why}: {e['error']}"[:1000], gpu,
                           data={"error": str(e["error"]), "cuda": bool(e.get("cuda"))}))
    seen = {int(i["gpu"]) for i in items}
    out += [Finding(f"validate.{test}", Severity.UNKNOWN, f"gpu{g.index}: the probe reported no {test} result",
                    g.index) for n, g in enumerate(ctx.gpus) if n not in seen]
    return results, out


def _per_gpu(ctx: Context, items: list[dict[str, Any]], key: Callable[[dict[str, Any]], float]) -> list[Measured]:
    out = []
    for item in items:
        gpu = ctx.gpu(int(item["gpu"]))
        out.append(Measured(float(key(item)), gpu=gpu.index, model=gpu.model))
    return out


# ------------------------------------------------------------------ gemm + SDC


def _sdc_within(ctx: Context, items: list[dict[str, Any]]) -> list[Finding]:
    out = []
    for item in items:
        digests = list(item.get("digests") or [])
        iterations = int(item.get("iterations") or len(digests))
        if len(set(digests)) > 1:
            index = ctx.gpu(int(item["gpu"])).index
            out.append(Finding("validate.gemm", Severity.FAIL,
                               f"gpu{index}: the same {item.get('dtype')} product gave {len(set(digests))} different "
                               f"results over {iterations} iterations (silent data corruption)", index,
                               data={"sdc": "iterations", "dtype": item.get("dtype"), "digests": digests[:4]}))
    return out


def _sdc_across(ctx: Context, items: list[dict[str, Any]]) -> list[Finding]:
    """Per GPU model and dtype: a GPU whose product differs from the most common one."""
    groups: dict[tuple[str | None, str], list[tuple[int, str]]] = {}
    for item in items:
        part = ctx.gpu(int(item["gpu"]))
        if item.get("digests"):
            groups.setdefault((part.model, str(item.get("dtype"))), []).append((part.index, str(item["digests"][0])))
    out = []
    for (model, dtype), results in groups.items():
        reference, count = Counter(d for _, d in results).most_common(1)[0]
        for gpu, digest in results:
            if len(results) > 1 and digest != reference:
                out.append(Finding("validate.gemm", Severity.FAIL,
                                   f"gpu{gpu}: its {dtype} product differs from {count} of {len(results)} "
                                   f"{model or 'GPUs'} given the same inputs (silent data corruption)", gpu,
                                   data={"sdc": "gpus", "dtype": dtype, "digest": digest, "expected": reference}))
    return out


def _gemm_speed(ctx: Context, items: list[dict[str, Any]]) -> list[Finding]:
    """The first dtype (bf16 or fp16) against the floors, the others against the median."""
    dtypes = list(dict.fromkeys(str(i.get("dtype")) for i in items))
    out = []
    for n, dtype in enumerate(dtypes):
        metric = Metric("validate.gemm", "gemm_tflops" if n == 0 else f"gemm_{dtype}_tflops", "TFLOP/s",
                        f"{dtype} GEMM")
        same = [i for i in items if str(i.get("dtype")) == dtype]
        out += judge(metric, _per_gpu(ctx, same, lambda i: i["tflops"]), ctx.floors(metric.name),
                     ctx.settings.outlier_fraction)
    return out


def test_gemm(ctx: Context) -> list[Finding]:
    items, unmeasured = _measured(ctx, "gemm", _probe(ctx, "gemm"))
    return unmeasured + _sdc_within(ctx, items) + _sdc_across(ctx, items) + _gemm_speed(ctx, items)


# ------------------------------------------------------------------ hbm, pcie


def _bit_errors(ctx: Context, items: list[dict[str, Any]]) -> list[Finding]:
    out = []
    for item in items:
        if int(item.get("mismatches") or 0) > 0:
            gpu = ctx.gpu(int(item["gpu"])).index
            gib = int(item.get("checked_bytes") or 0) / 2**30
            out.append(Finding("validate.hbm", Severity.FAIL,
                               f"gpu{gpu}: {item['mismatches']} words read back wrong after a write/verify "
                               f"pass over {gib:.1f} GiB (memory errors)", gpu,
                               data={"mismatches": int(item["mismatches"])}))
    return out


def test_hbm(ctx: Context) -> list[Finding]:
    items, unmeasured = _measured(ctx, "hbm", _probe(ctx, "hbm", "--share", f"{ctx.knob('hbm_share'):g}"))
    speed = judge(HBM, _per_gpu(ctx, items, lambda i: i["copy_gbps"]), ctx.floors(HBM.name),
                  ctx.settings.outlier_fraction)
    return unmeasured + _bit_errors(ctx, items) + speed


def test_pcie(ctx: Context) -> list[Finding]:
    items, unmeasured = _measured(ctx, "pcie", _probe(ctx, "pcie"))
    measured = _per_gpu(ctx, items, lambda i: min(i["h2d_gbps"], i["d2h_gbps"]))
    return unmeasured + judge(PCIE, measured, ctx.floors(PCIE.name), ctx.settings.outlier_fraction)


# ------------------------------------------------------------------ p2p


def _p2p_nvbandwidth(ctx: Context, tool: list[str]) -> dict[tuple[int, int], float]:
    result = ctx.run([*tool, "-t", "device_to_device_memcpy_read_ce"])
    if result.rc != 0:
        raise failed(result)
    matrix = parse_nvbandwidth(result.stdout).get("device_to_device_memcpy_read_ce")
    if matrix is None or not matrix.pairs:
        raise NotApplicable("nvbandwidth waived the GPU-to-GPU test (no peer access)")
    return matrix.pairs


def _p2p_probe(ctx: Context) -> dict[tuple[int, int], float]:
    return {(int(i["src"]), int(i["dst"])): float(i["gbps"]) for i in _probe(ctx, "p2p")}


def test_p2p(ctx: Context) -> list[Finding]:
    ctx.need_gpus(2)
    tool = ctx.platform.tool("nvbandwidth")
    pairs = _p2p_nvbandwidth(ctx, tool) if tool else _p2p_probe(ctx)
    measured = []
    for (src, dst), gbps in sorted(pairs.items()):
        a, b = ctx.gpu(src), ctx.gpu(dst)
        measured.append(Measured(gbps, subject=f"gpu{a.index}->gpu{b.index}", model=a.model))
    return judge(P2P, measured, ctx.floors(P2P.name), ctx.settings.outlier_fraction)


# ------------------------------------------------------------------ nccl


def _nccl_tests(ctx: Context, tool: list[str]) -> tuple[float, int]:
    sizes = ["-b", "256M", "-e", "1G"] if ctx.tier == "quick" else ["-b", "512M", "-e", "8G"]
    result = ctx.run([*tool, *sizes, "-f", "2", "-g", str(len(ctx.gpus)), "-c", "1"])
    if result.rc != 0:
        raise failed(result)
    parsed = parse_nccl(result.stdout)
    return parsed.busbw, parsed.wrong


def _nccl_probe(ctx: Context) -> tuple[float, int]:
    items = _probe(ctx, "nccl")
    return float(items[0]["busbw_gbps"]), int(items[0].get("wrong") or 0)


def test_nccl(ctx: Context) -> list[Finding]:
    ctx.need_gpus(2)
    tool = ctx.platform.tool("all_reduce_perf")
    busbw, wrong = _nccl_tests(ctx, tool) if tool else _nccl_probe(ctx)
    model = ctx.gpus[0].model
    found = judge(NCCL, [Measured(busbw, subject=f"{len(ctx.gpus)} GPUs", model=model)],
                  ctx.floors(NCCL.name), ctx.settings.outlier_fraction)
    if wrong:
        found.insert(0, Finding("validate.nccl", Severity.FAIL, f"all-reduce over {len(ctx.gpus)} GPUs: "
                                f"{wrong} wrong elements (data corrupted in transfer or reduction)",
                                data={"wrong": wrong}))
    return found


# ------------------------------------------------------------------ dcgm


_DCGM_SEVERITY = {"FAIL": Severity.FAIL, "WARN": Severity.WARN}


def _dcgm_finding(level: int, r: DcgmResult) -> Finding:
    """(dcgmi's GPU ids are NVML indices, as ``-i`` takes them.)"""
    where = f"gpu{r.gpu}" if r.gpu is not None else "node"
    detail = f": {'; '.join(r.warnings)}" if r.warnings else ""
    return Finding("validate.dcgm", _DCGM_SEVERITY[r.status], f"dcgmi diag -r {level}: {r.test} "
                   f"{r.status.lower()}ed on {where}{detail}"[:1000], r.gpu, r.test,
                   data={"category": r.category, "test": r.test, "status": r.status})


def test_dcgm(ctx: Context) -> list[Finding]:
    tool = ctx.need("dcgmi")
    level = int(ctx.knob("dcgm_level"))
    only = ["-i", ",".join(str(g.index) for g in ctx.gpus)] if ctx.gpus else []
    result = ctx.run([*tool, "diag", "-r", str(level), "-j", *only], env=dict(ctx.env))
    results = parse_dcgm(result.stdout or result.stderr)  # dcgmi exits non-zero when a test fails
    bad = [r for r in results if r.status in _DCGM_SEVERITY]
    if bad:
        return [_dcgm_finding(level, r) for r in bad]
    counts = Counter(r.status for r in results)
    return [Finding("validate.dcgm", Severity.OK, f"dcgmi diag -r {level}: {counts.get('PASS', 0)} passed, "
                    f"{counts.get('SKIP', 0)} skipped", data={"level": level, **counts})]


# ------------------------------------------------------------------ ib


def _ib_pair(ctx: Context, tool: list[str], server: str, client: str, port: int, pairs: int) -> float:
    seconds = str(max(1, math.ceil(ctx.burn_s / pairs)))  # (-D: whole seconds; the tier's burn split)
    common = ["--report_gbits", "-F", "-D", seconds, "-p", str(port)]
    if ctx.settings.ib_use_cuda and ctx.gpus:
        common.append("--use_cuda=0")
    listener = ctx.start([*tool, "-d", server, *common])
    try:
        time.sleep(IB_SERVER_WAIT_S)
        result = ctx.run([*tool, "-d", client, *common, "localhost"])
    finally:
        ctx.checked(listener.finish(min(2.0, max(0.0, ctx.left()))), overlapped=True)
    if result.rc != 0:
        raise failed(result)
    return parse_ib_write_bw(result.stdout).avg_gbps


def test_ib(ctx: Context) -> list[Finding]:
    tool = ctx.need("ib_write_bw")
    hcas = ctx.platform.hcas()
    if not hcas:
        raise NotApplicable("no InfiniBand HCA with an active port")
    measured = []
    for i, server in enumerate(hcas):
        client = hcas[(i + 1) % len(hcas)]
        gbps = _ib_pair(ctx, tool, server, client, IB_PORT_BASE + i, len(hcas))
        measured.append(Measured(gbps, subject=f"{client}->{server}"))
    floor = ctx.floors(IB.name).get(None)
    return judge(IB, measured, {None: floor}, ctx.settings.outlier_fraction)


TESTS: dict[str, Test] = {"gemm": test_gemm, "hbm": test_hbm, "pcie": test_pcie, "p2p": test_p2p,
                          "nccl": test_nccl, "dcgm": test_dcgm, "ib": test_ib}
