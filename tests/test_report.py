"""`slurmgpu report`: the model's numbers on a hand-built database, and the CLI."""

from __future__ import annotations

import json
import re
import sqlite3
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner, Result

from slurmgpu.cli import cli
from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.store.automation import Lemon
from slurmgpu.collector.store.backend import Connection, is_postgres
from slurmgpu.collector.store.schema import expected_tables
from slurmgpu.config.load import load_config
from slurmgpu.report import SCHEMA, SECTIONS, TITLES
from slurmgpu.report import html as report_html
from slurmgpu.report import markdown as report_md
from slurmgpu.report.model import (
    ReportError,
    iso,
    parse_duration,
    report_from_path,
    resolve_window,
)
from slurmgpu.xid import catalog

H = 3600.0
T1 = 1767312000.0  # 2026-01-02T00:00:00Z
T0 = T1 - 24 * H
NOW = "2026-01-02T00:00:00Z"

CONFIG = """
[paths]
state_dir = "{state}"

[pins]
driver = ["550.90.07"]

[[hosts]]
name = "h100"
nodes = "n[1-2]"
[hosts.pins]
nccl = [">=2.21"]

[[hosts]]
name = "a100"
nodes = "n3"
[hosts.pins]
driver = ["535.*"]
"""


def _ins(db: Connection, table: str, **cols: Any) -> None:
    names = ", ".join(cols)
    marks = ", ".join("?" * len(cols))
    db.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(cols.values()))


def _state(db: Connection, node: str, ts: float, kind: str, reason: str | None = None,
           actor: str | None = None, by: str | None = None) -> None:
    """A node_states row; ``by``: drained_by as the collector records it (None: a row from
    before schema 6, whose actor the report guesses)."""
    _ins(db, "node_states", node=node, ts=ts, kind=kind, reason=reason, actor=actor,
         **({} if by is None else {"drained_by": by}))


def _verdict(db: Connection, node: str, ts: float, verdict: str) -> None:
    _ins(db, "report_history", node=node, seq=int(ts), ts=ts, verdict=verdict)


def _finding(db: Connection, node: str, ts: float, check: str, severity: str,
             subject: str | None = None) -> None:
    _ins(db, "findings", node=node, seq=int(ts), ts=ts, check_id=check, severity=severity,
         gpu=None, subject=subject, message="m")


def _event(db: Connection, node: str, ts: float, kind: str, data: int | None = None,
           gpu: int | None = None, body: dict[str, Any] | None = None) -> None:
    _ins(db, "events", node=node, seq=int(ts), ts=ts, kind=kind, gpu=gpu, data=data,
         verdict="FAIL", body=msgpack.packb(body or {"kind": kind}))


def _gpu(db: Connection, node: str, gpu: int, ts: float, **values: Any) -> None:
    row = {"ecc_corrected": 0, "ecc_uncorrected": 0, "remap_corrected": 0,
           "remap_uncorrected": 0, "remap_pending": 0, "remap_failure": 0, **values}
    _ins(db, "gpu_counters", node=node, gpu=gpu, ts=ts, serial=f"S{node}{gpu}", model="H100", **row)


