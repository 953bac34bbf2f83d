"""The `slurmgpu validate` parsers on real tool outputs from public sources
(tests/data/validate/README.md names each), and on what the simulator's tools print."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.validate.parsers import (
    ParseError,
    parse_dcgm,
    parse_ib_write_bw,
    parse_nccl,
    parse_nvbandwidth,
    parse_probe,
)

DATA = Path(__file__).resolve().parent / "data" / "validate"


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_every_sample_names_its_source() -> None:
    readme = sample("README.md")
    for path in DATA.iterdir():
        if path.name != "README.md":
            assert f"| {path.name} |" in readme, path.name


def test_nccl_avg_bus_bandwidth_and_rows() -> None:
    result = parse_nccl(sample("nccl-all_reduce_perf-gb200-nvl72.txt"))
    assert result.busbw == 745.53
    assert [r.size for r in result.rows] == [536870912, 1073741824, 2147483648, 4294967296, 8589934592]
    assert result.rows[-1].busbw_oop == 834.57 and result.rows[-1].busbw_ip == 846.82
    assert result.wrong == 0


def test_nccl_under_mpirun_prefixes() -> None:
    result = parse_nccl(sample("nccl-all_reduce_perf-mpirun-p5.txt"))
    assert result.busbw == 92.3405
    assert len(result.rows) == 3


def test_nccl_without_summary_takes_the_largest_message() -> None:
    result = parse_nccl(sample("nccl-all_reduce_perf-rows-only.txt"))
    assert result.avg_busbw is None
    assert result.busbw == 300.52


def test_nccl_wrong_elements_are_counted() -> None:
    text = sample("nccl-all_reduce_perf-gb200-nvl72.txt").replace("586.06      0", "586.06     17")
    assert parse_nccl(text).wrong == 17


def test_dcgm_3x_pass_with_text_before_the_json() -> None:
    results = parse_dcgm(sample("dcgmi-diag-3.1.0-pass.json"))
    assert {r.status for r in results} == {"PASS"}
    assert len(results) == 9 + 8
    software = [r for r in results if r.test == "software"]
    assert [r.gpu for r in software] == list(range(8))
    assert next(r for r in results if r.test == "Denylist").gpu is None  # "0,1,...,7": the node


def test_dcgm_3x_skips_with_gpu_id_strings() -> None:
    results = parse_dcgm(sample("dcgmi-diag-r3-3.x-skip.json"))
    assert {(r.test, r.status, r.gpu) for r in results} >= {("PCIe", "SKIP", 0), ("EUD Test", "SKIP", 0)}


def test_dcgm_4x_failures_carry_the_warning() -> None:
    results = parse_dcgm(sample("dcgmi-diag-4.x-persistence-fail.json"))
    assert len(results) == 8 and {r.status for r in results} == {"FAIL"}
    assert results[3].gpu == 3
    assert results[3].warnings == ("Persistence Mode: Persistence mode for GPU 3 is disabled.",)


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", '{"DCGM Diagnostic": {}}',
                                  '{"DCGM Diagnostic": {"runtime_error": "NVVS failed"}}'])
def test_dcgm_without_results_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_dcgm(text)


def test_ib_write_bw_gbits() -> None:
    result = parse_ib_write_bw(sample("ib_write_bw-report_gbits-8B.txt"))
    assert (result.device, result.size, result.avg_gbps) == ("ib0", 8, 0.48)


def test_ib_bw_in_mb_per_second_is_converted_to_gbits() -> None:
    result = parse_ib_write_bw(sample("ib_send_bw-MBsec.txt"))
    assert result.avg_gbps == pytest.approx(5544.28 * 8 / 1000, abs=0.001)


def test_ib_without_a_result_row() -> None:
    with pytest.raises(ParseError):
        parse_ib_write_bw("************************************\n* Waiting for client to connect... *\n")


def test_nvbandwidth_peer_matrix() -> None:
    matrices = parse_nvbandwidth(sample("nvbandwidth-a6000-d2d-read.txt"))
    m = matrices["device_to_device_memcpy_read_ce"]
    assert len(m.pairs) == 30 and m.total == 715.53
    assert m.pairs[(0, 3)] == 21.95 and m.pairs[(3, 0)] == 21.82


def test_nvbandwidth_host_matrices_both_directions() -> None:
    matrices = parse_nvbandwidth(sample("nvbandwidth-rtx4090-h2d-d2h.txt"))
    assert matrices["host_to_device_memcpy_ce"].pairs[(0, 7)] == 26.31  # CPU 0 -> GPU 7
    assert matrices["device_to_host_memcpy_ce"].pairs[(7, 0)] == 26.83  # GPU 7 -> CPU 0 ("<-")


def test_nvbandwidth_waived() -> None:
    with pytest.raises(ParseError):
        parse_nvbandwidth("nvbandwidth Version: v0.2\n\nWaiving device_to_device_memcpy_write_ce.\n")


def test_probe_lines_skip_noise() -> None:
    items = parse_probe('UserWarning: something\n{"test": "pcie", "gpu": 0, "h2d_gbps": 1}\n{bad\n')
    assert items == [{"test": "pcie", "gpu": 0, "h2d_gbps": 1}]
