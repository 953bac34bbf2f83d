"""SysfsIbSource against the fixture trees in tests/data/sysfs (see make_fixtures.py), and the\nib.* checks and [ib] settings over real layouts (HGX H100, dual-port ConnectX-3, no PMA)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from slurmgpu.config.load import load_config, parse_config
from slurmgpu.config.schema import Settings
from slurmgpu.engine import evaluate
from slurmgpu.errors import ConfigError
from slurmgpu.facts import IbFacts, IbHca, IbPort, NodeFacts
from slurmgpu.result import Finding, Severity
from slurmgpu.sources import IbSource
from slurmgpu.sources.infiniband import ENV_SYSFS_ROOT, SysfsIbSource
from slurmgpu.testing import make_facts

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


# --------------------------------------------------------------------------- real layouts and kernel text

HGX_IB = ["mlx5_0", "mlx5_1", *(f"mlx5_{i}" for i in range(4, 10))]
HGX_ETHERNET = ["mlx5_2", "mlx5_3", "mlx5_bond_0"]
EXAMPLE = Path(__file__).resolve().parent.parent / "etc" / "slurmgpu.example.toml"


def _copy(tmp_path: Path, tree: str) -> Path:
    root = tmp_path / tree
    shutil.copytree(SYSFS / tree, root)
    return root


def _write(root: Path, rel: str, text: str) -> None:
    (root / "class" / "infiniband" / rel).write_text(text + "\n")


def _facts(ib: IbFacts, previous: NodeFacts | None = None) -> NodeFacts:
    facts = make_facts(ib_ports=0)
    facts.ib, facts.previous = ib, previous
    return facts


def _ib_problems(facts: NodeFacts, settings: Settings) -> set[tuple[str, str, str | None]]:
    return {(f.check, f.severity.name, f.subject) for f in evaluate(facts, settings).findings
            if f.severity is not Severity.OK and f.check.startswith(("ib.", "pin.ib"))}


def _findings(facts: NodeFacts, settings: Settings, check: str) -> list[Finding]:
    return [f for f in evaluate(facts, settings).findings if f.check == check]


def test_hgx_h100_tree() -> None:
    facts = collect("ib-hgx-h100")
    assert facts.error is None
    assert [h.name for h in facts.hcas] == [f"mlx5_{i}" for i in range(10)] + ["mlx5_bond_0"]
    for name in HGX_IB:
        p = port1(facts, name)
        assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    for name in HGX_ETHERNET:
        assert port1(facts, name).link_layer == "Ethernet"
    # hw_counters are opt-in ([ib] roce_hw_counters): not read by default.
    assert all(p.hw_counters is None and p.counters_unavailable == [] for h in facts.hcas for p in h.ports)


def test_hw_counters_read_for_roce_ports_only_when_asked() -> None:
    facts = SysfsIbSource(SYSFS / "ib-hgx-h100", hw_counters=True).collect()
    assert facts.error is None
    bond = port1(facts, "mlx5_bond_0").hw_counters
    assert bond is not None and bond["local_ack_timeout_err"] == 0 and bond["rx_write_requests"] > 0
    assert "lifespan" not in bond  # the cache time in ms, not a counter
    assert port1(facts, "mlx5_0").hw_counters is None  # InfiniBand: not a RoCE port


@pytest.mark.parametrize(("text", "name"), [
    ("7: Phy Test", "Phy Test"),
    ("0: <unknown>", "<unknown>"),
    ("1: Sleep", "Sleep"),
    ("2: Polling", "Polling"),
    ("4: PortConfigurationTraining", "PortConfigurationTraining"),
    ("6: LinkErrorRecovery", "LinkErrorRecovery"),
])
def test_every_kernel_phys_state_parses_and_only_linkup_passes(tmp_path: Path, text: str, name: str) -> None:
    root = _copy(tmp_path, "ib-hgx-h100")
    _write(root, "mlx5_4/ports/1/phys_state", text)
    facts = SysfsIbSource(root).collect()
    assert facts.error is None
    assert port1(facts, "mlx5_4").phys_state == name
    assert _ib_problems(_facts(facts), Settings()) == {("ib.port_state", "FAIL", "mlx5_4/1")}


@pytest.mark.parametrize(("text", "name"), [
    ("0: NOP", "NOP"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"), ("3: ARMED", "ARMED"),
    ("5: ACTIVE_DEFER", "ACTIVE_DEFER"), ("6: UNKNOWN", "UNKNOWN"),
])
def test_every_kernel_state_parses(tmp_path: Path, text: str, name: str) -> None:
    root = _copy(tmp_path, "ib-hgx-h100")
    _write(root, "mlx5_5/ports/1/state", text)
    facts = SysfsIbSource(root).collect()
    assert facts.error is None and port1(facts, "mlx5_5").state == name
    assert _ib_problems(_facts(facts), Settings()) == {("ib.port_state", "FAIL", "mlx5_5/1")}


def test_no_pma_counters_are_a_warning_never_a_failure() -> None:
    facts = collect("ib-no-pma")
    assert facts.error is None  # recorded in the port, not as unparseable text
    p = port1(facts, "rxe0")
    assert p.counters == {} and "link_downed" in p.counters_unavailable and "symbol_error" in p.counters_unavailable
    settings = Settings()
    settings.ib.include_ethernet = True
    settings.ib.counters_severity = "fail"
    (finding,) = [f for f in _findings(_facts(facts), settings, "ib.errors") if f.severity is not Severity.OK]
    assert finding.severity is Severity.WARN and finding.subject == "rxe0/1"
    assert "N/A (no PMA)" in finding.message and "link_downed" in finding.message
    # Out of scope (an Ethernet port without include_ethernet): nothing to say.
    assert _ib_problems(_facts(facts), Settings()) == set()


@pytest.mark.parametrize(("counter", "full"), [
    ("link_downed", 255), ("link_error_recovery", 255), ("symbol_error", 65535),
    ("local_link_integrity_errors", 15), ("excessive_buffer_overrun_errors", 15),
])
def test_saturated_counter_warns_instead_of_trusting_a_zero_delta(tmp_path: Path, counter: str,
                                                                  full: int) -> None:
    root = _copy(tmp_path, "ib-hgx-h100")
    _write(root, f"mlx5_6/ports/1/counters/{counter}", str(full))
    before = SysfsIbSource(root).collect()
    now = _facts(SysfsIbSource(root).collect(), previous=_facts(before))  # unchanged: delta 0
    settings = Settings()
    settings.ib.counters_max = {}  # the absolute value is counters_max's business, not this test's
    (finding,) = [f for f in _findings(now, settings, "ib.errors") if f.severity is not Severity.OK]
    assert finding.severity is Severity.WARN and finding.subject == "mlx5_6/1"
    assert "saturated" in finding.message and f"{counter} {full}" in finding.message
    assert "perfquery -C mlx5_6 -P 1 -R" in finding.message
    below = full - 1
    _write(root, f"mlx5_6/ports/1/counters/{counter}", str(below))
    assert not [f for f in _findings(_facts(SysfsIbSource(root).collect()), settings, "ib.errors")
                if f.severity is not Severity.OK]


@pytest.mark.parametrize(("counter", "full", "ceiling"), [
    ("local_link_integrity_errors", 15, 10), ("excessive_buffer_overrun_errors", 15, 10), ("link_downed", 255, 5),
])
def test_a_saturated_counter_over_its_ceiling_is_one_warning(tmp_path: Path, counter: str, full: int,
                                                            ceiling: int) -> None:
    """The default counters_max (10) is below a 4-bit counter's maximum (15): the absolute
    limit and the saturation are one WARN for the port, naming both (issue 28)."""
    root = _copy(tmp_path, "ib-hgx-h100")
    _write(root, f"mlx5_6/ports/1/counters/{counter}", str(full))
    findings = [f for f in _findings(_facts(SysfsIbSource(root).collect()), Settings(), "ib.errors")
                if f.severity is not Severity.OK]
    assert [(f.severity, f.subject) for f in findings] == [(Severity.WARN, "mlx5_6/1")]
    assert "saturated" in findings[0].message and f"{counter} {full}" in findings[0].message
    assert f"over max {ceiling}" in findings[0].message
    settings = Settings()
    settings.ib.counters_severity = "fail"  # a failing ceiling is its own finding, not folded into a WARN
    findings = [f for f in _findings(_facts(SysfsIbSource(root).collect()), settings, "ib.errors")
                if f.severity is not Severity.OK]
    assert sorted(f.severity.name for f in findings) == ["FAIL", "WARN"]


def test_saturated_link_downed_blinds_flap_and_says_so(tmp_path: Path) -> None:
    root = _copy(tmp_path, "ib-hgx-h100")
    _write(root, "mlx5_7/ports/1/counters/link_downed", "255")
    facts = _facts(SysfsIbSource(root).collect())
    for hca in facts.ib.hcas:  # what the agent's tracker writes: history, nothing flapping
        for port in hca.ports:
            port.flap_rises, port.flap_strikes = 0, 0
    problems = [f for f in _findings(facts, Settings(), "ib.flap") if f.severity is not Severity.OK]
    assert [(f.severity, f.subject) for f in problems] == [(Severity.WARN, "mlx5_7/1")]
    assert "flapping can no longer be seen" in problems[0].message


def test_port_globs_on_a_dual_port_hca_with_port_2_uncabled() -> None:
    facts = _facts(collect("ib-mlx4-dual-port"))
    p2 = hca(facts.ib, "mlx4_0").ports[1]
    assert (p2.port, p2.state, p2.phys_state) == (2, "DOWN", "Polling")

    def problems(devices: list[str]) -> set[tuple[str, str, str | None]]:
        settings = Settings()
        settings.ib.count, settings.ib.rate_gbps, settings.ib.devices = 1, 56, devices
        return _ib_problems(facts, settings)

    # Whole-HCA selection counts the uncabled port: FAIL forever.
    assert problems(["mlx4_0"]) == {("ib.count", "FAIL", None), ("ib.port_state", "FAIL", "mlx4_0/2")}
    assert problems(["*"]) == problems(["mlx4_0"])
    # Port-level selection leaves it out of scope: neither counted nor judged.
    assert problems(["mlx4_0/1"]) == set()
    assert problems(["mlx4_*/1"]) == set()
    assert problems(["mlx4_0/[1]"]) == set()
    assert problems(["mlx4_0/2"]) == {("ib.port_state", "FAIL", "mlx4_0/2")}  # counted, and down


def test_ib_count_names_ports_it_did_not_count() -> None:
    facts = _facts(collect("ib-hgx-h100"))
    settings = Settings()
    settings.ib.count, settings.ib.devices = 8, ["mlx5_[0-7]"]
    (finding,) = _findings(facts, settings, "ib.count")
    assert finding.severity is Severity.FAIL
    assert finding.message.startswith("6 InfiniBand ports present, 8 expected; not counted: ")
    assert "mlx5_2/1 Ethernet" in finding.message and "mlx5_8/1 not in [ib] devices" in finding.message
    assert "mlx5_bond_0/1 not in [ib] devices" in finding.message


def _example(text: str | None = None) -> Settings:
    if text is None:
        return load_config(str(EXAMPLE), environ={}).settings_for("gpu-h100-001")
    return parse_config(text, path="example.toml").settings_for("gpu-h100-001")


def test_shipped_example_fits_a_real_hgx_h100_node() -> None:
    facts = _facts(collect("ib-hgx-h100"))
    settings = _example()
    assert _ib_problems(facts, settings) == set()
    (count,) = _findings(facts, settings, "ib.count")
    assert count.data["ports"] == [f"{n}/1" for n in HGX_IB]
    # The example this replaced selected by name and drained every such node.
    old_text = EXAMPLE.read_text().replace('\ndevices = ["*"]\n', '\ndevices = ["mlx5_[0-7]"]\n', 1)
    old = _example(old_text)
    assert old.ib.devices == ["mlx5_[0-7]"]
    assert ("ib.count", "FAIL", None) in _ib_problems(facts, old)


def test_shipped_example_layout_comments_hold() -> None:
    """The example's commented alternative for HGX H100 selects the same 8 compute ports."""
    facts = _facts(collect("ib-hgx-h100"))
    text = EXAMPLE.read_text()
    assert 'devices = ["mlx5_[01]", "mlx5_[4-9]"]' in text
    settings = _example(text.replace('\ndevices = ["*"]\n', '\ndevices = ["mlx5_[01]", "mlx5_[4-9]"]\n', 1))
    assert settings.ib.devices == ["mlx5_[01]", "mlx5_[4-9]"]
    assert _ib_problems(facts, settings) == set()