@pytest.fixture()
def fleet(tmp_path: Path, store_url: str) -> dict[str, Any]:
    """Four nodes with exactly known histories over the window (T0, T1] = 24 h:

    n1 (h100): drained 3 h by the automation, unreachable 1 h, FAIL (degraded) 2 h -> 18 h healthy
    n2 (h100): drained by alice (outside slurmgpu) since before the window until T0+1h,
               unreachable T0+0.5h..T0+1.5h (0.5 h counts, drained wins), FAIL from before
               the window to T0+3h (1.5 h degraded counts) -> 21 h healthy
    n3 (a100): first seen T0+12h, drained by the healthcheck from T0+20h (still) -> 8 h healthy
    n4 (other): two hook drains of 1 h each (the epilog's, with an automation decision 30 s
                later; one recorded before schema 6: guessed) -> 22 h healthy
    """
    path = Path(store_url) if not is_postgres(store_url) else store_url
    writer = Store(path)
    db = writer.db
    db.execute("BEGIN")
    for node, first in (("n1", T0 - 10 * 86400), ("n2", T0 - 10 * 86400), ("n3", T0 + 12 * H),
                        ("n4", T0 - 86400)):
        _ins(db, "nodes", node=node, first_seen=first, last_seen=T1)
    # n1
    _state(db, "n1", T0 + 2 * H, "drained", "slurmgpu: xid.recent GPU 1 XID 79", "root",
           "automation")
    _ins(db, "decisions", time=T0 + 2 * H + 30, node="n1", action="drain", reason="x",
         trigger="xid.recent", result="drained")
    _state(db, "n1", T0 + 5 * H, "resumed")
    _state(db, "n1", T0 + 10 * H, "unreachable", actor="collector")
    _state(db, "n1", T0 + 11 * H, "reachable", actor="collector")
    _verdict(db, "n1", T0 - 86400, "OK")
    _verdict(db, "n1", T0 + 14 * H, "FAIL")
    _verdict(db, "n1", T0 + 16 * H, "OK")
    # n2
    _state(db, "n2", T0 - 5 * H, "drained", "maint <b>evil</b>", "alice", "outside")
    _state(db, "n2", T0 + 1 * H, "resumed")
    _state(db, "n2", T0 + 0.5 * H, "unreachable", actor="collector")
    _state(db, "n2", T0 + 1.5 * H, "reachable", actor="collector")
    _verdict(db, "n2", T0 - 2 * H, "FAIL")
    _verdict(db, "n2", T0 + 3 * H, "OK")
    # n3
    _state(db, "n3", T0 + 20 * H, "drained",
           "slurmgpu: gpu.lost GPU 0 fell off the bus [by healthcheck]", "root", "healthcheck")
    # n4: the epilog's drain, recorded so; an automation decision 30 s later (the old guess
    # by time called that drain the automation's)
    _state(db, "n4", T0 + 1 * H, "drained", "slurmgpu: thermal.throttle GPU 2 [by epilog]", "root",
           "epilog")
    _ins(db, "decisions", time=T0 + 1 * H + 30, node="n4", action="drain", reason="x",
         trigger="thermal.throttle", result="drained")
    _state(db, "n4", T0 + 2 * H, "resumed")
    _state(db, "n4", T0 + 3 * H, "drained", "slurmgpu: thermal.throttle GPU 2", "root")
    _state(db, "n4", T0 + 4 * H, "resumed")
    # findings (one before the window, one OK: neither counts)
    _finding(db, "n1", T0 + 2 * H, "xid.recent", "FAIL")
    _finding(db, "n1", T0 + 14 * H, "xid.recent", "FAIL")
    _finding(db, "n1", T0 + 14 * H, "ecc.sbe", "WARN")
    _finding(db, "n2", T0 + 6 * H, "thermal.throttle", "WARN")
    _finding(db, "n4", T0 + 2 * H, "ib.flap", "WARN", subject="mlx5_1/1")
    _finding(db, "n1", T0 - H, "xid.recent", "FAIL")
    _finding(db, "n1", T0 + H, "gpu.count", "OK")
    # XIDs (one before the window)
    _event(db, "n1", T0 + 2 * H, "xid", 79, 1)
    _event(db, "n1", T0 + 2 * H + 1, "xid", 79, 1)
    _event(db, "n3", T0 + 19 * H, "xid", 79, 0)
    _event(db, "n1", T0 + 7 * H, "xid", 13, 2)
    _event(db, "n1", T0 - H, "xid", 79, 1)
    # ECC / remaps
    _gpu(db, "n1", 0, T0 - 86400, ecc_corrected=10)
    _gpu(db, "n1", 0, T0 + H, ecc_corrected=15)
    _gpu(db, "n1", 0, T0 + 5 * H, ecc_corrected=40)
    _gpu(db, "n1", 1, T0 - 86400, ecc_corrected=5)
    _gpu(db, "n2", 3, T0 - 2 * 86400, remap_corrected=1)
    _gpu(db, "n2", 3, T0 + 6 * H, remap_corrected=2, remap_pending=1)
    _gpu(db, "n3", 0, T0 + 13 * H, ecc_corrected=100)
    _gpu(db, "n3", 0, T0 + 20 * H, ecc_corrected=103)
    _gpu(db, "n3", 0, T1 + H, ecc_corrected=500)  # after the window
    # throttling: 24 hourly samples each; one at T0 exactly (not in the window)
    for h in range(1, 25):
        _ins(db, "node_samples", node="n1", ts=T0 + h * H, span_s=H, reports=240,
             fail_reports=0, hw_slowdown_reports=24, sw_thermal_reports=0)
        _ins(db, "node_samples", node="n2", ts=T0 + h * H, span_s=H, reports=240,
             fail_reports=0, hw_slowdown_reports=0, sw_thermal_reports=48)
    _ins(db, "node_samples", node="n1", ts=T0, span_s=H, reports=240, fail_reports=0,
         hw_slowdown_reports=240, sw_thermal_reports=0)
    # IB
    _ins(db, "ib_counters", node="n1", port="mlx5_0/1", ts=T0 - 86400, state="ACTIVE",
         rate_gbps=400, symbol_error=0, link_downed=1, link_error_recovery=0, port_rcv_errors=0,
         local_link_integrity_errors=0, excessive_buffer_overrun_errors=0)
    _ins(db, "ib_counters", node="n1", port="mlx5_0/1", ts=T0 + 3 * H, state="ACTIVE",
         rate_gbps=400, symbol_error=7, link_downed=3, link_error_recovery=0, port_rcv_errors=0,
         local_link_integrity_errors=0, excessive_buffer_overrun_errors=0)
    # versions (n2's upgrade after the window does not count; n4 never reported)
    for node, model, driver, nccl in (("n1", "H100", "550.90.07", "2.21.5"),
                                      ("n2", "H100", "550.54.15", "2.18.1"),
                                      ("n3", "A100", "535.183.01", None)):
        _ins(db, "node_versions", node=node, ts=T0 - 5 * 86400, gpu_model=model, driver=driver,
             cuda="12.4", nccl=nccl, vbios="96.00.89.00.01", ib_firmware="28.39.1002")
    _ins(db, "node_versions", node="n2", ts=T1 + H, gpu_model="H100", driver="550.90.07",
         cuda="12.4", nccl="2.21.5", vbios="96.00.89.00.01", ib_firmware="28.39.1002")
    # jobs
    _event(db, "n1", T0 + 8 * H, "prolog_blocked", body={"kind": "prolog_blocked", "job_id": "123"})
    for job, requested, acked, state in (("10", T0 + H, T0 + H + 10, "acked"),
                                         ("11", T0 + 2 * H, T0 + 2 * H + 30, "acked"),
                                         ("12", T0 + 3 * H, None, "expired"),
                                         ("13", T1 - 60, None, "open"),
                                         ("9", T0 - H, T0 - H + 5, "acked")):
        _ins(db, "checkpoints", job_id=job, action="checkpoint", trigger_node="n1", nodes='["n1"]',
             requested=requested, deadline=requested + 300, state=state, acked_at=acked)
    _ins(db, "job_events", job_id="7", ts=T0 + 5 * H, kind="requeued", node="n1")
    _ins(db, "job_events", job_id="7", ts=T0 + 6 * H, kind="requeued", node="n1")
    _ins(db, "job_events", job_id="8", ts=T0 + 6 * H, kind="acked", node="n1")
    db.execute("COMMIT")
    writer.close()
    state = tmp_path / "state"
    state.mkdir()
    store = Store(path)  # the automation's state: one lemon
    record = store.automation()
    record.state.lemons = {"n4": Lemon(T0, "3 drains within 604800 s")}
    record.save()
    store.close()
    config = tmp_path / "slurmgpu.toml"
    config.write_text(CONFIG.format(state=state))
    return {"db": path, "config": config, "dir": tmp_path}


