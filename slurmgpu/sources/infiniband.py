"""InfiniBand / RoCE facts read straight from sysfs (``/sys/class/infiniband``).

No subprocesses and no libraries: every value is one small file read, so a
node with nine HCAs costs well under a millisecond. Layout read::

    <root>/class/infiniband/<dev>/{fw_ver,board_id,hca_type}
    <root>/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}
    <root>/class/infiniband/<dev>/ports/<n>/counters/<counter>   (every file, ints)
    <root>/class/infiniband/<dev>/ports/<n>/hw_counters/<counter> (Ethernet ports, opt-in)

Formats are the kernel's (drivers/infiniband/core/sysfs.c, documented in
Documentation/ABI/stable/sysfs-class-infiniband): ``state`` is "<n>: <name>" with
NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER (UNKNOWN past the table);
``phys_state`` is "<n>: <name>" with <unknown>, Sleep, Polling, Disabled,
PortConfigurationTraining, LinkUp, LinkErrorRecovery, "Phy Test" (names with a
space and angle brackets); a counter is a decimal integer, or "N/A (no PMA)"
where the device has no Performance Management Agent (older kernels).

Following the ``slurmgpu.facts`` convention, an absent file gives ``None``
(not applicable). A file the kernel refuses with EINVAL/EOPNOTSUPP/ENODATA
(some counters on RoCE ports, the rate of some down ports) also counts as not
applicable. A counter reading "N/A (no PMA)" is listed in
``IbPort.counters_unavailable`` (ib.errors reports it). A file that cannot be
read for another reason, or whose contents do not parse, leaves its field
``None`` and adds a note to ``IbFacts.error`` (notes joined with ``"; "``);
collection never raises.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from slurmgpu.facts import IbFacts, IbHca, IbPort

ENV_SYSFS_ROOT = "SLURMGPU_SYSFS_ROOT"
DEFAULT_SYSFS_ROOT = "/sys"

# errno values with which sysfs says "this attribute does not apply here".
_NOT_APPLICABLE_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.ENOENT})

# "4: ACTIVE", "5: LinkUp", "7: Phy Test", "0: <unknown>": the name is whatever the kernel's
# table holds, spaces and angle brackets included.
_ENUM_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S(?:.*\S)?)\s*$")
# A bare name, as some out-of-tree drivers write it ("ACTIVE").
_BARE_NAME_RE = re.compile(r"^\s*([A-Za-z][\w-]*)\s*$")
# "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", "100 Gb/sec (2X HDR)"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")
_DIGITS_RE = re.compile(r"(\d+)")
# What older kernels' show_pma_counter printed when the device has no process_mad (newer
# ones leave the counters directory out instead).
_NO_PMA = "N/A (no PMA)"
# hw_counters/lifespan is the cache time of the other files in ms (writable), not a counter.
_HW_NOT_COUNTERS = frozenset({"lifespan"})


class _Notes:
    """Accumulates per-file problems for ``IbFacts.error``."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def text(self) -> str | None:
        return "; ".join(self.items) if self.items else None


def _natural_key(name: str) -> list[int | str]:
    """Sort ``mlx5_2`` before ``mlx5_10``."""
    return [int(part) if part.isdigit() else part for part in _DIGITS_RE.split(name)]


