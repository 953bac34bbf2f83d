"""Validation results across the fleet: `validate --send`'s request through the agent's
local service, the collector's ``validate.straggler`` (real ZeroMQ, real store on both
backends) and `slurmgpu validate baseline`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from slurmgpu import keys
from slurmgpu.agent.local import LocalService
from slurmgpu.cli import cli
from slurmgpu.result import Finding, Severity, Verdict
from slurmgpu.validate.fleet import NodeResults, stragglers, suggest
from slurmgpu.validate.report import validation_event, validation_request
from slurmgpu.wire import EVENT
from tests.test_collector import Agent, ctx, db_rows, keys_dir, make_settings, running  # noqa: F401

H100 = "NVIDIA H100 80GB HBM3"


def gemm(node: str, tflops: float, model: str = H100, gpus: int = 8) -> Verdict:
    return Verdict(node, tuple(Finding("validate.gemm", Severity.OK, f"gpu{i}: {tflops} TFLOP/s", i, data={
        "metric": "gemm_tflops", "value": tflops, "unit": "TFLOP/s", "model": model}) for i in range(gpus)))


def results(values: dict[str, float], model: str = H100) -> list[NodeResults]:
    return [NodeResults(node, [f.to_json() for f in gemm(node, v, model).findings]) for node, v in values.items()]


# ------------------------------------------------------------------ pure


def test_a_node_a_fraction_below_the_fleet_median_is_a_straggler() -> None:
    fleet = results({"gpu-1": 710.0, "gpu-2": 705.0, "gpu-3": 700.0, "gpu-4": 560.0})
    [found] = stragglers("gpu-4", fleet, fraction=0.15, min_nodes=3)
    assert (found.check, found.severity, found.subject) == ("validate.straggler", Severity.WARN, "validate.gemm")
    assert "560.0 TFLOP/s: 20% below the fleet median 702.5 TFLOP/s of 4 nodes with NVIDIA H100" in found.message
    assert stragglers("gpu-3", fleet, fraction=0.15, min_nodes=3) == []
    assert stragglers("gpu-4", fleet, fraction=0.25, min_nodes=3) == []
    assert stragglers("gpu-4", fleet, fraction=0.15, min_nodes=5) == []  # too few nodes to judge


def test_only_nodes_of_the_same_gpu_model_are_compared() -> None:
    fleet = results({"gpu-1": 710.0, "gpu-2": 705.0}) + results({"a-1": 280.0, "a-2": 270.0}, "NVIDIA A100-SXM4-80GB")
    assert stragglers("a-1", fleet, 0.15, 2) == [] and stragglers("gpu-1", fleet, 0.15, 2) == []


def test_baseline_suggests_the_median_less_the_fraction() -> None:
    [row] = suggest(results({"gpu-1": 700.0, "gpu-2": 720.0, "gpu-3": 600.0}), 0.1)
    assert (row.model, row.metric, row.nodes, row.median, row.minimum, row.suggested) == \
        (H100, "gemm_tflops", 3, 700.0, 600.0, 630.0)


# ------------------------------------------------------------------ the agent's socket


class RecordingAgent:
    settings: Any = None
    node = "gpu-1"

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def latest(self) -> None:
        return None

    def facts_for(self, gpus: Any, max_age_s: float) -> Any:
        raise AssertionError("not asked")

    def submit(self, mtype: str, body: dict[str, Any], *, ts: float | None = None) -> int | None:
        self.sent.append((mtype, body))
        return len(self.sent)


def test_the_agent_spools_a_validation_as_an_event() -> None:
    agent = RecordingAgent()
    reply = LocalService(agent, client_factory=lambda env: None).handle(  # type: ignore[arg-type,return-value]
        json.loads(json.dumps(validation_request(gemm("gpu-1", 700.0, gpus=2)))))
    assert reply == {"ok": True, "seq": 1}
    [(mtype, body)] = agent.sent
    assert mtype == EVENT and body["kind"] == "validation" and body["verdict"] == "OK"
    assert [f["data"]["value"] for f in body["findings"]] == [700.0, 700.0]


@pytest.mark.parametrize("request_", [
    {"op": "validation", "verdict": "OK", "findings": "all fine"},
    {"op": "validation", "verdict": "OK", "findings": [{"check": "gpu.ecc", "severity": "FAIL"}]},
    {"op": "validation", "verdict": "OK", "findings": [{"check": "validate.gemm", "severity": "OK", "gpu": -1}]},
])
def test_a_bad_validation_is_refused_and_nothing_is_sent(request_: dict[str, Any]) -> None:
    agent = RecordingAgent()
    reply = LocalService(agent, client_factory=lambda env: None).handle(request_)  # type: ignore[arg-type,return-value]
    assert reply["ok"] is False and reply["error"].startswith("bad validation: ") and agent.sent == []


# ------------------------------------------------------------------ the collector


def test_the_collector_finds_the_straggler_and_baseline_reads_the_fleet(
        tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any], store_url: str) -> None:  # noqa: F811
    for node in ("gpu-c", "gpu-d"):  # (keys_dir has gpu-a and gpu-b)
        keys.add_node(keys_dir, node)
    cfg = make_settings(tmp_path, keys_dir, db=store_url)
    speeds = {"gpu-a": 712.0, "gpu-b": 705.0, "gpu-c": 698.0, "gpu-d": 540.0}
    with running(cfg):
        for seq, (node, tflops) in enumerate(speeds.items(), start=1):
            agent = Agent(ctx, cfg, keys_dir, node)
            agent.send(EVENT, seq, validation_event(validation_request(gemm(node, tflops))))
            assert agent.acked() == [seq]
    rows = db_rows(cfg, "SELECT node, check_id, severity, subject FROM findings WHERE check_id = 'validate.straggler'")
    assert rows == [("gpu-d", "validate.straggler", "WARN", "validate.gemm")]
    result = CliRunner().invoke(cli, ["validate", "baseline", "--db", cfg.db, "--config", "/dev/null"])
    assert result.exit_code == 0, result.output
    assert f"# {H100}: 4 nodes" in result.output
    assert "gemm_tflops = 631.4  # median 701.5 TFLOP/s, min 540" in result.output


def test_a_failed_validation_drains_and_a_passed_one_starts_no_healthy_streak(
        tmp_path: Path, keys_dir: Path, ctx: zmq.Context[Any]) -> None:  # noqa: F811
    from tests.agenthelpers import wait_until
    from tests.test_collector_automation import with_automation

    cfg = make_settings(tmp_path, keys_dir)
    args, client = with_automation(tmp_path)
    failed = Verdict("gpu-a", (Finding("validate.gemm", Severity.FAIL, "gpu3: its product differs", 3),))
    with running(cfg, **args) as collector:
        agent = Agent(ctx, cfg, keys_dir, "gpu-a")
        agent.send(EVENT, 1, validation_event(validation_request(failed)))
        assert agent.acked() == [1]
        wait_until(lambda: collector.counters.decisions == 1)
        for seq in (2, 3, 4):  # passing validations of the drained node
            agent.send(EVENT, seq, validation_event(validation_request(gemm("gpu-a", 700.0, gpus=1))))
            assert agent.acked() == [seq]
        agent.send(EVENT, 5, {"kind": "xid", "verdict": "OK", "findings": []})  # (the turn after them)
        assert agent.acked() == [5]
        wait_until(lambda: "gpu-a" in collector.automation.state.healthy)  # type: ignore[union-attr]
        assert collector.automation.state.healthy["gpu-a"][0] == 1  # type: ignore[union-attr]  # the xid event only
    assert [c[:2] for c in client.calls if c[0] == "drain"] == [("drain", "gpu-a")]