# --------------------------------------------------------------------------- RoCE hw_counters


def _roce_settings(**kw: object) -> Settings:
    settings = Settings()
    settings.ib.include_ethernet = True
    settings.ib.roce_hw_counters = True
    for k, v in kw.items():
        setattr(settings.ib, k, v)
    return settings


def test_roce_hw_counters_growth_warns(tmp_path: Path) -> None:
    root = _copy(tmp_path, "ib-hgx-h100")
    source = SysfsIbSource(root, hw_counters=True)
    before = _facts(source.collect())
    _write(root, "mlx5_bond_0/ports/1/hw_counters/local_ack_timeout_err", "50")
    _write(root, "mlx5_bond_0/ports/1/hw_counters/req_cqe_error", "3")  # within +10
    _write(root, "mlx5_0/ports/1/hw_counters/local_ack_timeout_err", "50")  # IB port: not read
    now = _facts(source.collect(), previous=before)
    problems = [f for f in _findings(now, _roce_settings(), "ib.roce_counters") if f.severity is not Severity.OK]
    assert [(f.severity, f.subject) for f in problems] == [(Severity.WARN, "mlx5_bond_0/1")]
    assert problems[0].data["deltas"] == {"local_ack_timeout_err": 50}
    # Off by default, and only for RoCE ports in scope.
    assert _findings(now, Settings(), "ib.roce_counters")[0].not_applicable
    assert _findings(now, _roce_settings(include_ethernet=False), "ib.roce_counters")[0].not_applicable
    assert [f.severity for f in _findings(now, _roce_settings(devices=["mlx5_[0-9]"]),
                                          "ib.roce_counters")] == [Severity.OK]
    assert [f.severity for f in _findings(now, _roce_settings(hw_counters_delta_max={
        "local_ack_timeout_err": 100}), "ib.roce_counters")] == [Severity.OK]


