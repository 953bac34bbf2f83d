"""The built-in GPU probe: ``python -m slurmgpu.validate.probe TEST --seconds S [--share F]``
runs one test on every visible GPU (``CUDA_VISIBLE_DEVICES``; ordinals in its output) and
prints one JSON object per result line (``slurmgpu.validate.parsers.parse_probe``):

* ``gemm``: per GPU and dtype (CuPy: fp16, fp32; PyTorch: bf16, fp16, fp32; the first gets
  half the time), {"tflops" (the products' time alone), "dtype", "digests" (the distinct
  checksums of one product of fixed inputs; healthy: one, equal on every GPU),
  "iterations"}; all GPUs at once.
* ``hbm``: per GPU, {"copy_gbps" (device-to-device copy, read + write bytes), "checked_bytes",
  "mismatches" (words read back wrong after writing a pattern and its complement over
  ``--share`` of the free memory)}.
* ``pcie``: per GPU in turn, {"h2d_gbps", "d2h_gbps"} with pinned host memory.
* ``p2p``: per ordered GPU pair, {"src", "dst", "gbps"}.
* ``nccl``: {"busbw_gbps", "wrong"}: NCCL all-reduce over every GPU in this one process
  (CuPy's NCCL binding; PyTorch alone: {"unsupported": why}).
* ``context``: per GPU, {"seconds"} to create its CUDA context (the first allocation).

A GPU that gemm, hbm or pcie breaks on gets {"error", "cuda" (a CUDA error, not ours)}.

CuPy (``pip install slurmgpu[validate]``) or else PyTorch, imported only when a test runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

GEMM_N = 8192
#: Exceptions that are CUDA's word on the GPU (CuPy's; PyTorch 2.8+'s AcceleratorError).
CUDA_ERRORS = frozenset({"CUDARuntimeError", "CUDADriverError", "CUBLASError", "AcceleratorError"})
CHUNK_BYTES = 256 << 20
DIGEST_EVERY = 8
SEED = 0x5EED
clock = time.perf_counter


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def checksum(xp: Any, words: Any) -> str:
    """A bit-exact, order-sensitive checksum of an int64 array (exact integer sums)."""
    index = xp.arange(words.shape[0], dtype=xp.int64) % 65521 + 1
    return f"{int(words.sum()):x}-{int((words * index).sum()):x}"


class CupyBackend:
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy

    def count(self) -> int:
        return int(self.cp.cuda.runtime.getDeviceCount())

    def device_name(self, ordinal: int) -> str:
        raw = self.cp.cuda.runtime.getDeviceProperties(ordinal)["name"]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def on(self, ordinal: int) -> Any:
        return self.cp.cuda.Device(ordinal)

    def sync(self, ordinal: int) -> None:
        self.cp.cuda.Device(ordinal).synchronize()

    #: The products run, the first judged against the floors (CuPy has no bfloat16).
    dtypes: tuple[str, ...] = ("fp16", "fp32")

    def gemm_inputs(self, ordinal: int, dtype: str) -> tuple[Any, Any]:
        """Two fixed N x N matrices in [-0.5, 0.5), hashed from their indices on the device
        (no host RNG: the same bits on every GPU, at once)."""
        cp = self.cp
        with self.on(ordinal):
            index = cp.arange(2 * GEMM_N * GEMM_N, dtype=cp.uint64)
            unit = ((index * 2654435761 + SEED) & 0xFFFFFFFF).astype(cp.float32) / 2**32 - 0.5
            pair = unit.astype({"fp16": cp.float16, "fp32": cp.float32}[dtype]).reshape(2, GEMM_N, GEMM_N)
            return pair[0], pair[1]

    def matmul(self, a: Any, b: Any, out: Any | None) -> Any:
        return self.cp.matmul(a, b, out=out)

    def product_digest(self, product: Any) -> str:
        words = product.ravel().view(self.cp.int16 if product.itemsize == 2 else self.cp.int32)
        return checksum(self.cp, words.astype(self.cp.int64))

    def free_bytes(self, ordinal: int) -> int:
        with self.on(ordinal):
            return int(self.cp.cuda.runtime.memGetInfo()[0])

    def words(self, ordinal: int, count: int) -> Any:
        with self.on(ordinal):
            return self.cp.empty(count, dtype=self.cp.uint32)

    def pattern(self, ordinal: int, start: int, count: int, flip: int) -> Any:
        with self.on(ordinal):
            index = self.cp.arange(start, start + count, dtype=self.cp.uint64)
            return ((index * 2654435761) & 0xFFFFFFFF).astype(self.cp.uint32) ^ self.cp.uint32(flip)

    def mismatches(self, a: Any, b: Any) -> int:
        return int(self.cp.count_nonzero(a != b))

    def copy(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def pinned(self, nbytes: int) -> Any:
        import cupyx

        return cupyx.empty_pinned(nbytes, dtype="uint8")

    def h2d(self, dst: Any, host: Any) -> None:
        self.cp.cuda.runtime.memcpy(dst.data.ptr, host.ctypes.data, host.nbytes, 1)

    def d2h(self, host: Any, src: Any) -> None:
        self.cp.cuda.runtime.memcpy(host.ctypes.data, src.data.ptr, host.nbytes, 2)

    def bytes_on(self, ordinal: int, nbytes: int) -> Any:
        with self.on(ordinal):
            return self.cp.zeros(nbytes, dtype=self.cp.uint8)

    def peer_copy(self, dst: Any, dst_ordinal: int, src: Any, src_ordinal: int) -> None:
        runtime = self.cp.cuda.runtime
        runtime.memcpyPeer(dst.data.ptr, dst_ordinal, src.data.ptr, src_ordinal, src.nbytes)

    def enable_peers(self, count: int) -> None:
        runtime = self.cp.cuda.runtime
        for a in range(count):
            with self.on(a):
                for b in range(count):
                    if a != b and runtime.deviceCanAccessPeer(a, b):
                        with contextlib.suppress(runtime.CUDARuntimeError):  # already enabled
                            runtime.deviceEnablePeerAccess(b)


class TorchBackend(CupyBackend):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def count(self) -> int:
        return int(self.torch.cuda.device_count())

    def device_name(self, ordinal: int) -> str:
        return str(self.torch.cuda.get_device_name(ordinal))

    def on(self, ordinal: int) -> Any:
        return self.torch.cuda.device(ordinal)

    def sync(self, ordinal: int) -> None:
        self.torch.cuda.synchronize(ordinal)

    dtypes = ("bf16", "fp16", "fp32")

    def gemm_inputs(self, ordinal: int, dtype: str) -> tuple[Any, Any]:
        torch = self.torch
        index = torch.arange(2 * GEMM_N * GEMM_N, dtype=torch.int64, device=f"cuda:{ordinal}")
        unit = ((index * 2654435761 + SEED) & 0xFFFFFFFF).to(torch.float32) / 2**32 - 0.5
        kind = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        pair = unit.to(kind).reshape(2, GEMM_N, GEMM_N)
        return pair[0], pair[1]

    def matmul(self, a: Any, b: Any, out: Any | None) -> Any:
        return self.torch.matmul(a, b, out=out)

    def product_digest(self, product: Any) -> str:
        torch = self.torch
        words = product.reshape(-1).view(torch.int16 if product.element_size() == 2 else torch.int32).to(torch.int64)
        index = self.torch.arange(words.shape[0], device=words.device, dtype=self.torch.int64) % 65521 + 1
        return f"{int(words.sum()):x}-{int((words * index).sum()):x}"

    def free_bytes(self, ordinal: int) -> int:
        return int(self.torch.cuda.mem_get_info(ordinal)[0])

    def words(self, ordinal: int, count: int) -> Any:
        return self.torch.empty(count, dtype=self.torch.int32, device=f"cuda:{ordinal}")

    def pattern(self, ordinal: int, start: int, count: int, flip: int) -> Any:
        index = self.torch.arange(start, start + count, dtype=self.torch.int64, device=f"cuda:{ordinal}")
        value = ((index * 2654435761) & 0xFFFFFFFF) ^ flip
        return (value - ((value >> 31) << 32)).to(self.torch.int32)  # the same 32 bits, signed

    def mismatches(self, a: Any, b: Any) -> int:
        return int(self.torch.count_nonzero(a != b))

    def copy(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def pinned(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)

    def h2d(self, dst: Any, host: Any) -> None:
        dst.copy_(host)

    def d2h(self, host: Any, src: Any) -> None:
        host.copy_(src)

    def bytes_on(self, ordinal: int, nbytes: int) -> Any:
        return self.torch.zeros(nbytes, dtype=self.torch.uint8, device=f"cuda:{ordinal}")

    def peer_copy(self, dst: Any, dst_ordinal: int, src: Any, src_ordinal: int) -> None:
        dst.copy_(src)

    def enable_peers(self, count: int) -> None:
        """(PyTorch enables peer access itself on the first cross-device copy.)"""


def backend() -> CupyBackend:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (PyTorch's advice)
    try:
        return CupyBackend()
    except ImportError:
        return TorchBackend()


# ------------------------------------------------------------------ the tests


def timed(seconds: float, step: Callable[[], None], sync: Callable[[], None],
          warm_up: bool = True) -> tuple[int, float]:
    """Run ``step`` until ``seconds`` passed (at least once); (runs, elapsed). One untimed
    step first: a first all-reduce connects NCCL's peers, a first copy sets up its path."""
    if warm_up:
        step()
        sync()
    started = clock()
    runs = 0
    while runs == 0 or clock() - started < seconds:
        step()
        runs += 1
        sync()
    return runs, clock() - started


