"""Parsers of the tools' outputs, as the tools print them (real samples, each with its
source, under tests/data/validate/). Each returns plain data or raises ``ParseError``
with a one-line reason; the simulator's tools print the same formats into the same
parsers.

* nccl-tests ``all_reduce_perf``: the result rows (out-of-place and in-place busbw and
  ``#wrong``) and ``# Avg bus bandwidth``; an ``mpirun`` prefix (``[1,0]<stdout>:``) is
  skipped.
* ``dcgmi diag -j``: DCGM 3.x (``"DCGM GPU Diagnostic"``, ``gpu_ids``/``gpu_id``) and 4.x
  (``"DCGM Diagnostic"``, ``entity_id``, ``test_summary``), text before the JSON skipped.
* perftest ``ib_write_bw``: the BW table in Gb/sec (``--report_gbits``) or MB/sec.
* ``nvbandwidth``: each ``Running <testcase>.`` matrix (``GPU(row) -> GPU(column)`` or
  ``<-``), ``N/A`` cells skipped.
* the built-in probe (``slurmgpu.validate.probe``): one JSON object per line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


class ParseError(ValueError):
    """The output is not what the tool prints."""


# ------------------------------------------------------------------ nccl-tests


@dataclass(frozen=True)
class NcclRow:
    size: int
    busbw_oop: float
    busbw_ip: float
    wrong: int


@dataclass(frozen=True)
class NcclResult:
    rows: tuple[NcclRow, ...]
    avg_busbw: float | None

    @property
    def busbw(self) -> float:
        """The avg bus bandwidth line, else the best of the largest message's two."""
        if self.avg_busbw is not None:
            return self.avg_busbw
        last = max(self.rows, key=lambda r: r.size)
        return max(last.busbw_oop, last.busbw_ip)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)


_PREFIX = re.compile(r"^\[[^\]]*\]<std(?:out|err)>:")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


def _wrong(token: str) -> int:
    return int(token) if token.isdigit() else 0  # "N/A": not validated (-c 0)


def _nccl_row(tokens: list[str]) -> NcclRow | None:
    if len(tokens) < 12 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    try:
        return NcclRow(int(tokens[0]), float(tokens[-6]), float(tokens[-2]),
                       _wrong(tokens[-5]) + _wrong(tokens[-1]))
    except ValueError:
        return None


def parse_nccl(text: str) -> NcclResult:
    rows: list[NcclRow] = []
    avg = None
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw)
        if (m := _AVG.search(line)) is not None:
            avg = float(m.group(1))
        elif not line.lstrip().startswith("#") and (row := _nccl_row(line.split())) is not None:
            rows.append(row)
    if not rows:
        raise ParseError("all_reduce_perf printed no result rows")
    return NcclResult(tuple(rows), avg)


# ------------------------------------------------------------------ dcgmi diag -j


@dataclass(frozen=True)
class DcgmResult:
    category: str
    test: str
    status: str  # PASS, FAIL, WARN, SKIP, or what DCGM said, upper-cased
    gpu: int | None
    warnings: tuple[str, ...] = ()