def test_roce_enabled_but_counters_not_collected_is_not_applicable() -> None:
    facts = _facts(collect("ib-hgx-h100"))  # a source built without hw_counters
    (finding,) = _findings(facts, _roce_settings(), "ib.roce_counters")
    assert finding.not_applicable and finding.message == "hw_counters of the RoCE ports were not read"


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("pattern", ["mlx5_0/", "/1", "mlx5_0/1/2", "mlx5_0/a", "mlx5_[0-7", "mlx5_0/[1",
                                     "", "mlx5 0"])
def test_malformed_device_pattern_is_a_one_line_error(pattern: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'[ib]\ndevices = ["mlx5_1", {json.dumps(pattern)}]\n', path="s.toml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("s.toml:2: ib.devices[1]: invalid device pattern")
    with pytest.raises(ConfigError, match=r"^s.toml:2: ib.devices: invalid device pattern"):
        parse_config(f"[ib]\ndevices = {json.dumps(pattern)}\n", path="s.toml")


@pytest.mark.parametrize("pattern", ["*", "mlx5_0", "mlx5_0/1", "mlx5_*/1", "mlx4_0/[12]", "mlx5_bond_0",
                                     "hfi1_?/1", "mlx5_[!2-3]"])
def test_device_patterns_accepted(pattern: str) -> None:
    assert parse_config(f"[ib]\ndevices = [{json.dumps(pattern)}]\n").settings_for(None).ib.devices == [pattern]


def test_old_agent_flap_keys_still_work() -> None:
    text = "[agent]\nflap_count = 3\nflap_window_s = 60\n[[hosts]]\nnodes = \"gpu-[1-2]\"\nagent.flap_strikes = 4\n"
    cfg = parse_config(text, path="old.toml")
    s = cfg.settings_for("gpu-1")
    assert (s.ib.flap_count, s.ib.flap_window_s, s.ib.flap_strikes) == (3, 60.0, 4)
    assert cfg.settings_for("other").ib.flap_strikes == 2
    rows = {r.key: r for r in cfg.explain("gpu-1")}
    assert rows["ib.flap_count"].source == "top-level" and rows["ib.flap_count"].value == 3
    assert rows["ib.flap_strikes"].source.startswith("hosts[0]")
    assert not any(k.startswith("agent.flap") for k in rows)
    # New spelling in a later layer wins over the old one in an earlier layer.
    later = parse_config(text + "ib.flap_count = 5\n").settings_for("gpu-1")
    assert later.ib.flap_count == 5


def test_old_agent_flap_keys_errors_name_the_key_written() -> None:
    with pytest.raises(ConfigError, match=r"^x.toml:2: agent.flap_count: expected an integer"):
        parse_config('[agent]\nflap_count = "2"\n', path="x.toml")
    with pytest.raises(ConfigError, match=r"^x.toml:2: agent.flap_count: moved to \[ib\] flap_count"):
        parse_config("[agent]\nflap_count = 2\n[ib]\nflap_count = 3\n", path="x.toml")


def test_hw_counters_delta_max_key_must_be_a_file_name() -> None:
    with pytest.raises(ConfigError, match=r'ib.hw_counters_delta_max."a/b": not a hw_counters file name'):
        parse_config('[ib.hw_counters_delta_max]\n"a/b" = 3\n', path="x.toml")
    s = parse_config("[ib.hw_counters_delta_max]\nroce_adp_retrans = 5\n").settings_for(None)
    assert s.ib.hw_counters_delta_max["roce_adp_retrans"] == 5
    assert s.ib.hw_counters_delta_max["local_ack_timeout_err"] == 10  # merged key by key