@pytest.fixture()
def model(fleet: dict[str, Any]) -> dict[str, Any]:
    return report_from_path(fleet["db"], T0, T1, config=load_config(str(fleet["config"])),
                            generated_at=T1)


def _hours(row: dict[str, Any]) -> tuple[float, float, float, float]:
    return row["healthy_h"], row["degraded_h"], row["drained_h"], row["unreachable_h"]


# --------------------------------------------------------------------------- model


def test_top_level_keys(model: dict[str, Any]) -> None:
    assert model["schema"] == SCHEMA
    assert model["window"] == {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z",
                               "seconds": 86400.0, "from_ts": T0, "to_ts": T1}
    assert model["generated_at"] == NOW
    for section in SECTIONS:
        assert section in model


def test_availability_node_hours(model: dict[str, Any]) -> None:
    a = model["availability"]
    sets = {s["name"]: s for s in a["host_sets"]}
    assert list(sets) == ["h100", "a100", "other"]
    # healthy, degraded, drained, unreachable
    assert _hours(sets["h100"]) == (18 + 21, 2 + 1.5, 3 + 1, 1 + 0.5)
    assert _hours(sets["a100"]) == (8, 0, 4, 0)  # counted from first_seen only
    assert _hours(sets["other"]) == (22, 0, 2, 0)
    assert sets["h100"]["nodes"] == 2 and sets["a100"]["node_hours"] == 12
    assert _hours(a["fleet"]) == (69, 3.5, 10, 1.5)
    assert a["fleet"]["node_hours"] == 84
    assert a["fleet"]["availability_pct"] == round(100 * 69 / 84, 2)
    worst = {w["node"]: w for w in a["worst_nodes"]}
    assert _hours(worst["n1"]) == (18, 2, 3, 1)
    assert _hours(worst["n2"]) == (21, 1.5, 1, 0.5)
    # hourly series (24 h window): sums to the totals, drained n1 shows in hour 2..5
    assert a["bucket_s"] == 3600 and len(a["series"]) == 24
    for c in ("healthy", "degraded", "drained", "unreachable"):
        assert sum(b[f"{c}_h"] for b in a["series"]) == pytest.approx(a["fleet"][f"{c}_h"])
    assert a["series"][0]["drained_h"] == 1  # n2 until T0+1h
    assert a["series"][2]["drained_h"] == 1  # n1


def test_summary(model: dict[str, Any]) -> None:
    s = model["summary"]
    assert s["nodes"] == 4
    assert s["availability_pct"] == round(100 * 69 / 84, 2)
    assert s["drains"] == 4  # n1, n3, n4 x2 (n2's began before the window)
    assert s["drained_at_end"] == 1
    assert s["new_failures"] == 5 and s["failing_nodes"] == 3
    assert s["xids"] == 4 and s["xid_nodes"] == 2
    # requeued: job 7 by the collector after its checkpoint, job 123 by Slurm after the
    # prolog refused it
    assert s["jobs_checkpointed"] == 4 and s["jobs_requeued"] == 2
    assert s["jobs_prolog_blocked"] == 1
    assert s["lemons"] == 1
    assert s["nodes_off_pin"] == 1


def test_drain_attribution(model: dict[str, Any]) -> None:
    d = model["drains"]
    rows = [(r["node"], r["by"], r["drained_by"], r["resumed"], r["still_drained"])
            for r in d["drains"]]
    assert rows == [
        ("n2", "outside", "alice (outside slurmgpu)", True, False),
        ("n4", "hook", "slurmgpu epilog", True, False),  # not the automation's: recorded
        ("n1", "automation", "slurmgpu automation", True, False),
        ("n4", "hook", "slurmgpu (node hook) (guessed)", True, False),
        ("n3", "hook", "slurmgpu healthcheck", False, True),
    ]
    assert [(r["hook"], r["attribution"]) for r in d["drains"]] == [
        (None, "recorded"), ("epilog", "recorded"), (None, "recorded"), (None, "guessed"),
        ("healthcheck", "recorded")]
    first = d["drains"][0]
    assert first["started_in_window"] is False and first["start"] == T0 - 5 * H
    assert first["duration_s"] == 6 * H and first["reason"] == "maint <b>evil</b>"
    n1 = d["drains"][2]
    assert (n1["start"], n1["end"], n1["duration_s"]) == (T0 + 2 * H, T0 + 5 * H, 3 * H)
    n3 = d["drains"][4]
    assert n3["end"] is None and n3["duration_s"] == 4 * H
    assert d["count"] == 4 and d["by"] == {"automation": 1, "hook": 3}