def _read(path: Path, notes: _Notes) -> str | None:
    """The stripped text of a sysfs file; ``None`` when absent or not applicable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(4096)
    except OSError as exc:
        if exc.errno in _NOT_APPLICABLE_ERRNOS:
            return None
        notes.add(f"{path}: unreadable ({exc.strerror or exc})")
        return None
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        notes.add(f"{path}: not ASCII text")
        return None


def _parse_enum(path: Path, notes: _Notes) -> str | None:
    text = _read(path, notes)
    if text is None:
        return None
    m = _ENUM_RE.match(text) or _BARE_NAME_RE.match(text)
    if m is None:
        notes.add(f"{path}: unrecognised value {text[:40]!r}")
        return None
    return m.group(m.lastindex or 1)


def _parse_rate(port: IbPort, path: Path, notes: _Notes) -> None:
    text = _read(path, notes)
    if text is None:
        return
    port.rate_text = text
    m = _RATE_RE.match(text)
    if m is None:
        notes.add(f"{path}: unrecognised rate {text[:40]!r}")
        return
    port.rate_gbps = float(m.group(1))


def _counter_files(counters_dir: Path, notes: _Notes) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(counters_dir) if e.is_file())
    except FileNotFoundError:
        return []
    except OSError as exc:
        notes.add(f"{counters_dir}: cannot list ({exc.strerror or exc})")
        return []


def _read_counters(counters_dir: Path, notes: _Notes, unavailable: list[str] | None = None,
                   skip: frozenset[str] = frozenset()) -> dict[str, int]:
    """Every integer file in ``counters_dir``; names reading "N/A (no PMA)" go to
    ``unavailable`` (a note when the caller keeps no such list)."""
    counters: dict[str, int] = {}
    for name in _counter_files(counters_dir, notes):
        if name in skip:
            continue
        path = counters_dir / name
        text = _read(path, notes)
        if text is None:
            continue
        if text == _NO_PMA and unavailable is not None:
            unavailable.append(name)
            continue
        try:
            counters[name] = int(text, 0) if text.startswith("0x") else int(text)
        except ValueError:
            notes.add(f"{path}: not an integer {text[:40]!r}")
    return counters


def _read_port(port_dir: Path, number: int, notes: _Notes, hw_counters: bool) -> IbPort:
    port = IbPort(port=number)
    port.state = _parse_enum(port_dir / "state", notes)
    port.phys_state = _parse_enum(port_dir / "phys_state", notes)
    _parse_rate(port, port_dir / "rate", notes)
    port.link_layer = _read(port_dir / "link_layer", notes) or None
    port.counters = _read_counters(port_dir / "counters", notes, port.counters_unavailable)
    # Only RoCE ports: on mlx5 each read of these files may cost a firmware query.
    if hw_counters and port.link_layer == "Ethernet":
        port.hw_counters = _read_counters(port_dir / "hw_counters", notes, skip=_HW_NOT_COUNTERS)
    return port


def _read_hca(dev_dir: Path, notes: _Notes, hw_counters: bool) -> IbHca:
    hca = IbHca(name=dev_dir.name)
    hca.fw_ver = _read(dev_dir / "fw_ver", notes) or None
    hca.board_id = _read(dev_dir / "board_id", notes) or None
    hca.hca_type = _read(dev_dir / "hca_type", notes) or None
    ports_dir = dev_dir / "ports"
    try:
        names = [e.name for e in os.scandir(ports_dir) if e.is_dir()]
    except FileNotFoundError:
        return hca
    except OSError as exc:
        notes.add(f"{ports_dir}: cannot list ({exc.strerror or exc})")
        return hca
    numbered: list[tuple[int, str]] = []
    for name in names:
        if name.isdigit():
            numbered.append((int(name), name))
        else:
            notes.add(f"{ports_dir / name}: port directory name is not a number, skipped")
    for number, name in sorted(numbered):
        hca.ports.append(_read_port(ports_dir / name, number, notes, hw_counters))
    return hca


class SysfsIbSource:
    """``IbSource`` reading ``<sysfs_root>/class/infiniband``.

    ``sysfs_root`` defaults to ``$SLURMGPU_SYSFS_ROOT`` when that environment
    variable is set and non-empty (read when the object is built), else to
    ``/sys``. An explicit ``sysfs_root`` argument always wins over the variable.
    Point it at a fixture tree (``tests/data/sysfs/<name>``) to test without
    hardware. ``hw_counters``: also read ``ports/<n>/hw_counters`` of Ethernet
    (RoCE) ports (``[ib] roce_hw_counters``).
    """

    def __init__(self, sysfs_root: str | Path | None = None, *, hw_counters: bool = False) -> None:
        if sysfs_root is None:
            sysfs_root = os.environ.get(ENV_SYSFS_ROOT) or DEFAULT_SYSFS_ROOT
        self.sysfs_root = Path(sysfs_root)
        self.hw_counters = hw_counters

    @property
    def class_dir(self) -> Path:
        return self.sysfs_root / "class" / "infiniband"

    def collect(self) -> IbFacts:
        class_dir = self.class_dir
        try:
            entries = list(os.scandir(class_dir))
        except (FileNotFoundError, NotADirectoryError):
            return IbFacts(available=False, error=f"no InfiniBand devices ({class_dir} absent)")
        except OSError as exc:
            return IbFacts(available=False, error=f"cannot list {class_dir}: {exc.strerror or exc}")
        notes = _Notes()
        names = sorted((e.name for e in entries if e.is_dir()), key=_natural_key)
        hcas = [_read_hca(class_dir / name, notes, self.hw_counters) for name in names]
        return IbFacts(available=True, hcas=hcas, error=notes.text())
