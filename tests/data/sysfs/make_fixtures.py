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
- ``ib-hgx-h100``: the layout of a real HGX H100 node, which the old example
  ``devices = ["mlx5_[0-7]"]`` did not fit: compute HCAs ``mlx5_0``, ``mlx5_1``,
  ``mlx5_4``..``mlx5_9`` (ConnectX-7, InfiniBand, 400 Gb/sec (4X NDR), ACTIVE /
  LinkUp), ``mlx5_2`` and ``mlx5_3`` Ethernet (front-end / storage) and
  ``mlx5_bond_0``, a RoCE bond (Ethernet). Every port also has the mlx5
  ``hw_counters`` directory (counters.c names, plus ``lifespan``).
- ``ib-mlx4-dual-port``: a ConnectX-3 (``mlx4_0``) with two ports on one device:
  port 1 InfiniBand FDR ACTIVE / LinkUp, port 2 uncabled (1: DOWN / 2: Polling).
- ``ib-no-pma``: Soft-RoCE ``rxe0`` on an older kernel, whose counters read
  "N/A (no PMA)" (the device has no Performance Management Agent).

Formats follow the kernel (drivers/infiniband/core/sysfs.c, documented in
Documentation/ABI/stable/sysfs-class-infiniband): ``state`` "<n>: <name>",
``phys_state`` "<n>: <name>", ``rate`` "<Gb> Gb/sec (<width>X <speed>)",
``link_layer`` InfiniBand or Ethernet, one decimal integer per counter file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

Tree = dict[str, str]  # path relative to the sysfs root -> file contents

FIXTURES = ("ib-healthy", "ib-port-down", "ib-rate-downgraded", "ib-counters-rising", "ib-hgx-h100",
            "ib-mlx4-dual-port", "ib-no-pma")

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

HGX_IB_HCAS = ["mlx5_0", "mlx5_1", *(f"mlx5_{i}" for i in range(4, 10))]
HGX_ETH_HCAS = ["mlx5_2", "mlx5_3"]
HGX_BOND = "mlx5_bond_0"
# Port counters the mlx5 driver publishes under ports/<n>/hw_counters (counters.c:
# q counters, congestion counters, extended error counters, RoCE acceleration).
MLX5_HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
)
NO_PMA = "N/A (no PMA)"


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
    port: int = 1,
) -> None:
    dev = _dev(name)
    tree[f"{dev}/fw_ver"] = fw
    tree[f"{dev}/board_id"] = board
    tree[f"{dev}/hca_type"] = hca_type
    tree[f"{dev}/node_type"] = "1: CA"
    tree[f"{dev}/node_guid"] = f"a088:c203:00{index:02x}:5e10"
    base = _port(name, port)
    tree[f"{base}/state"] = "4: ACTIVE"
    tree[f"{base}/phys_state"] = "5: LinkUp"
    tree[f"{base}/rate"] = rate
    tree[f"{base}/link_layer"] = link_layer
    tree[f"{base}/lid"] = "0x0" if link_layer == "Ethernet" else f"0x{0x100 + index:x}"
    tree[f"{base}/sm_lid"] = "0x0" if link_layer == "Ethernet" else "0x1"
    counters = {c: 0 for c in ERROR_COUNTERS}
    counters.update(_traffic(index, sample))
    # "zero-ish": a couple of old, harmless errors.
    if index == 1:
        counters["symbol_error"] = 2
    if index == 6:
        counters["port_rcv_errors"] = 1
    for counter, value in counters.items():
        tree[f"{base}/counters/{counter}"] = str(value)


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


def _hw_counters(tree: Tree, name: str, index: int, port: int = 1) -> None:
    hw = f"{_port(name, port)}/hw_counters"
    for counter in MLX5_HW_COUNTERS:
        tree[f"{hw}/{counter}"] = "0"
    # A busy node: some requests served, a few congestion notifications handled.
    tree[f"{hw}/rx_write_requests"] = str(52_000 * (index + 1))
    tree[f"{hw}/rx_read_requests"] = str(31_000 * (index + 1))
    tree[f"{hw}/rp_cnp_handled"] = str(7 * index)
    tree[f"{hw}/lifespan"] = "10"  # ms the values are cached: a setting, not a counter


def hgx_h100() -> Tree:
    tree: Tree = {}
    for i, name in enumerate(HGX_IB_HCAS):
        _hca(tree, name, i, fw="28.39.1002", board="MT_0000000838", hca_type="MT4129",
             link_layer="InfiniBand", rate="400 Gb/sec (4X NDR)")
    for i, name in enumerate([*HGX_ETH_HCAS, HGX_BOND], start=len(HGX_IB_HCAS)):
        _hca(tree, name, i, fw="28.39.1002", board="MT_0000000838", hca_type="MT4129",
             link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
    for i, name in enumerate([*HGX_IB_HCAS, *HGX_ETH_HCAS, HGX_BOND]):
        _hw_counters(tree, name, i)
    return tree


def mlx4_dual_port() -> Tree:
    tree: Tree = {}
    _hca(tree, "mlx4_0", 0, fw="2.42.5000", board="MT_1090120019", hca_type="MT4099",
         link_layer="InfiniBand", rate="56 Gb/sec (4X FDR)")
    # Port 2 has no cable: the link trains forever (Polling) and the rate is the default.
    _hca(tree, "mlx4_0", 0, fw="2.42.5000", board="MT_1090120019", hca_type="MT4099",
         link_layer="InfiniBand", rate="10 Gb/sec (4X SDR)", port=2)
    port2 = _port("mlx4_0", 2)
    tree[f"{port2}/state"] = "1: DOWN"
    tree[f"{port2}/phys_state"] = "2: Polling"
    tree[f"{port2}/lid"] = "0x0"
    tree[f"{port2}/sm_lid"] = "0x0"
    for counter in TRAFFIC_COUNTERS:
        tree[f"{port2}/counters/{counter}"] = "0"
    return tree


def no_pma() -> Tree:
    tree: Tree = {}
    dev, port = _dev("rxe0"), _port("rxe0")
    tree[f"{dev}/node_type"] = "1: CA"
    tree[f"{dev}/node_guid"] = "5254:00ff:fe12:3456"
    tree[f"{port}/state"] = "4: ACTIVE"
    tree[f"{port}/phys_state"] = "5: LinkUp"
    tree[f"{port}/rate"] = "10 Gb/sec (1X QDR)"
    tree[f"{port}/link_layer"] = "Ethernet"
    for counter in (*ERROR_COUNTERS, *TRAFFIC_COUNTERS[:5]):
        tree[f"{port}/counters/{counter}"] = NO_PMA
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
        "ib-hgx-h100": hgx_h100(),
        "ib-mlx4-dual-port": mlx4_dual_port(),
        "ib-no-pma": no_pma(),
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