def gemm_one(b: CupyBackend, ordinal: int, dtype: str, seconds: float) -> dict[str, Any]:
    """The rate counts the products' time alone: the digests (and the first one, which
    compiles their kernels) run beside it, untimed."""
    x, y = b.gemm_inputs(ordinal, dtype)
    with b.on(ordinal):
        out = b.matmul(x, y, None)
        digests = [b.product_digest(out)]
        in_products = 0.0

        def step() -> None:
            nonlocal in_products
            started = clock()
            for _ in range(DIGEST_EVERY):
                b.matmul(x, y, out)
            b.sync(ordinal)
            in_products += clock() - started
            digest = b.product_digest(out)
            if digest not in digests:
                digests.append(digest)

        runs, _ = timed(seconds, step, lambda: b.sync(ordinal), warm_up=False)
    flops = 2 * GEMM_N**3 * DIGEST_EVERY * runs
    return {"test": "gemm", "gpu": ordinal, "name": b.device_name(ordinal), "dtype": dtype,
            "tflops": round(flops / max(in_products, 1e-9) / 1e12, 2), "digests": digests[:16],
            "iterations": runs * DIGEST_EVERY}


def gemm_all(b: CupyBackend, ordinal: int, seconds: float) -> list[dict[str, Any]]:
    """Every dtype in turn, the first (the floors' one) getting half the time."""
    rest = len(b.dtypes) - 1
    shares = [seconds / 2] + [seconds / 2 / rest] * rest if rest else [seconds]
    return [gemm_one(b, ordinal, dtype, share) for dtype, share in zip(b.dtypes, shares, strict=True)]


