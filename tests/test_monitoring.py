"""The shipped alert rules and Grafana dashboard (monitoring/) name only metrics that a real
collector's /metrics exports, and the rules pass `promtool check rules` (where installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from slurmgpu.collector.app import build_collector
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.automation import DrainedNode
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.testing import FakeSlurmClient
from tests.test_collector import free_port, keys_dir, make_settings  # noqa: F401
from tests.test_metrics import add_checkpoints, scrape, seed

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULES = MONITORING / "slurmgpu.rules.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
#: Series Prometheus makes itself, not the collector.
PROMETHEUS_OWN = {"up"}
METRIC = re.compile(r"\b(slurmgpu_[a-z0-9_]+|up)\b(?!\s*\()")


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def named_metrics(exprs: list[str]) -> set[str]:
    """Metric names in PromQL expressions (label values in quotes left out)."""
    return {m for expr in exprs for m in METRIC.findall(re.sub(r'"[^"]*"', '""', expr))}


@pytest.fixture
def exported(tmp_path: Path, keys_dir: Path) -> set[str]:  # noqa: F811
    """Every sample name of one scrape of a collector with automation, nodes, events,
    decisions and checkpoints: all the families it can export."""
    cfg = make_settings(tmp_path, keys_dir, metrics_bind=f"127.0.0.1:{free_port()}",
                        db=str(tmp_path / "fleet.db"))
    client = FakeSlurmClient(["gpu-a", "gpu-b"])
    store = Store(cfg.db)
    auto = Automation(AutomationSettings(), client, tmp_path / "state", store=store)
    auto.state.drained = {"gpu-a": DrainedNode(1.0)}
    auto._record.save()
    store.close()
    collector = build_collector(cfg, automation=AutomationSettings(), slurm=client,
                                state_dir=tmp_path / "state")
    try:
        assert collector.metrics_server is not None
        seed(collector.store, time.time())
        add_checkpoints(cfg.db, ["open", "acked"])
        return {name for name, _ in scrape(collector.metrics_server.url)}
    finally:
        collector.close()


def test_the_files_name_metrics_at_all() -> None:
    assert len(named_metrics(rule_exprs())) >= 8 and len(named_metrics(dashboard_exprs())) >= 15


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str, exported: set[str]) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    unknown = named_metrics(exprs) - exported - PROMETHEUS_OWN
    assert not unknown, f"{source} name metrics /metrics does not export: {sorted(unknown)}"


def test_a_misspelt_metric_is_caught(exported: set[str]) -> None:
    assert named_metrics(["slurmgpu_node_verdicts == 2"]) - exported == {"slurmgpu_node_verdicts"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian: prometheus)")
def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
