"""The built-in probe's control flow and output contract, on a pure-Python stand-in for
CuPy (no GPU here; docs/validation.md says what a real GPU run records): every line is
what ``parse_probe`` and the catalog read, for each test."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from slurmgpu.validate import probe
from slurmgpu.validate.parsers import parse_probe


class ListBackend(probe.CupyBackend):
    """Two "GPUs" whose memory is Python lists; GPU 1 flips one word it stores."""

    name = "lists"
    dtypes = ("bf16", "fp32")

    def __init__(self) -> None:
        self.flaky = 1

    def count(self) -> int:
        return 2

    def device_name(self, ordinal: int) -> str:
        return "List GPU"

    def on(self, ordinal: int) -> Any:
        return contextlib.nullcontext()

    def sync(self, ordinal: int) -> None:
        return None

    def gemm_inputs(self, ordinal: int, dtype: str) -> tuple[Any, Any]:
        return ordinal, dtype

    def matmul(self, a: Any, b: Any, out: Any | None) -> Any:
        return [b]

    def product_digest(self, product: Any) -> str:
        return f"digest-{product[0]}"

    def free_bytes(self, ordinal: int) -> int:
        return 4000

    def words(self, ordinal: int, count: int) -> Any:
        return [None] * count if ordinal != self.flaky else FlippingList(count)

    def pattern(self, ordinal: int, start: int, count: int, flip: int) -> Any:
        return [((start + k) * 2654435761 & 0xFFFFFFFF) ^ flip for k in range(count)]

    def mismatches(self, a: Any, b: Any) -> int:
        return sum(x != y for x, y in zip(a, b, strict=True))

    def copy(self, dst: Any, src: Any) -> None:
        return None

    def pinned(self, nbytes: int) -> Any:
        return bytearray(1)

    def h2d(self, dst: Any, host: Any) -> None:
        return None

    def d2h(self, host: Any, src: Any) -> None:
        return None

    def bytes_on(self, ordinal: int, nbytes: int) -> Any:
        return bytearray(1)

    def peer_copy(self, dst: Any, dst_ordinal: int, src: Any, src_ordinal: int) -> None:
        return None

    def enable_peers(self, count: int) -> None:
        return None


class FlippingList(list[Any]):
    """Memory with one bad bit: word 7 always reads back with bit 3 flipped."""

    def __init__(self, count: int) -> None:
        super().__init__([None] * count)

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        if isinstance(index, slice) and (index.start or 0) <= 7 < (index.stop or len(self)):
            value = list(value)
            value[7 - (index.start or 0)] ^= 8
        return value


def lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], test: str) -> list[dict[str, Any]]:
    monkeypatch.setattr(probe, "backend", ListBackend)
    assert probe.run(test, seconds=0.01, share=0.1) == 0
    return parse_probe(capsys.readouterr().out)


def test_gemm_one_line_per_gpu_and_dtype(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    items = lines(monkeypatch, capsys, "gemm")
    assert [(i["gpu"], i["dtype"]) for i in items] == [(0, "bf16"), (0, "fp32"), (1, "bf16"), (1, "fp32")]
    assert all(i["tflops"] > 0 and i["iterations"] % probe.DIGEST_EVERY == 0 for i in items)
    assert {tuple(i["digests"]) for i in items} == {("digest-bf16",), ("digest-fp32",)}


def test_hbm_counts_words_read_back_wrong(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    items = lines(monkeypatch, capsys, "hbm")
    assert [(i["gpu"], i["mismatches"], i["checked_bytes"]) for i in items] == [(0, 0, 400), (1, 2, 400)]
    assert all(i["copy_gbps"] > 0 for i in items)  # (pattern and complement: the bad word twice)


def test_pcie_p2p_context_and_nccl_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert {k for i in lines(monkeypatch, capsys, "pcie") for k in i} >= {"gpu", "h2d_gbps", "d2h_gbps"}
    assert [(i["src"], i["dst"]) for i in lines(monkeypatch, capsys, "p2p")] == [(0, 1), (1, 0)]
    assert [i["gpu"] for i in lines(monkeypatch, capsys, "context")] == [0, 1]
    [nccl] = lines(monkeypatch, capsys, "nccl")
    assert "needs CuPy's NCCL" in nccl["unsupported"]  # (this stand-in is not CuPy)


class TimedBackend(ListBackend):
    """Products take 1 s and digests 10 s of a clock this backend moves; the first digest
    (CuPy compiling its kernels on a fresh node) 100 s."""

    def __init__(self) -> None:
        super().__init__()
        self.now, self.digests = 0.0, 0

    def tick(self) -> float:
        return self.now

    def matmul(self, a: Any, b: Any, out: Any | None) -> Any:
        self.now += 1.0
        return [b]

    def product_digest(self, product: Any) -> str:
        self.now += 100.0 if self.digests == 0 else 10.0
        self.digests += 1
        return f"digest-{product[0]}"


def test_gemm_rate_counts_the_products_time_not_the_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    b = TimedBackend()
    monkeypatch.setattr(probe, "clock", b.tick)
    item = probe.gemm_one(b, 0, "bf16", seconds=200.0)
    assert item["tflops"] == round(2 * probe.GEMM_N**3 / 1.0 / 1e12, 2)  # one product a second
    assert item["iterations"] == 12 * probe.DIGEST_EVERY  # 12 steps of 18 s pass 200 s and item["digests"] == ["digest-bf16"]


class SlowFirstCopy(TimedBackend):
    """A copy takes 1 s of the fake clock, the first one 100 s (a path set up on first use,
    as NCCL connects its peers on the first all-reduce)."""

    copies = 0

    def copy(self, dst: Any, src: Any) -> None:
        self.now += 100.0 if self.copies == 0 else 1.0
        self.copies += 1


def test_a_slow_first_step_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    b = SlowFirstCopy()
    monkeypatch.setattr(probe, "clock", b.tick)
    assert probe.copy_gbps(b, 0, seconds=10.0) == round(2 * (1 << 30) / 1.0 / 1e9, 1)  # a copy a second
    assert b.copies == 11


class CUDARuntimeError(Exception):
    """Named as CuPy names its CUDA errors."""


class BrokenGpu(ListBackend):
    """GPU 1 raises CuPy's CUDA error in every product; with ``ours``, a bug of ours instead."""

    def __init__(self, ours: bool = False) -> None:
        super().__init__()
        self.ours = ours

    def gemm_inputs(self, ordinal: int, dtype: str) -> tuple[Any, Any]:
        if ordinal == 1:
            raise TypeError("a bug") if self.ours else CUDARuntimeError("cudaErrorECCUncorrectable: uncorrectable ECC")
        return ordinal, dtype


@pytest.mark.parametrize("ours", [False, True])
def test_a_gpu_the_test_breaks_on_gets_an_error_line_not_silence(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], ours: bool) -> None:
    monkeypatch.setattr(probe, "backend", lambda: BrokenGpu(ours))
    assert probe.run("gemm", seconds=0.01, share=0.1) == 0
    items = parse_probe(capsys.readouterr().out)
    assert [(i["gpu"], i.get("dtype")) for i in items if "error" not in i] == [(0, "bf16"), (0, "fp32")]
    [error] = [i for i in items if "error" in i]
    assert (error["gpu"], error["cuda"]) == (1, not ours)
    assert error["error"] == ("TypeError: a bug" if ours else "CUDARuntimeError: cudaErrorECCUncorrectable: "
                                                               "uncorrectable ECC")