def test_failures(model: dict[str, Any]) -> None:
    f = model["failures"]
    assert f["total"] == 5 and f["fail"] == 2 and f["warn"] == 3 and f["nodes"] == 3
    by = {(r["check_id"], r["severity"]): (r["count"], r["nodes"]) for r in f["by_check"]}
    assert by == {("xid.recent", "FAIL"): (2, 1), ("ecc.sbe", "WARN"): (1, 1),
                  ("thermal.throttle", "WARN"): (1, 1), ("ib.flap", "WARN"): (1, 1)}
    assert f["by_check"][0]["check_id"] == "xid.recent"
    top = f["top_nodes"][0]
    assert top["node"] == "n1" and top["count"] == 3 and top["fail"] == 2
    assert top["checks"][0] == {"check_id": "xid.recent", "count": 2}


def test_xids_with_meaning(model: dict[str, Any]) -> None:
    x = model["xids"]
    codes = {c["xid"]: c for c in x["codes"]}
    assert list(codes) == [79, 13]
    assert (codes[79]["count"], codes[79]["nodes"], codes[79]["gpus"]) == (3, 2, 2)
    assert codes[79]["meaning"] == catalog()[79].name == "GPU has fallen off the bus"
    assert codes[13]["meaning"] == catalog()[13].name
    assert codes[79]["top_nodes"][0] == {"node": "n1", "count": 2}


def test_ecc_rise(model: dict[str, Any]) -> None:
    e = model["ecc-trends"]
    assert e["gpus_rising"] == 3
    got = [(g["node"], g["gpu"], g["rise"]) for g in e["gpus"]]
    zero = {"ecc_corrected": 0, "ecc_uncorrected": 0, "remap_corrected": 0, "remap_uncorrected": 0}
    assert got == [
        ("n2", 3, {**zero, "remap_corrected": 1}),  # remaps rank above corrected ECC
        ("n1", 0, {**zero, "ecc_corrected": 30}),   # 40 at the end - 10 at the start
        ("n3", 0, {**zero, "ecc_corrected": 3}),    # first seen in the window: from 100
    ]
    n1 = e["gpus"][1]
    assert n1["series_counter"] == "ecc_corrected"
    assert n1["series"] == [[T0, 10], [T0 + H, 15], [T0 + 5 * H, 40], [T1, 40]]
    assert e["remap_flags"] == [{"node": "n2", "gpu": 3, "serial": "Sn23", "model": "H100",
                                 "remap_pending": True, "remap_failure": False,
                                 "since": T0 + 6 * H}]


def test_ecc_rises_before_a_reset_in_the_window_count(fleet: dict[str, Any]) -> None:
    """Issue 29 item 9: a GPU reset sets the volatile counters back to 0; the rise before
    it was lost (5 -> 9, reset, 2: counted 2) or the GPU not listed at all (0 -> 3 -> 0)."""
    def row(gpu: int, ts: float, corrected: int) -> tuple[str, dict[str, Any]]:
        return ("gpu_counters", {"node": "n4", "gpu": gpu, "ts": ts, "serial": f"Sn4{gpu}", "model": "H100",
                                 "ecc_corrected": corrected, "ecc_uncorrected": 0, "remap_corrected": 0,
                                 "remap_uncorrected": 0, "remap_pending": 0, "remap_failure": 0})
    _add_rows(fleet, row(0, T0 - H, 5), row(0, T0 + H, 9), row(0, T0 + 2 * H, 0), row(0, T0 + 3 * H, 2),
              row(1, T0 - H, 0), row(1, T0 + H, 3), row(1, T0 + 2 * H, 0))
    e = report_from_path(fleet["db"], T0, T1, config=None, generated_at=T1)["ecc-trends"]
    rises = {(g["node"], g["gpu"]): g["rise"]["ecc_corrected"] for g in e["gpus"]}
    assert (rises[("n4", 0)], rises[("n4", 1)], rises[("n1", 0)]) == (4 + 2, 3, 30)
    assert e["gpus_rising"] == 5


def test_throttle_share(model: dict[str, Any]) -> None:
    t = model["throttling"]
    assert t["reports"] == 48 * 240
    assert t["hw_slowdown_pct"] == 5.0 and t["sw_thermal_pct"] == 10.0
    assert [(r["node"], r["hw_slowdown_pct"]) for r in t["leaders_hw"]] == [("n1", 10.0)]
    assert [(r["node"], r["sw_thermal_pct"]) for r in t["leaders_sw"]] == [("n2", 20.0)]
    assert t["nodes_throttled"] == 2


def test_ib(model: dict[str, Any]) -> None:
    ports = {(p["node"], p["port"]): p for p in model["ib"]["ports"]}
    assert ports[("n1", "mlx5_0/1")]["rise"] == {"symbol_error": 7, "link_downed": 2}
    assert ports[("n4", "mlx5_1/1")]["flap_findings"] == 1
    assert model["ib"]["ports_rising"] == 1 and model["ib"]["ports_flapping"] == 1