def copy_gbps(b: CupyBackend, ordinal: int, seconds: float) -> float:
    """Device-to-device copy of 1 GiB: read + write bytes per second."""
    size = 1 << 30
    src, dst = b.bytes_on(ordinal, size), b.bytes_on(ordinal, size)

    def step() -> None:
        b.copy(dst, src)

    runs, elapsed = timed(seconds, step, lambda: b.sync(ordinal))
    return round(2 * size * runs / elapsed / 1e9, 1)


def pattern_errors(b: CupyBackend, ordinal: int, share: float) -> tuple[int, int]:
    """Write a pattern and then its complement over ``share`` of the free memory, reading
    each back: (words wrong, bytes checked)."""
    count = max(1, int(b.free_bytes(ordinal) * share) // 4)
    words, chunk = b.words(ordinal, count), CHUNK_BYTES // 4
    wrong = 0
    for flip in (0, 0xFFFFFFFF):
        for start in range(0, count, chunk):
            words[start:start + chunk] = b.pattern(ordinal, start, min(chunk, count - start), flip)
        for start in range(0, count, chunk):
            expected = b.pattern(ordinal, start, min(chunk, count - start), flip)
            wrong += b.mismatches(words[start:start + chunk], expected)
    return wrong, count * 4


def hbm_one(b: CupyBackend, ordinal: int, seconds: float, share: float) -> dict[str, Any]:
    with b.on(ordinal):
        gbps = copy_gbps(b, ordinal, seconds)
        wrong, checked = pattern_errors(b, ordinal, share)
    return {"test": "hbm", "gpu": ordinal, "name": b.device_name(ordinal), "copy_gbps": gbps,
            "checked_bytes": checked, "mismatches": wrong}


def pcie_one(b: CupyBackend, ordinal: int, seconds: float) -> dict[str, Any]:
    host = b.pinned(CHUNK_BYTES)
    with b.on(ordinal):
        device = b.bytes_on(ordinal, CHUNK_BYTES)

        def up() -> None:
            b.h2d(device, host)

        def down() -> None:
            b.d2h(host, device)

        ups, up_s = timed(seconds / 2, up, lambda: b.sync(ordinal))
        downs, down_s = timed(seconds / 2, down, lambda: b.sync(ordinal))
    return {"test": "pcie", "gpu": ordinal, "name": b.device_name(ordinal),
            "h2d_gbps": round(CHUNK_BYTES * ups / up_s / 1e9, 2),
            "d2h_gbps": round(CHUNK_BYTES * downs / down_s / 1e9, 2)}


def p2p_pair(b: CupyBackend, buffers: list[Any], src: int, dst: int, seconds: float) -> float:
    def step() -> None:
        b.peer_copy(buffers[dst], dst, buffers[src], src)

    runs, elapsed = timed(seconds, step, lambda: b.sync(dst))
    return round(CHUNK_BYTES * runs / elapsed / 1e9, 2)


def p2p_all(b: CupyBackend, count: int, seconds: float) -> None:
    b.enable_peers(count)
    buffers = [b.bytes_on(i, CHUNK_BYTES) for i in range(count)]
    each = max(0.05, seconds / max(1, count * (count - 1)))
    for src in range(count):
        for dst in range(count):
            if src != dst:
                emit({"test": "p2p", "src": src, "dst": dst, "gbps": p2p_pair(b, buffers, src, dst, each)})


def nccl_all(b: CupyBackend, count: int, seconds: float) -> None:
    if b.name != "cupy":
        emit({"test": "nccl", "unsupported": "the built-in all-reduce needs CuPy's NCCL (or install nccl-tests)"})
        return
    from cupy.cuda import nccl

    cp, elements = b.cp, CHUNK_BYTES // 4
    comms = nccl.NcclCommunicator.initAll(list(range(count)))
    send, recv = [], []
    for i in range(count):
        with b.on(i):
            send.append(cp.full(elements, i + 1, dtype=cp.float32))
            recv.append(cp.empty(elements, dtype=cp.float32))

    def step() -> None:
        nccl.groupStart()
        for i, comm in enumerate(comms):
            with b.on(i):
                comm.allReduce(send[i].data.ptr, recv[i].data.ptr, elements, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                               cp.cuda.Stream.null.ptr)
        nccl.groupEnd()

    def sync_all() -> None:
        for i in range(count):
            b.sync(i)

    runs, elapsed = timed(seconds, step, sync_all)
    wrong = sum(b.mismatches(r, cp.float32(count * (count + 1) / 2)) for r in recv)
    algbw = CHUNK_BYTES * runs / elapsed / 1e9
    emit({"test": "nccl", "gpus": count, "busbw_gbps": round(algbw * 2 * (count - 1) / count, 2), "wrong": wrong})


def context_all(b: CupyBackend, count: int) -> None:
    for i in range(count):
        started = time.perf_counter()
        with b.on(i):
            b.bytes_on(i, 1)
            b.sync(i)
        emit({"test": "context", "gpu": i, "name": b.device_name(i), "seconds": round(time.perf_counter() - started, 4)})


def gpu_error(test: str, ordinal: int, exc: BaseException) -> dict[str, Any]:
    """The line for a GPU the test broke on: a CUDA error (the GPU's) or another (ours)."""
    name = type(exc).__name__
    cuda = (name in CUDA_ERRORS or str(exc).startswith("CUDA error")) and "out of memory" not in str(exc)
    return {"test": test, "gpu": ordinal, "error": f"{name}: {exc}"[:300], "cuda": cuda}


def guarded(test: str, ordinal: int, work: Callable[[int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``work(ordinal)``, or its error as a line: a GPU that breaks a test is never left out."""
    try:
        return work(ordinal)
    except Exception as exc:  # every error is reported, per GPU
        return [gpu_error(test, ordinal, exc)]


def each_gpu_at_once(count: int, work: Callable[[int], list[dict[str, Any]]], test: str = "gemm") -> None:
    results: dict[int, list[dict[str, Any]]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, guarded(test, i, work)))
               for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in sorted(results):
        for item in results[i]:
            emit(item)


def run(test: str, seconds: float, share: float) -> int:
    b = backend()
    count = b.count()
    if test == "gemm":
        each_gpu_at_once(count, lambda i: gemm_all(b, i, seconds), test)
    elif test == "hbm":
        each_gpu_at_once(count, lambda i: [hbm_one(b, i, seconds, share)], test)
    elif test == "pcie":
        for i in range(count):
            for item in guarded(test, i, lambda i: [pcie_one(b, i, max(0.1, seconds / count))]):
                emit(item)
    elif test == "p2p":
        p2p_all(b, count, seconds)
    elif test == "nccl":
        nccl_all(b, count, seconds)
    elif test == "context":
        context_all(b, count)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmgpu.validate.probe")
    parser.add_argument("test", choices=["gemm", "hbm", "pcie", "p2p", "nccl", "context"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--share", type=float, default=0.1)
    args = parser.parse_args(argv)
    try:
        return run(args.test, args.seconds, args.share)
    except ImportError as exc:
        print(f"probe: neither CuPy nor PyTorch is usable ({exc}); pip install slurmgpu[validate]", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
