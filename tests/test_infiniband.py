"""SysfsIbSource against the fixture trees in tests/data/sysfs (see make_fixtures.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from slurmgpu.facts import IbFacts, IbHca, IbPort
from slurmgpu.sources import IbSource
from slurmgpu.sources.infiniband import ENV_SYSFS_ROOT, SysfsIbSource

SYSFS = Path(__file__).parent / "data" / "sysfs"
IB_NAMES = [f"mlx5_{i}" for i in range(8)]
NAMED_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


def collect(name: str | Path) -> IbFacts:
    return SysfsIbSource(SYSFS / name).collect()


def hca(facts: IbFacts, name: str) -> IbHca:
    (found,) = [h for h in facts.hcas if h.name == name]
    return found


def port1(facts: IbFacts, name: str) -> IbPort:
    ports = hca(facts, name).ports
    assert [p.port for p in ports] == [1]
    return ports[0]


@pytest.fixture
def healthy_copy(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ib-healthy", root)
    return root


def test_satisfies_protocol() -> None:
    source: IbSource = SysfsIbSource(SYSFS / "ib-healthy")
    assert isinstance(source.collect(), IbFacts)


def test_healthy_tree() -> None:
    facts = collect("ib-healthy")
    assert facts.available is True
    assert facts.error is None
    assert [h.name for h in facts.hcas] == [*IB_NAMES, "mlx5_8"]
    for name in IB_NAMES:
        h = hca(facts, name)
        assert (h.fw_ver, h.board_id, h.hca_type) == ("28.39.1002", "MT_0000000838", "MT4129")
        p = port1(facts, name)
        assert p.state == "ACTIVE"
        assert p.phys_state == "LinkUp"
        assert p.rate_gbps == 400.0
        assert p.rate_text == "400 Gb/sec (4X NDR)"
        assert p.link_layer == "InfiniBand"
        for counter in NAMED_COUNTERS:
            assert isinstance(p.counters[counter], int)
            assert p.counters[counter] <= 2
        # Counters beyond the named ones are collected too.
        assert p.counters["port_xmit_data"] > 0
        assert "VL15_dropped" in p.counters
    assert port1(facts, "mlx5_1").counters["symbol_error"] == 2


def test_healthy_roce_port() -> None:
    facts = collect("ib-healthy")
    h = hca(facts, "mlx5_8")
    assert (h.fw_ver, h.board_id, h.hca_type) == ("22.39.1002", "MT_0000000359", "MT4125")
    p = port1(facts, "mlx5_8")
    assert p.link_layer == "Ethernet"
    assert p.rate_gbps == 100.0
    assert p.rate_text == "100 Gb/sec (2X HDR)"
    assert p.state == "ACTIVE"


def test_port_down() -> None:
    facts = collect("ib-port-down")
    assert facts.error is None
    p = port1(facts, "mlx5_3")
    assert (p.state, p.phys_state) == ("DOWN", "Disabled")
    others = [port1(facts, n) for n in IB_NAMES if n != "mlx5_3"]
    assert all(o.state == "ACTIVE" and o.phys_state == "LinkUp" for o in others)


def test_rate_downgraded() -> None:
    facts = collect("ib-rate-downgraded")
    assert facts.error is None
    rates = {n: port1(facts, n).rate_gbps for n in IB_NAMES}
    assert rates.pop("mlx5_5") == 200.0
    assert set(rates.values()) == {400.0}
    assert port1(facts, "mlx5_5").rate_text == "200 Gb/sec (4X HDR)"


def test_counters_rising() -> None:
    before = collect("ib-counters-rising/before")
    after = collect("ib-counters-rising/after")
    assert before.error is None and after.error is None
    b, a = port1(before, "mlx5_2").counters, port1(after, "mlx5_2").counters
    assert a["symbol_error"] > b["symbol_error"]
    assert a["link_downed"] > b["link_downed"]
    assert (b["symbol_error"], a["symbol_error"]) == (3, 412)
    assert (b["link_downed"], a["link_downed"]) == (0, 2)
    for name in [*IB_NAMES, "mlx5_8"]:
        pb, pa = port1(before, name).counters, port1(after, name).counters
        assert pa["port_xmit_data"] > pb["port_xmit_data"]  # traffic grows everywhere
        if name != "mlx5_2":
            assert {c: pa[c] for c in NAMED_COUNTERS} == {c: pb[c] for c in NAMED_COUNTERS}


def test_missing_class_dir(tmp_path: Path) -> None:
    facts = SysfsIbSource(tmp_path).collect()
    assert facts.available is False
    assert facts.hcas == []
    assert facts.error == f"no InfiniBand devices ({tmp_path}/class/infiniband absent)"


def test_missing_class_dir_message_for_default_root() -> None:
    source = SysfsIbSource("/sys")
    if source.class_dir.exists():
        pytest.skip("this machine has InfiniBand devices")
    assert source.collect() == IbFacts(
        available=False, error="no InfiniBand devices (/sys/class/infiniband absent)"
    )


def test_empty_class_dir(tmp_path: Path) -> None:
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert SysfsIbSource(tmp_path).collect() == IbFacts(available=True, hcas=[])


def test_garbled_files_are_recorded_not_raised(healthy_copy: Path) -> None:
    port = healthy_copy / "class/infiniband/mlx5_0/ports/1"
    (port / "state").write_text("???\n")
    (port / "phys_state").write_bytes(b"\xff\xfe\x00garbage")
    (port / "rate").write_text("fast\n")
    (port / "counters/symbol_error").write_text("lots\n")
    facts = SysfsIbSource(healthy_copy).collect()
    assert facts.available is True
    assert facts.error is not None
    p = port1(facts, "mlx5_0")
    assert p.state is None
    assert p.phys_state is None
    assert p.rate_gbps is None
    assert p.rate_text == "fast"
    assert "symbol_error" not in p.counters
    assert p.counters["link_downed"] == 0
    for piece in ("mlx5_0/ports/1/state", "phys_state", "mlx5_0/ports/1/rate", "symbol_error"):
        assert piece in facts.error
    # The other HCAs are untouched.
    assert port1(facts, "mlx5_1").state == "ACTIVE"


def test_empty_state_file_is_garbled(healthy_copy: Path) -> None:
    (healthy_copy / "class/infiniband/mlx5_4/ports/1/state").write_text("")
    facts = SysfsIbSource(healthy_copy).collect()
    assert port1(facts, "mlx5_4").state is None
    assert facts.error is not None and "mlx5_4/ports/1/state" in facts.error


def test_unreadable_file_is_recorded(healthy_copy: Path) -> None:
    # A directory where a file should be: open() fails with EISDIR, even as root.
    fw = healthy_copy / "class/infiniband/mlx5_2/fw_ver"
    fw.unlink()
    fw.mkdir()
    facts = SysfsIbSource(healthy_copy).collect()
    assert hca(facts, "mlx5_2").fw_ver is None
    assert facts.error is not None and "mlx5_2/fw_ver: unreadable" in facts.error


def test_missing_files_are_not_applicable(healthy_copy: Path) -> None:
    dev = healthy_copy / "class/infiniband/mlx5_7"
    (dev / "board_id").unlink()
    (dev / "ports/1/link_layer").unlink()
    (dev / "ports/1/rate").unlink()
    shutil.rmtree(dev / "ports/1/counters")
    facts = SysfsIbSource(healthy_copy).collect()
    assert facts.error is None
    h = hca(facts, "mlx5_7")
    assert h.board_id is None and h.fw_ver == "28.39.1002"
    p = port1(facts, "mlx5_7")
    assert (p.link_layer, p.rate_gbps, p.rate_text, p.counters) == (None, None, None, {})
    assert p.state == "ACTIVE"


def test_bare_state_names_accepted(healthy_copy: Path) -> None:
    (healthy_copy / "class/infiniband/mlx5_6/ports/1/state").write_text("ACTIVE\n")
    facts = SysfsIbSource(healthy_copy).collect()
    assert facts.error is None
    assert port1(facts, "mlx5_6").state == "ACTIVE"


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("100 Gb/sec (2X HDR)", 100.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("56 Gb/sec (4X FDR)", 56.0),
        ("800 Gb/sec (4X XDR)", 800.0),
    ],
)
def test_rate_formats(healthy_copy: Path, text: str, gbps: float) -> None:
    (healthy_copy / "class/infiniband/mlx5_0/ports/1/rate").write_text(text + "\n")
    p = port1(SysfsIbSource(healthy_copy).collect(), "mlx5_0")
    assert (p.rate_gbps, p.rate_text) == (gbps, text)


def test_sorted_devices_and_ports(tmp_path: Path) -> None:
    ib = tmp_path / "class" / "infiniband"
    for dev in ("mlx5_10", "mlx5_2", "ibp1s0", "mlx5_1"):
        for port in ("2", "10", "1"):
            d = ib / dev / "ports" / port
            d.mkdir(parents=True)
            (d / "state").write_text("4: ACTIVE\n")
    (ib / "mlx5_1" / "ports" / "bogus").mkdir()
    facts = SysfsIbSource(tmp_path).collect()
    assert [h.name for h in facts.hcas] == ["ibp1s0", "mlx5_1", "mlx5_2", "mlx5_10"]
    assert [p.port for p in facts.hcas[0].ports] == [1, 2, 10]
    assert facts.error is not None and "bogus" in facts.error


def test_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_SYSFS_ROOT, str(SYSFS / "ib-port-down"))
    source = SysfsIbSource()
    assert source.sysfs_root == SYSFS / "ib-port-down"
    assert port1(source.collect(), "mlx5_3").state == "DOWN"
    # An explicit argument beats the variable.
    assert SysfsIbSource(tmp_path).sysfs_root == tmp_path
    monkeypatch.setenv(ENV_SYSFS_ROOT, "")
    assert SysfsIbSource().sysfs_root == Path("/sys")
    monkeypatch.delenv(ENV_SYSFS_ROOT)
    assert SysfsIbSource().sysfs_root == Path("/sys")


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_fixtures", SYSFS / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_checked_in_trees_match_generator(tmp_path: Path) -> None:
    gen = _load_generator()
    gen.write(tmp_path)
    for name in gen.FIXTURES:
        generated, checked_in = _files(tmp_path / name), _files(SYSFS / name)
        assert generated, name
        assert generated.keys() == checked_in.keys(), (
            f"{name}: run python tests/data/sysfs/make_fixtures.py"
        )
        assert generated == checked_in, f"{name}: run python tests/data/sysfs/make_fixtures.py"