def test_pin_drift_per_host_set(model: dict[str, Any]) -> None:
    p = model["pin-drift"]
    driver = p["fields"]["driver"]
    assert driver["versions"] == [
        {"version": "535.183.01", "nodes": 1, "off_pin": 0},  # the a100 set pins 535.*
        {"version": "550.54.15", "nodes": 1, "off_pin": 1},   # value at the window's end
        {"version": "550.90.07", "nodes": 1, "off_pin": 0},
    ]
    assert [o["node"] for o in driver["off_pin"]] == ["n2"]
    assert driver["not_reported"] == 1  # n4
    nccl = p["fields"]["nccl"]
    assert [(o["node"], o["pins"]) for o in nccl["off_pin"]] == [("n2", [">=2.21"])]
    assert nccl["not_reported"] == 2  # n3 (no NCCL) and n4: not off-pin
    assert p["fields"]["cuda"]["off_pin"] == []  # no [pins] cuda_driver: not pinned
    assert p["nodes_off_pin"] == 1


def test_service(model: dict[str, Any]) -> None:
    s = model["service"]
    assert s["lemons"] == [{"node": "n4", "since": T0, "why": "3 drains within 7 days"}]  # as stored: 604800 s
    assert (s["lemons_source"], s["lemons_error"]) == ("automation_lemons", None)
    due = {d["node"]: d for d in s["due"]}
    assert set(due) == {"n2", "n3", "n4"}
    assert due["n2"]["reasons"] == ["GPU 3 remap_pending", "off its version pins (see Version pin drift)"]
    assert due["n3"]["reasons"][0].startswith("drained: slurmgpu: gpu.lost")
    assert due["n4"]["reasons"] == ["2 drains in window"] and due["n4"]["lemon"] is True


def test_jobs(model: dict[str, Any]) -> None:
    j = model["jobs"]
    assert j["prolog_blocked"]["events"] == 1
    assert j["prolog_blocked"]["recent"][0]["job_id"] == "123"
    assert j["checkpoints"]["requests"] == 4 and j["checkpoints"]["jobs"] == 4
    assert j["requeued"] == {"events": 2, "jobs": 2, "checkpoint_jobs": 1, "prolog_jobs": 1}
    assert j["ack"] == {"count": 2, "p50_s": 20.0, "max_s": 30.0, "no_ack": 1, "open": 1}


def test_mtbf(model: dict[str, Any]) -> None:
    rows = {r["gpu_model"]: r for r in model["mtbf"]["models"]}
    assert rows["H100"] == {"gpu_model": "H100", "nodes": 2, "node_hours": 48.0, "drains": 1,
                            "fail_transitions": 1, "mtbf_drain_h": 48.0, "mtbf_fail_h": 48.0}
    assert rows["A100"]["node_hours"] == 12 and rows["A100"]["mtbf_drain_h"] == 12
    assert rows["A100"]["mtbf_fail_h"] is None  # no failure: infinite
    assert rows["unknown"]["drains"] == 2 and rows["unknown"]["mtbf_drain_h"] == 12


def _add_rows(fleet: dict[str, Any], *rows: tuple[str, dict[str, Any]]) -> None:
    path = Path(fleet["db"]) if not is_postgres(str(fleet["db"])) else fleet["db"]
    store = Store(path)
    store.db.execute("BEGIN")
    for table, cols in rows:
        _ins(store.db, table, **cols)
    store.db.execute("COMMIT")
    store.close()


def test_pin_drift_from_the_nodes_own_checks_without_head_pins(fleet: dict[str, Any]) -> None:
    """Issue 29 item 3: a head config with no [pins] printed a green "0 off-pin" while n3
    was drained for pin.driver; n3 was not due for service either."""
    fixed = T0 + 20 * H
    _add_rows(fleet, ("report_history", {"node": "n3", "seq": 1, "ts": fixed - H, "verdict": "FAIL"}),
              ("findings", {"node": "n3", "seq": 1, "ts": fixed - H, "check_id": "pin.driver",
                            "severity": "FAIL", "gpu": None, "subject": None,
                            "message": "driver 535.104.05 off-pin (pins: 550.90.07)"}),
              ("report_history", {"node": "n1", "seq": 1, "ts": fixed - H, "verdict": "FAIL"}),
              ("findings", {"node": "n1", "seq": 1, "ts": fixed - H, "check_id": "pin.vbios",
                            "severity": "FAIL", "gpu": 0, "subject": None, "message": "old vbios"}),
              ("report_history", {"node": "n1", "seq": 2, "ts": fixed, "verdict": "OK"}))  # n1 fixed since
    m = report_from_path(fleet["db"], T0, T1, config=None, generated_at=T1)
    p = m["pin-drift"]
    assert (p["nodes_off_pin"], p["off_pin_nodes"], p["config_pins"]) == (1, ["n3"], False)
    assert [(f["node"], f["check"]) for f in p["by_nodes"]] == [("n3", "pin.driver")]
    assert p["judged"].startswith("by the nodes' own pin.* checks (each node's [pins]) only")
    assert m["summary"]["nodes_off_pin"] == 1
    due = {d["node"]: d["reasons"] for d in m["service"]["due"]}
    assert "off its version pins (see Version pin drift)" in due["n3"]
    md = report_md.render(m)
    assert "**nodes off their version pins**: 1\n" in md and "| n3 | pin.driver | FAIL |" in md