def _json_document(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ParseError("dcgmi printed no JSON")
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError as exc:
        raise ParseError(f"dcgmi printed invalid JSON: {exc}") from None


def _status(text: Any) -> str:
    word = str(text or "").strip().upper()
    return {"PASSED": "PASS", "FAILED": "FAIL", "WARNING": "WARN", "SKIPPED": "SKIP"}.get(word, word)


def _gpu_of(result: dict[str, Any]) -> int | None:
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        value = result.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    return None  # a result for several GPUs ("0,1,2,3")


def _warning_texts(result: dict[str, Any]) -> tuple[str, ...]:
    out = []
    for item in list(result.get("warnings") or []) + list(result.get("info") or []):
        text = item.get("warning") or item.get("info") if isinstance(item, dict) else item
        if text:
            out.append(str(text))
    return tuple(out)


def _dcgm_tests(root: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    tests = [(str(c.get("category", "")), t) for c in root.get("test_categories") or []
             if isinstance(c, dict) for t in c.get("tests") or [] if isinstance(t, dict)]
    return tests + [("", t) for t in root.get("tests") or [] if isinstance(t, dict)]


def parse_dcgm(text: str) -> tuple[DcgmResult, ...]:
    doc = _json_document(text)
    root = doc.get("DCGM GPU Diagnostic", doc.get("DCGM Diagnostic", doc)) if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        raise ParseError("dcgmi JSON has no diagnostic object")
    if root.get("runtime_error"):
        raise ParseError(f"dcgmi: {root['runtime_error']}")
    out = []
    for category, test in _dcgm_tests(root):
        results = [r for r in test.get("results") or [] if isinstance(r, dict)]
        if not results and isinstance(test.get("test_summary"), dict):
            results = [test["test_summary"]]
        out += [DcgmResult(category, str(test.get("name", "?")), _status(r.get("status")),
                           _gpu_of(r), _warning_texts(r)) for r in results]
    if not out:
        raise ParseError("dcgmi JSON has no test results")
    return tuple(out)


# ------------------------------------------------------------------ perftest ib_write_bw


@dataclass(frozen=True)
class IbResult:
    device: str | None
    size: int
    avg_gbps: float
    peak_gbps: float


_IB_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")
_IB_DEVICE = re.compile(r"Device\s*:\s*(\S+)")


def _ib_row(line: str, scale: float) -> tuple[int, float, float] | None:
    tokens = line.split()
    if len(tokens) < 4 or not tokens[0].isdigit():
        return None
    try:
        return int(tokens[0]), float(tokens[3]) * scale, float(tokens[2]) * scale
    except ValueError:
        return None


def parse_ib_write_bw(text: str) -> IbResult:
    device = m.group(1) if (m := _IB_DEVICE.search(text)) else None
    scale = None
    best: tuple[int, float, float] | None = None
    for line in text.splitlines():
        if (h := _IB_HEADER.search(line)) is not None:
            scale = 1.0 if h.group(1) == "Gb/sec" else 8 / 1000  # MB/s -> Gb/s
        elif scale is not None and (row := _ib_row(line, scale)) is not None:
            best = row if best is None or row[0] >= best[0] else best
    if best is None:
        raise ParseError("ib_write_bw printed no bandwidth row")
    return IbResult(device, best[0], round(best[1], 3), round(best[2], 3))


# ------------------------------------------------------------------ nvbandwidth


@dataclass
class NvbMatrix:
    testcase: str
    pairs: dict[tuple[int, int], float] = field(default_factory=dict)  # (src, dst) -> GB/s
    total: float | None = None


_NVB_RUNNING = re.compile(r"^Running (\w+)\.")
_NVB_TITLE = re.compile(r"(GPU|CPU)\(row\) (->|<-|<->) (GPU|CPU)\(column\) bandwidth")
_NVB_SUM = re.compile(r"^SUM (\w+) ([0-9.]+)")


def _nvb_cells(line: str, columns: list[int]) -> tuple[int, list[float | None]] | None:
    tokens = line.split()
    if len(tokens) != len(columns) + 1 or not tokens[0].isdigit():
        return None
    cells: list[float | None] = []
    for t in tokens[1:]:
        try:
            cells.append(float(t))
        except ValueError:
            cells.append(None)  # N/A
    return int(tokens[0]), cells


def _nvb_matrix_line(current: NvbMatrix, arrow: str, columns: list[int], line: str) -> None:
    parsed = _nvb_cells(line, columns)
    if parsed is None:
        return
    row, cells = parsed
    for col, value in zip(columns, cells, strict=True):
        if value is not None and row != col:
            current.pairs[(col, row) if arrow == "<-" else (row, col)] = value


def parse_nvbandwidth(text: str) -> dict[str, NvbMatrix]:
    out: dict[str, NvbMatrix] = {}
    current: NvbMatrix | None = None
    arrow, columns = "->", []  # type: ignore[var-annotated]
    for line in text.splitlines():
        if (m := _NVB_RUNNING.match(line.strip())) is not None:
            current = out.setdefault(m.group(1), NvbMatrix(m.group(1)))
        elif (t := _NVB_TITLE.search(line)) is not None:
            arrow, columns = t.group(2), []
        elif (s := _NVB_SUM.match(line.strip())) is not None and s.group(1) in out:
            out[s.group(1)].total = float(s.group(2))
        elif current is not None and not columns and line.split() and all(x.isdigit() for x in line.split()):
            columns = [int(x) for x in line.split()]
        elif current is not None and columns:
            _nvb_matrix_line(current, arrow, columns, line)
    if not any(m.pairs for m in out.values()):
        raise ParseError("nvbandwidth printed no bandwidth matrix")
    return out


# ------------------------------------------------------------------ the built-in probe


def parse_probe(text: str) -> list[dict[str, Any]]:
    """The probe's JSON lines (other lines, e.g. a library's warnings, are skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
    if not out:
        raise ParseError("the probe printed no result")
    return out
