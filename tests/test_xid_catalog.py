"""The XID table against NVIDIA's catalog (issue 11).

tests/data/xid_nvidia_actions.toml is NVIDIA's "Resolution Bucket (Immediate Action)" per
code, written down by hand from NVIDIA's page. Every row of slurmgpu's table either maps
to the matching slurmgpu action or carries a written deviation; real kernel lines resolve
to the documented action; `slurmgpu check --xid N:G` gives every row's action."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmgpu.sources.kmsg import parse_records
from slurmgpu.xid import XidPolicy, catalog

NVIDIA = {int(r["code"]): r for r in tomllib.loads(
    (Path(__file__).parent / "data" / "xid_nvidia_actions.toml").read_text())["xid"]}
# The mapping the table's header states (NVIDIA bucket -> slurmgpu action).
MAPPING = {"IGNORE": "ignore", "RESTART_APP": "ignore", "RESET_GPU": "reset", "RESTART_BM": "reboot",
           "RESTART_VM": "reboot", "CONTACT_SUPPORT": "drain", "CHECK_MECHANICALS": "drain",
           "UPDATE_SWFW": "drain", "CHECK_UVM": "warn", "WORKFLOW_XID_45": "warn",
           "WORKFLOW_XID_48": "reset", "WORKFLOW_NVLINK_ERR": "reset", "WORKFLOW_NVLINK5_ERR": "warn",
           "XID_154": "warn", "XID_154_EVAL": "warn", "DRAIN_AND_RESET": "reset", "DRAIN_P2P": "drain"}
# NVIDIA variants slurmgpu does not follow, and why.
SKIPPED_VARIANTS = {
    # The IGNORE for two link-down reasons rests on an unverified decode of IntrInfo bits:
    # a Fatal link event stays a reset rather than be ignored on a guess.
    (149, "NETIR_LINK_(EVT|DOWN)\\b.*\\bFatal\\b.*\\(0x[0-9a-f][26ae][68][0-9a-f]{5}\\b"),
}


def test_every_nvidia_code_has_a_row() -> None:
    assert sorted(set(NVIDIA) - set(catalog())) == []


# Codes NVIDIA's catalog describes as "Unused" (or DLA-only) that slurmgpu keeps rows for:
# each records NVIDIA's bucket and acts by the mapping (issue 28).
UNUSED_ROWS = {14: "IGNORE", 56: "CONTACT_SUPPORT", 57: "CONTACT_SUPPORT", 58: "CONTACT_SUPPORT",
               61: "CONTACT_SUPPORT", 65: "CONTACT_SUPPORT", 81: "CONTACT_SUPPORT", 108: "IGNORE",
               122: "CONTACT_SUPPORT", 123: "CONTACT_SUPPORT", 152: "IGNORE", 153: "IGNORE"}


def test_unused_codes_record_nvidias_bucket_and_act_on_it() -> None:
    rows = catalog()
    assert {c: (rows[c].nvidia, rows[c].action) for c in UNUSED_ROWS if c in rows} == {
        c: (bucket, MAPPING[bucket]) for c, bucket in UNUSED_ROWS.items()}
    assert {c: NVIDIA[c]["immediate"] for c in UNUSED_ROWS if c in NVIDIA} == UNUSED_ROWS


@pytest.mark.parametrize("code", sorted(catalog()))
def test_row_follows_nvidia_or_says_why(code: int) -> None:
    rule = catalog()[code]
    nvidia = NVIDIA.get(code)
    if nvidia is None or not nvidia["immediate"]:
        assert rule.deviation, f"XID {code}: NVIDIA gives no action here; the row must say why it does what it does"
        return
    assert rule.nvidia == nvidia["immediate"], f"XID {code}: the row records NVIDIA's bucket as {rule.nvidia}"
    if rule.action != MAPPING[nvidia["immediate"]]:
        assert rule.deviation, f"XID {code}: {rule.action} instead of {MAPPING[nvidia['immediate']]}, no deviation"
    else:
        assert not rule.deviation, f"XID {code}: follows NVIDIA but claims a deviation"


@pytest.mark.parametrize("code", sorted(c for c, r in NVIDIA.items() if r.get("variant")))
def test_message_variants_follow_nvidia(code: int) -> None:
    ours = {v.pattern.pattern: v for v in catalog()[code].variants}
    for v in NVIDIA[code]["variant"]:
        if (code, v["pattern"]) in SKIPPED_VARIANTS:
            assert v["pattern"] not in ours
            continue
        assert ours[v["pattern"]].action == MAPPING[v["immediate"]], (code, v["pattern"])


# Kernel lines as the driver prints them (formats from NVIDIA's catalog and driver
# documentation; pids, PCI addresses and register values are made up).
LINES = [
    ("NVRM: Xid (PCI:0000:5a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", 79, "reboot"),
    ("NVRM: Xid (0000:5a:00): 12, Channel 00000001", 12, "warn"),  # the older format; 12 is not in the table
    ("NVRM: Xid (0000:5a:00): 14, Channel 00000001", 14, "ignore"),  # NVIDIA's fake error: IGNORE
    ("NVRM: Xid (PCI:0000:5a:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     "TIMEOUT, Info 0x1c031", 109, "reset"),
    ("NVRM: Xid (PCI:0000:5a:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", 149, "reset"),
    ("NVRM: Xid (PCI:0000:5a:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 "
     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", 149, "ignore"),
    ("NVRM: Xid (PCI:0000:5a:00): 144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000008 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", 144, "ignore"),
    ("NVRM: Xid (PCI:0000:5a:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link -1 (0x00000000 0x00000001 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", 150, "reset"),
    ("NVRM: Xid (PCI:0000:5a:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     154, "reset"),
    ("NVRM: Xid (PCI:0000:5a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     154, "reboot"),
    ("NVRM: Xid (PCI:0000:5a:00): 45, pid=23, name=python3, Ch 00000001 caused by previous Xid 149", 45, "ignore"),
    ("NVRM: Xid (PCI:0000:5a:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the "
     "framebuffer at partition 4, subpartition 1.", 48, "reset"),
    ("NVRM: Xid (PCI:0000:5a:00): 94, pid=77, name=train.py, Ch 00000010, Contained: CE User Channel (0x1)",
     94, "warn"),
]


@pytest.mark.parametrize("line,code,action", LINES, ids=[f"{c}-{a}" for _, c, a in LINES])
def test_real_kernel_lines_resolve_to_the_documented_action(line: str, code: int, action: str) -> None:
    (event,) = parse_records([f"4,1,1000,-;{line}"], {(0, 0x5A, 0): 2})
    assert (event.xid, event.gpu) == (code, 2)
    assert XidPolicy().rule(event.xid, event.message).action == action


def test_no_message_means_the_rows_own_action() -> None:
    policy = XidPolicy()
    assert policy.rule(149).action == "warn"  # NVLink5 without its text: neither reset nor ignore
    assert policy.rule(154, "recovery action changed to 0x7 (Something New)").action == "warn"


def test_check_xid_gives_every_rows_action(tmp_path: Path) -> None:
    config = tmp_path / "empty.toml"
    config.write_text("")
    codes = sorted(catalog())
    args = [a for c in codes for a in ("--xid", f"{c}:0")]
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config),
                           "--node", "n1", *args], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "SLURMGPU_NVML_LIBRARY": "/nonexistent.so.1"})
    report = json.loads(proc.stdout)
    got = {f["data"]["xid"]: f["data"]["action"] for f in report["findings"] if f["check"] == "xid.recent"}
    assert got == {c: catalog()[c].action for c in codes}


def test_checks_xids_lists_the_table_in_effect(tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text('[xid.overrides]\n"38" = "reset"\n')
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "checks", "xids", "--json", "--config", str(config),
                           "--node", "n1"], capture_output=True, text=True, timeout=60, check=True)
    rows = {r["xid"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == set(catalog())
    assert (rows[38]["action"], rows[38]["origin"], rows[38]["nvidia"]) == ("reset", "site override", "IGNORE")
    assert rows[94]["action"] == "warn" and "mem.row_remap" in rows[94]["deviation"]
    assert {v["action"] for v in rows[154]["variants"]} >= {"reset", "reboot"}
    table = subprocess.run([sys.executable, "-m", "slurmgpu", "checks", "xids", "--config", str(config),
                            "--node", "n1"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "  79  reboot      RESTART_BM" in table