def test_pins_nobody_judged_say_so(tmp_path: Path) -> None:
    Store(tmp_path / "fleet.db").close()
    m = report_from_path(tmp_path / "fleet.db", T0, T1, config=None, generated_at=T1)
    assert m["pin-drift"]["nodes_off_pin"] is None and m["pin-drift"]["judged"].startswith("not judged: ")
    assert "**nodes off their version pins**: not judged\n" in report_md.render(m)
    assert '<div class="card warn"><b>not judged</b><span>nodes off their version pins' in report_html.render(m)


def test_window_without_config(fleet: dict[str, Any]) -> None:
    """No config: one host set ("all nodes": it used to be called "other"), nothing pinned;
    the lemons are the database's (the automation's state lives there, not in a file the
    config names)."""
    m = report_from_path(fleet["db"], T0, T1, config=None, generated_at=T1)
    assert [s["name"] for s in m["availability"]["host_sets"]] == ["all nodes"]
    assert m["availability"]["host_sets"][0]["healthy_h"] == 69
    assert m["pin-drift"]["nodes_off_pin"] == 0 and [x["node"] for x in m["service"]["lemons"]] == ["n4"]


def test_earlier_window(fleet: dict[str, Any]) -> None:
    """A window before n3 existed and inside n2's drain: state at start = last transition."""
    m = report_from_path(fleet["db"], T0 - 4 * H, T0, config=None, generated_at=T1)
    worst = {w["node"]: w for w in m["availability"]["worst_nodes"]}
    assert worst["n2"]["drained_h"] == 4
    assert m["summary"]["nodes"] == 3
    # resumed only after this window's end: as of the window's end it is still drained
    assert m["drains"]["drains"][0]["still_drained"] is True
    assert m["drains"]["drains"][0]["duration_s"] == 5 * H


def test_window_parsing() -> None:
    assert parse_duration("90m") == 5400 and parse_duration("7d") == 7 * 86400
    assert resolve_window(None, None, None, T1) == (T0, T1)
    assert resolve_window("2h", None, NOW, 0) == (T1 - 2 * H, T1)
    assert resolve_window(None, "2026-01-01", "2026-01-01T06:00+00:00", 0) == (T0, T0 + 6 * H)
    assert iso(T0 + 0.5) == "2026-01-01T00:00:00.500Z"
    for bad in (("5x", None, None), ("0h", None, None), ("1h", "2026-01-01", None),
                (None, "2026-01-03", None), (None, "yesterday", None)):
        with pytest.raises(ReportError):
            resolve_window(*bad, T1)


# --------------------------------------------------------------------------- renderers


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.h2 = 0
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "section":
            self.ids.append(dict(attrs)["id"] or "")
        if tag == "h2":
            self.h2 += 1


def test_html_is_self_contained_and_escaped(model: dict[str, Any]) -> None:
    page = report_html.render(model)
    parser = _Sections()
    parser.feed(page)
    assert parser.ids == list(SECTIONS)
    assert parser.h2 == len(SECTIONS)
    assert "script" not in parser.tags and "<script" not in page.lower()
    assert "http://" not in page and "https://" not in page  # no network
    assert "maint &lt;b&gt;evil&lt;/b&gt;" in page and "<b>evil" not in page
    assert "<svg" in page and "<polyline" in page  # charts, the ECC sparkline
    assert "@media print" in page and 'name="viewport"' in page
    assert "GPU has fallen off the bus" in page
    assert 'class="off"' in page  # the off-pin row


def test_markdown(model: dict[str, Any]) -> None:
    text = report_md.render(model)
    for section in SECTIONS:
        assert f"\n## {TITLES[section]}\n" in text
    assert "OFF-PIN n2" in text
    assert "slurmgpu automation" in text and "alice (outside slurmgpu)" in text
    assert "slurmgpu epilog" in text
    # The Markdown is the mail body: a node's text never becomes HTML or a link there.
    assert "maint \\<b>evil\\</b>" in text and "&lt;" not in text and "&gt;" not in text
    assert "n/a (no failures)" in text and "∞" not in text
    assert "3 drains within 7 days" in text


def test_markdown_escapes_pipes() -> None:
    assert report_md.cell("a|b\nc") == "a\\|b c"


def test_markdown_never_passes_html_or_links_through() -> None:
    hostile = report_md.cell('<script>alert(1)</script> [click](javascript:alert(1)) `x`')
    assert "<" not in hostile.replace("\\<", "")  # every "<" escaped: no tag survives
    plain = "GPU has fallen off the bus -> reboot & more (3 reports)"
    assert report_md.cell(plain) == plain  # plain text in a plain mail
    assert "\\[click\\](" in hostile and "[click](" not in hostile  # no link syntax survives unescaped
    assert "\\`x\\`" in hostile


# --------------------------------------------------------------------------- CLI


def _run(fleet: dict[str, Any], *args: str) -> Result:
    return CliRunner().invoke(cli, ["report", "--db", str(fleet["db"]), "--config",
                                    str(fleet["config"]), "--now", NOW, *args])


def test_cli_json(fleet: dict[str, Any]) -> None:
    result = _run(fleet, "--format", "json", "--since", "24h")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert list(data) == ["schema", "generated_at", "window", "source", *SECTIONS]
    assert data["schema"] == "slurmgpu.report/1"
    assert data["window"]["seconds"] == 86400
    assert data["availability"]["fleet"]["drained_h"] == 10
    assert data["source"]["schema_version"] >= 4


