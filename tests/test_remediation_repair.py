"""The repair ticket (slurmgpu.remediation.ticket) against its documented JSON Schema,
and ``[remediation] repair_command``'s runner with real scripts: one that records its
stdin, one that fails, one that hangs."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import slurmgpu.remediation.steps as st
from slurmgpu.config.schema import RemediationSettings
from slurmgpu.facts import GpuFacts
from slurmgpu.remediation.ladder import Ladder, Stage, advance, start
from slurmgpu.remediation.repair import run_repair
from slurmgpu.remediation.ticket import SCHEMA, SCHEMA_VERSION, build_ticket
from slurmgpu.result import Finding, Severity

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "docs" / "repair-ticket.schema.json"
T0 = 1_790_000_000.0
GPUS = [GpuFacts(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-aaaa", serial="1650123456789", pci_bus_id="0000:18:00.0"),
        GpuFacts(index=1, lost=True, uuid="GPU-bbbb", serial="1650123456790")]
BAD = Finding("validate.gemm", Severity.FAIL, "GPU 1 at 40% of the floor", gpu=1)


def repaired_ladder() -> Ladder:
    """A persistent fault: validation fails, reset, fails, reboot, fails: repair."""
    settings = RemediationSettings(enabled=True)
    ladder = start("gpu-n7", [Finding("ecc.volatile", Severity.FAIL, "uncorrected", gpu=1)], T0, settings).ladder
    events: list[st.Event] = [st.PassiveHealthy(), st.ValidationSubmitted("1"), st.ValidationFailed("1", (BAD,)),
                              st.ResetDone(), st.ValidationSubmitted("2"), st.ValidationFailed("2", (BAD,)),
                              st.NodeBack(), st.ValidationSubmitted("3"), st.ValidationFailed("3", (BAD,))]
    for i, event in enumerate(events):
        ladder = advance(ladder, event, T0 + 60 * (i + 1), settings).ladder
    assert ladder.stage is Stage.REPAIR
    return ladder


def ticket() -> dict[str, Any]:
    return build_ticket(repaired_ladder(), GPUS, T0 + 3600, "slurmgpu: repair (tried: reset, reboot): ecc.volatile")


def conforms(value: Any, schema: dict[str, Any], defs: dict[str, Any], where: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (the keywords the ticket's schema uses)."""
    if "$ref" in schema:
        return conforms(value, defs[schema["$ref"].rsplit("/", 1)[1]], defs, where)
    kinds = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list, "null": type(None)}
    wanted = schema.get("type")
    if wanted is not None:
        names = wanted if isinstance(wanted, list) else [wanted]
        if not any(isinstance(value, kinds[n]) and not (n == "integer" and isinstance(value, bool)) for n in names):
            return [f"{where}: {value!r} is not {wanted}"]
    if ("const" in schema and value != schema["const"]) or ("enum" in schema and value not in schema["enum"]):
        return [f"{where}: {value!r} not allowed"]
    problems = [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
    for key, sub in schema.get("properties", {}).items():
        if isinstance(value, dict) and key in value:
            problems += conforms(value[key], sub, defs, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += conforms(item, schema["items"], defs, f"{where}[{i}]")
    return problems


# --------------------------------------------------------------------------- the ticket


def test_the_ticket_follows_its_documented_schema() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    made = json.loads(json.dumps(ticket()))
    assert conforms(made, schema, schema["$defs"]) == []
    assert set(made) == set(schema["required"])  # every key documented, every documented key made


def test_the_ticket_says_what_a_technician_needs() -> None:
    made = ticket()
    assert (made["schema"], made["schema_version"], made["node"]) == (SCHEMA, SCHEMA_VERSION, "gpu-n7")
    assert [(g["uuid"], g["serial"], g["lost"]) for g in made["gpus"]] == [
        ("GPU-aaaa", "1650123456789", False), ("GPU-bbbb", "1650123456790", True)]
    assert made["findings"][0]["check"] == "ecc.volatile"
    assert made["ladder"]["remedies"] == ["reset", "reboot"] and made["ladder"]["action"] == "drain"
    assert [v["verdict"] for v in made["validations"]] == ["fail", "fail", "fail"]
    assert made["validations"][0]["findings"][0]["check"] == "validate.gemm"
    assert made["ladder"]["history"][-1]["steps"] == ["drain", "cleanup", "drain", "run_repair"]
    assert made["created"].endswith("Z")


def test_the_schema_check_finds_a_broken_ticket() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    broken = {**json.loads(json.dumps(ticket())), "schema_version": 2}
    del broken["gpus"][0]["serial"]
    assert conforms(broken, schema, schema["$defs"]) == ["$.schema_version: 2 not allowed", "$.gpus[0]: missing serial"]


# --------------------------------------------------------------------------- the runner


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "repair with space.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_command_gets_the_ticket_on_stdin(tmp_path: Path) -> None:
    recorder = script(tmp_path, 'cat > "$1"\necho "filed RMA-1" >&2\n')
    out = tmp_path / "stdin.json"
    made = ticket()
    result = run_repair(f"'{recorder}' {out}", made, timeout_s=30)
    assert result.ok and result.exit_code == 0 and result.error == ""
    assert json.loads(out.read_text()) == json.loads(json.dumps(made))
    assert result.stderr == "filed RMA-1\n"


def test_a_failing_command_is_reported_not_raised(tmp_path: Path) -> None:
    failing = script(tmp_path, 'echo "ticketing API down" >&2\nexit 3\n')
    result = run_repair(f"'{failing}'", ticket(), timeout_s=30)
    assert not result.ok and result.exit_code == 3 and result.error == "exit 3"
    assert "ticketing API down" in result.stderr


def test_a_hanging_command_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    hanging = script(tmp_path, f'sleep 300 &\necho $! > "{pidfile}"\nwait\n')
    began = time.monotonic()
    result = run_repair(f"'{hanging}'", ticket(), timeout_s=0.5)
    assert result.exit_code is None and result.error == "killed after 0.5 s"
    assert time.monotonic() - began < 30
    assert not alive(int(pidfile.read_text()))


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_command_that_never_reads_a_large_ticket_does_not_block(tmp_path: Path) -> None:
    deaf = script(tmp_path, "exit 0\n")
    big = {**ticket(), "findings": [{"message": "x" * 1000}] * 2000}  # 2 MB, past any pipe buffer
    assert run_repair(f"'{deaf}'", big, timeout_s=30).ok


@pytest.mark.parametrize(("command", "says"), [
    ("/nonexistent/rma-open", "No such file"), ("rma 'open", "not run: No closing quotation"),
    ("", "not run: no repair_command")])
def test_a_command_that_cannot_run_is_reported_not_raised(command: str, says: str) -> None:
    result = run_repair(command, ticket(), timeout_s=5)
    assert result.exit_code is None and says in result.error and not result.ok
