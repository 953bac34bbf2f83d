#!/usr/bin/env python3
"""(Re)create the sysfs fixture trees used by ``tests/test_infiniband.py``.

Run ``python tests/data/sysfs/make_fixtures.py [DEST]`` (DEST defaults to this
script's directory). Output is deterministic; ``tests/test_infiniband.py``
checks that the trees in the repository match what this script writes, so edit
this script and rerun it rather than editing the trees by hand.

Trees (each is a sysfs root, i.e. contains ``class/infiniband``):

- ``ib-healthy``: ``mlx5_0``..``mlx5_7`` ConnectX-7 (MT4129, fw 28.39.1002,
  board MT_0000000838), one InfiniBand port each, 4: ACTIVE / 5: LinkUp,
  400 Gb/sec (4X NDR), error counters zero-ish; plus ``mlx5_8``, a ConnectX-6 Dx
  RoCE port (link_layer Ethernet, 100 Gb/sec (2X HDR)).
- ``ib-port-down``: as healthy, but ``mlx5_3`` port 1 is 1: DOWN / 3: Disabled.
- ``ib-rate-downgraded``: as healthy, but ``mlx5_5`` runs at 200 Gb/sec (4X HDR).
- ``ib-counters-rising/before`` and ``.../after``: two samples of the same node;
  ``mlx5_2`` symbol_error and link_downed grow between them (traffic counters
  grow everywhere, as on a busy node).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

Tree = dict[str, str]  # path relative to the sysfs root -> file contents

FIXTURES = ("ib-healthy", "ib-port-down", "ib-rate-downgraded", "ib-counters-rising")

ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "VL15_dropped",
)
TRAFFIC_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
    "port_xmit_wait",
)

IB_HCAS = [f"mlx5_{i}" for i in range(8)]
ROCE_HCA = "mlx5_8"


def _dev(name: str) -> str:
    return f"class/infiniband/{name}"


def _port(name: str, port: int = 1) -> str:
    return f"{_dev(name)}/ports/{port}"


def _traffic(index: int, sample: int) -> dict[str, int]:
    """Deterministic, plausible traffic counters for HCA ``index`` at ``sample``."""
    base = (index + 1) * 1_000_003 * (sample + 1)
    return {
        "port_xmit_data": base * 4096,
        "port_rcv_data": base * 4093,
        "port_xmit_packets": base,
        "port_rcv_packets": base + 17 * (index + 1),
        "unicast_xmit_packets": base - 11,
        "unicast_rcv_packets": base + 5,
        "multicast_xmit_packets": 11,
        "multicast_rcv_packets": 23 + index,
        "port_xmit_wait": 1000 * (index + 1) * (sample + 1),
    }


def _hca(
    tree: Tree,
    name: str,
    index: int,
    *,
    fw: str,
    board: str,
    hca_type: str,
    link_layer: str,
    rate: str,
    sample: int = 0,
) -> None:
    dev = _dev(name)
    tree[f"{dev}/fw_ver"] = fw
    tree[f"{dev}/board_id"] = board
    tree[f"{dev}/hca_type"] = hca_type
    tree[f"{dev}/node_type"] = "1: CA"
    tree[f"{dev}/node_guid"] = f"a088:c203:00{index:02x}:5e10"
    port = _port(name)
    tree[f"{port}/state"] = "4: ACTIVE"
    tree[f"{port}/phys_state"] = "5: LinkUp"
    tree[f"{port}/rate"] = rate
    tree[f"{port}/link_layer"] = link_layer
    tree[f"{port}/lid"] = "0x0" if link_layer == "Ethernet" else f"0x{0x100 + index:x}"
    tree[f"{port}/sm_lid"] = "0x0" if link_layer == "Ethernet" else "0x1"
    counters = {c: 0 for c in ERROR_COUNTERS}
    counters.update(_traffic(index, sample))
    # "zero-ish": a couple of old, harmless errors.
    if index == 1:
        counters["symbol_error"] = 2
    if index == 6:
        counters["port_rcv_errors"] = 1
    for counter, value in counters.items():
        tree[f"{port}/counters/{counter}"] = str(value)


def healthy(sample: int = 0) -> Tree:
    tree: Tree = {}
    for i, name in enumerate(IB_HCAS):
        _hca(
            tree,
            name,
            i,
            fw="28.39.1002",
            board="MT_0000000838",
            hca_type="MT4129",
            link_layer="InfiniBand",
            rate="400 Gb/sec (4X NDR)",
            sample=sample,
        )
    _hca(
        tree,
        ROCE_HCA,
        8,
        fw="22.39.1002",
        board="MT_0000000359",
        hca_type="MT4125",
        link_layer="Ethernet",
        rate="100 Gb/sec (2X HDR)",
        sample=sample,
    )
    return tree


def port_down() -> Tree:
    tree = healthy()
    port = _port("mlx5_3")
    tree[f"{port}/state"] = "1: DOWN"
    tree[f"{port}/phys_state"] = "3: Disabled"
    # What mlx5 reports for a port with no link: the slowest rate.
    tree[f"{port}/rate"] = "10 Gb/sec (4X SDR)"
    return tree


def rate_downgraded() -> Tree:
    tree = healthy()
    tree[f"{_port('mlx5_5')}/rate"] = "200 Gb/sec (4X HDR)"
    return tree


def counters_rising() -> dict[str, Tree]:
    before = healthy(sample=0)
    after = healthy(sample=1)
    counters = f"{_port('mlx5_2')}/counters"
    before[f"{counters}/symbol_error"] = "3"
    before[f"{counters}/link_downed"] = "0"
    after[f"{counters}/symbol_error"] = "412"
    after[f"{counters}/link_downed"] = "2"
    return {"before": before, "after": after}


def all_trees() -> dict[str, Tree]:
    """Every fixture, keyed by its path relative to the fixtures directory."""
    trees = {
        "ib-healthy": healthy(),
        "ib-port-down": port_down(),
        "ib-rate-downgraded": rate_downgraded(),
    }
    for sample, tree in counters_rising().items():
        trees[f"ib-counters-rising/{sample}"] = tree
    return trees


def write(dest: Path) -> list[Path]:
    """Replace the fixture trees under ``dest``; returns the roots written."""
    dest = Path(dest)
    for name in FIXTURES:
        shutil.rmtree(dest / name, ignore_errors=True)
    roots = []
    for rel_root, tree in sorted(all_trees().items()):
        root = dest / rel_root
        for rel, content in sorted(tree.items()):
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content + "\n", encoding="ascii")
        roots.append(root)
    return roots


def main(argv: list[str]) -> int:
    dest = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    for root in write(dest):
        print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