def test_cli_html_default_and_out(fleet: dict[str, Any]) -> None:
    result = _run(fleet)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("<!DOCTYPE html>")
    for section in SECTIONS:
        assert f'<section id="{section}">' in result.output
    out = fleet["dir"] / "r.md"
    result = _run(fleet, "--format", "md", "--out", str(out), "--from", "2026-01-01T00:00Z",
                  "--to", NOW)
    assert result.exit_code == 0 and result.output == ""
    text = out.read_text()
    assert text.startswith("# Fleet health report") and "\n## Availability\n" in text
    assert not [p for p in fleet["dir"].iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args", [
    ("--since", "5x"),
    ("--since", "-1h"),
    ("--format", "pdf"),
    ("--from", "2026-01-03", "--to", NOW),
    ("--from", "2026-01-01", "--since", "2h"),
    ("--now", "noon"),
])
def test_cli_bad_arguments_exit_3_nothing_written(fleet: dict[str, Any],
                                                   args: tuple[str, ...]) -> None:
    out = fleet["dir"] / "bad.html"
    result = _run(fleet, "--out", str(out), *args)
    assert result.exit_code == 3, result.output
    assert "slurmgpu: error:" in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_missing_or_old_db(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["report", "--db", str(tmp_path / "none.db"),
                                      "--out", str(out)])
    assert result.exit_code == 3 and "no fleet database" in result.output
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (3)")
    db.commit()
    db.close()
    result = CliRunner().invoke(cli, ["report", "--db", str(old), "--out", str(out)])
    assert result.exit_code == 3 and "schema version 3 is older" in result.output
    assert not out.exists()


def _content(db: str | Path) -> Any:
    """A SQLite file's bytes; every row of every table of a PostgreSQL database."""
    if not is_postgres(db):
        return Path(db).read_bytes()
    with queries.snapshot(db) as conn:
        return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}").fetchall()))
                for t in sorted(expected_tables())}


def test_db_not_modified(fleet: dict[str, Any]) -> None:
    """The report opens the database read-only: not a byte (not a row) changes."""
    before = _content(fleet["db"])
    result = _run(fleet, "--format", "json")
    assert result.exit_code == 0, result.output
    assert _content(fleet["db"]) == before


# --------------------------------------------------------------------------- short windows


def _short_fleet(tmp_path: Path) -> Path:
    """A 1-hour window (T1 - 1h, T1]: n1 (A100) FAIL for 14 min, n2 (H100) drained by the
    epilog for 10 min: 2 node-hours, 96 min healthy, 80 % available."""
    path = tmp_path / "short.db"
    Store(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    m = 60.0
    for node, model in (("n1", "A100"), ("n2", "H100")):
        _ins(db, "nodes", node=node, first_seen=T0, last_seen=T1)
        _ins(db, "node_versions", node=node, ts=T0, gpu_model=model)
    _verdict(db, "n1", T0, "OK")
    _verdict(db, "n1", T1 - 46 * m, "FAIL")
    _verdict(db, "n1", T1 - 32 * m, "OK")
    _state(db, "n2", T1 - 30 * m, "drained", "slurmgpu: ecc.uncorrected GPU 1 [by epilog]", "root")
    _state(db, "n2", T1 - 20 * m, "resumed")
    db.close()
    return path


def _axis_labels(page: str) -> list[str]:
    """The value-axis texts of the availability chart (unit, top, 0)."""
    chart = page.split('<section id="availability">')[1].split("</svg>")[0]
    return re.findall(r'<text x="\d+" y="\d+" text-anchor="end">([^<]*)</text>', chart)


def test_short_window_numbers(tmp_path: Path) -> None:
    m = report_from_path(_short_fleet(tmp_path), T1 - H, T1, config=None, generated_at=T1)
    a = m["availability"]
    assert a["bucket_s"] == 300 and len(a["series"]) == 12
    f = a["fleet"]
    assert (f["node_hours"], f["healthy_h"], f["degraded_h"], f["drained_h"]) == (2.0, 1.6, 0.233, 0.167)
    # the availability is the ratio of the hours shown, not of other (unrounded) numbers
    assert f["availability_pct"] == round(100 * f["healthy_h"] / f["node_hours"], 2) == 80.0
    assert f["node_hours"] == round(sum(f[f"{c}_h"] for c in ("healthy", "degraded", "drained",
                                                                "unreachable")), 3)
    models = {r["gpu_model"]: r for r in m["mtbf"]["models"]}
    assert models["H100"]["mtbf_drain_h"] == 1.0 and models["H100"]["mtbf_fail_h"] is None
    assert models["A100"]["mtbf_fail_h"] == 1.0


def test_short_window_html(tmp_path: Path) -> None:
    m = report_from_path(_short_fleet(tmp_path), T1 - H, T1, config=None, generated_at=T1)
    page = report_html.render(m)
    # the chart's axis fits the data: 5 node-minutes drained or degraded per 5 minutes
    assert _axis_labels(page) == ["node-min", "5", "0"]
    assert "per 5 minutes" in page
    avail = page.split('<section id="availability">')[1].split("</section>")[0]
    for text in ("2.0 h", "96 min", "14 min", "10 min", "80.0%"):
        assert f">{text}<" in avail, text
    assert ">0.0<" not in avail and ">0.2<" not in avail
    mtbf = page.split('<section id="mtbf">')[1].split("</section>")[0]
    assert ">60 min<" in mtbf and ">n/a (no failures)<" in mtbf
    assert ">0 h<" not in mtbf and "∞" not in mtbf
    assert "(60 min)" in page  # the window's length in the header
    drains = page.split('<section id="drains">')[1].split("</section>")[0]
    assert ">10 min<" in drains and ">slurmgpu epilog<" in drains


def test_short_window_markdown(tmp_path: Path) -> None:
    m = report_from_path(_short_fleet(tmp_path), T1 - H, T1, config=None, generated_at=T1)
    text = report_md.render(m)
    assert "| **fleet** | 2 | 2.0 h | 96 min | 14 min | 10 min | 0 min | 80.0% |" in text
    assert "Healthy share per 5 minutes:" in text
    assert "50.0% healthy" in text and "90.0% healthy" in text  # 23:10-23:15: 1 min FAIL
    assert "| H100 | 1 | 60 min | 1 | 60 min | 0 | n/a (no failures) |" in text
    assert "| 0.0 |" not in text and " 0 h " not in text


def test_long_window_axis_in_node_hours(model: dict[str, Any]) -> None:
    assert _axis_labels(report_html.render(model)) == ["node-h", "2", "0"]  # 2 nodes drained at most


def test_chart_without_data_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    Store(empty).close()
    m = report_from_path(empty, T1 - H, T1, config=None, generated_at=T1)
    page = report_html.render(m)
    assert "no node-hours observed in the window" in page
    assert "no XID events in the window" in page and "no FAIL or WARN findings in the window" in page
    assert "no node-hours observed in the window" in report_md.render(m)
    healthy = _short_fleet(tmp_path)
    m = report_from_path(healthy, T1 - 10 * 60, T1, config=None, generated_at=T1)  # all healthy
    assert "no unavailable node-hours in the window" in report_html.render(m)


def test_units() -> None:
    from slurmgpu.report.render_util import axis, duration, hours, mtbf, tick

    assert [hours(h) for h in (0, 0.001, 0.233, 1.99, 2, 84, 99.96, 7200.4)] == [
        "0 min", "<1 min", "14 min", "119 min", "2.0 h", "84.0 h", "100 h", "7,200 h"]
    assert mtbf(None) == "n/a (no failures)" and mtbf(0.2) == "12 min" and mtbf(1234.0) == "1,234 h"
    assert [duration(s) for s in (45, 840, 5400, 7200, 3 * 86400)] == [
        "45 s", "14 min", "90 min", "2h 00m", "3d 0h"]
    for top in (0.001, 0.05, 0.235, 1.99, 2.0, 84.0, 5000.0):
        high, scale, unit = axis(top)
        assert high >= top and high / scale > 0 and tick(high / scale) != "0"
        assert unit == ("node-h" if top >= 2 else "node-min" if top * 60 >= 1 else "node-s")
    assert tick(2.5) == "2.5" and tick(1000) == "1,000"


# --------------------------------------------------------------------------- who drained


def test_drains_before_schema_6_are_guessed(tmp_path: Path) -> None:
    """A database whose node_states has no drained_by (schema 5): the report reads the
    reason (outside slurmgpu, actor tags) and guesses the rest by time as before."""
    path = tmp_path / "old.db"
    Store(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("ALTER TABLE node_states DROP COLUMN drained_by")
    db.execute("UPDATE schema_version SET version = 5")
    _ins(db, "nodes", node="n1", first_seen=T0, last_seen=T1)
    for ts, reason, actor in ((T0 + H, "slurmgpu: a", "root"), (T0 + 3 * H, "slurmgpu: b", "root"),
                              (T0 + 5 * H, "slurmgpu: c [by prolog]", "root"),
                              (T0 + 7 * H, "slurmgpu: d [by operator bob]", "root"),
                              (T0 + 9 * H, "disk swap", "carol")):
        _ins(db, "node_states", node="n1", ts=ts, kind="drained", reason=reason, actor=actor)
        _ins(db, "node_states", node="n1", ts=ts + 600, kind="resumed")
    _ins(db, "decisions", time=T0 + H + 30, node="n1", action="drain", reason="slurmgpu: a",
         trigger="t", result="drained")
    db.close()
    m = report_from_path(path, T0, T1, config=None, generated_at=T1)
    got = [(r["by"], r["drained_by"], r["attribution"]) for r in m["drains"]["drains"]]
    assert got == [("automation", "slurmgpu automation (guessed)", "guessed"),
                   ("hook", "slurmgpu (node hook) (guessed)", "guessed"),
                   ("hook", "slurmgpu prolog", "reason"),
                   ("operator", "operator bob (slurmgpu drain)", "reason"),
                   ("outside", "carol (outside slurmgpu)", "reason")]
    assert m["drains"]["by"] == {"automation": 1, "hook": 2, "operator": 1, "outside": 1}


def test_a_renderer_module_missing_a_section_fails_and_an_unknown_section_is_refused() -> None:
    from slurmgpu.report import SECTIONS
    from slurmgpu.report.sections import Renderers

    renders = Renderers()
    for section in SECTIONS[1:]:
        renders(section)(lambda m: "")
    with pytest.raises(TypeError, match=SECTIONS[0]):
        renders.complete()
    renders(SECTIONS[0])(lambda m: "")
    assert list(renders.complete()) == list(SECTIONS)
    with pytest.raises(ValueError, match="no report section"):
        renders("no-such-section")
