"""The shared decision vocabulary (``slurmgpu.decision``, issue 14): the action names are
the historic strings, the drain reasons are byte for byte what the code before it wrote,
findings cross the wire and come back typed (and are refused exactly as before), and node
and head meet only on the wire: no module of the agent imports the collector, or back.

The ``_old_*`` functions are copies of the code this replaced (slurmgpu/actions.py's
``drain_reason``, slurmgpu/collector/policy.py's ``_reason`` and ``PolicyTable.action``,
slurmgpu/wire.py's finding check): the new code must agree with them on any input."""

from __future__ import annotations

import ast
import json
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu import decision, wire, xid
from slurmgpu.config.schema import AutomationAction, AutomationSettings, XidAction
from slurmgpu.decision import (
    CHECKPOINTING,
    DRAINING,
    POLICY_ACTIONS,
    REASON_PREFIX,
    XID_ACTIONS,
    Action,
    PolicyTable,
    drain_reason,
)
from slurmgpu.result import Finding, Severity
from slurmgpu.wire import MAX_CHECK_NAME, MAX_GPUS, MAX_SEVERITY, MAX_SHORT, MAX_TEXT, WireError

PACKAGE = Path(decision.__file__).resolve().parent

# ------------------------------------------------------------------ the vocabulary


def test_action_values_are_the_historic_strings() -> None:
    assert {a.name: a.value for a in Action} == {
        "NONE": "none", "IGNORE": "ignore", "WARN": "warn", "CHECKPOINT": "checkpoint",
        "DRAIN": "drain", "DRAIN_NOW": "drain-now", "RESET": "reset", "REBOOT": "reboot",
        "RESUME": "resume"}
    # The automation's actions, mildest first (collector/policy.py ACTIONS), and the XID
    # catalog's (xid.py ACTIONS), as they were.
    assert POLICY_ACTIONS == ("none", "warn", "checkpoint", "drain", "drain-now", "reboot")
    assert XID_ACTIONS == ("ignore", "warn", "checkpoint", "drain", "reset", "reboot")
    assert xid.ACTIONS is XID_ACTIONS and xid.ACTION_SEVERITY is decision.XID_ACTION_SEVERITY
    assert set(DRAINING) == {"checkpoint", "drain", "drain-now", "reboot"}
    assert set(CHECKPOINTING) == {"checkpoint", "drain-now"}
    assert decision.XID_POLICY == {"ignore": "none", "warn": "warn", "checkpoint": "checkpoint",
                                   "drain": "drain", "reset": "drain", "reboot": "reboot"}
    assert decision.XID_ACTION_SEVERITY == {
        "ignore": Severity.OK, "warn": Severity.WARN, "checkpoint": Severity.WARN,
        "drain": Severity.FAIL, "reset": Severity.FAIL, "reboot": Severity.FAIL}
    assert set(decision.DRAIN_NOW_XIDS) == {79}
    assert REASON_PREFIX == "slurmgpu:" and decision.MAX_REASON == 256
    assert decision.TAGGED_ACTORS == ("prolog", "epilog", "healthcheck", "operator")
    # The config's Literal types spell the same lists (mypy needs them literal there).
    assert typing.get_args(AutomationAction) == POLICY_ACTIONS
    assert typing.get_args(XidAction) == XID_ACTIONS
    assert {r.action for r in xid.catalog().values()} <= set(XID_ACTIONS)


def test_actions_serialise_as_their_strings() -> None:
    """Wherever an Action lands (state and journal JSON, msgpack frames, SQLite, logs) it
    is the plain string it always was."""
    assert json.dumps({"action": Action.DRAIN_NOW}) == '{"action": "drain-now"}'
    assert msgpack.packb({"a": Action.REBOOT}) == msgpack.packb({"a": "reboot"})
    assert f"{Action.CHECKPOINT}" == str(Action.CHECKPOINT) == "checkpoint"
    assert Action.DRAIN == "drain" and "drain" in DRAINING and Action("drain-now") is Action.DRAIN_NOW


def test_the_reason_vocabulary_has_one_home() -> None:
    from slurmgpu import actions, slurm

    assert slurm.REASON_PREFIX is decision.REASON_PREFIX
    assert slurm.actor_tag is decision.actor_tag and slurm.reason_actor is decision.reason_actor
    assert actions.drain_reason is drain_reason and actions.with_actor is decision.with_actor
    assert actions.MAX_REASON == decision.MAX_REASON


# ------------------------------------------------------------------ drain reasons

ROW = Finding("mem.row_remap", Severity.FAIL, "row remapping failed", gpu=3)
PORT = Finding("ib.port_state", Severity.WARN, "port DOWN", subject="mlx5_0/1")
PIN = Finding("pins.driver", Severity.FAIL, "driver 550.54 not in pins")
OK = Finding("gpu.ecc", Severity.OK, "no errors", gpu=0)
THROTTLE = Finding("thermal.throttle", Severity.WARN, "HW slowdown active", gpu=2)


@pytest.mark.parametrize(("kwargs", "expected"), [
    # the prolog/epilog/healthcheck verdict (old actions.drain_reason): raw, worst first
    ({"findings": [PORT, ROW, OK]}, "slurmgpu: mem.row_remap GPU 3 row remapping failed (+1 more)"),
    ({"findings": [PORT]}, "slurmgpu: ib.port_state mlx5_0/1 port DOWN"),
    ({"findings": [PIN]}, "slurmgpu: pins.driver driver 550.54 not in pins"),
    ({"findings": [OK]}, "slurmgpu: unhealthy"),
    ({"findings": []}, "slurmgpu: unhealthy"),
    ({"findings": [Finding("x.y", Severity.FAIL, "a  b\nc", gpu=0)]}, "slurmgpu: x.y GPU 0 a  b\nc"),
    # the gate's internal error (old gate.py f-string)
    ({"text": "internal error in prolog: watchdog: prolog exceeded 10 s in gather"},
     "slurmgpu: internal error in prolog: watchdog: prolog exceeded 10 s in gather"),
    ({"text": "internal error in epilog: ValueError: a\nb at gate.py:1"},
     "slurmgpu: internal error in epilog: ValueError: a\nb at gate.py:1"),
    # the collector's trigger finding (old collector/policy.py _reason): one line
    ({"findings": [THROTTLE], "strikes": 3, "one_line": True},
     "slurmgpu: thermal.throttle GPU 2 HW slowdown active (3 reports)"),
    ({"findings": [ROW], "strikes": 1, "one_line": True}, "slurmgpu: mem.row_remap GPU 3 row remapping failed"),
    ({"findings": [PORT], "strikes": 2, "one_line": True}, "slurmgpu: ib.port_state mlx5_0/1 port DOWN (2 reports)"),
    ({"findings": [Finding("ecc.uncorrected", Severity.FAIL, " 3  volatile\n errors ", gpu=0)],
      "one_line": True}, "slurmgpu: ecc.uncorrected GPU 0 3 volatile errors"),
    # what Actions hands Slurm (old with_actor(with_prefix(reason), actor, user))
    ({"text": "slurmgpu: xid.recent GPU 3 XID 79", "one_line": True, "actor": "epilog"},
     "slurmgpu: xid.recent GPU 3 XID 79 [by epilog]"),
    ({"text": "replace PSU", "one_line": True, "actor": "operator", "user": "alice"},
     "slurmgpu: replace PSU [by operator alice]"),
    ({"text": "replace PSU", "actor": "operator", "user": "not a login"}, "slurmgpu: replace PSU [by operator]"),
    ({"text": "slurmgpu: a [by prolog]", "one_line": True, "actor": "healthcheck"}, "slurmgpu: a [by prolog]"),
    ({"text": "slurmgpu:  journaled\treason ", "one_line": True}, "slurmgpu: journaled reason"),
    ({"text": "x" * 300, "one_line": True, "actor": "prolog"}, "slurmgpu: " + "x" * 233 + "… [by prolog]"),
])
def test_drain_reason_cases_in_use(kwargs: dict[str, Any], expected: str) -> None:
    assert drain_reason(**kwargs) == expected
    assert len(drain_reason(text="y" * 1000, actor="epilog")) == decision.MAX_REASON


def _where(gpu: Any, subject: Any) -> str:
    return f" GPU {gpu}" if gpu is not None else (f" {subject}" if subject else "")


def _old_drain_reason(findings: list[Finding]) -> str:
    bad = sorted((f for f in findings if f.severity is not Severity.OK),
                 key=lambda f: (-f.severity.rank, f.check, f.gpu if f.gpu is not None else -1))
    if not bad:
        return f"{REASON_PREFIX} unhealthy"
    first = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{REASON_PREFIX} {first.check}{_where(first.gpu, first.subject)} {first.message}{more}"


def _old_with_prefix(reason: str) -> str:
    reason = " ".join(reason.split())
    return reason if reason.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {reason}"


def _old_collector_reason(finding: Mapping[str, Any], strikes: int) -> str:
    gpu, subject = finding.get("gpu"), finding.get("subject")
    times = f" ({strikes} reports)" if strikes > 1 else ""
    return _old_with_prefix(f"{finding.get('check', '')}{_where(gpu, subject)} "
                            f"{finding.get('message', '')}{times}")


def _old_with_actor(reason: str, actor: str | None, user: str | None = None) -> str:
    if actor is None or decision.reason_actor(reason) is not None:
        return reason
    tag = decision.actor_tag(actor, user)
    room = 256 - len(tag)
    if len(reason) > room:
        reason = reason[: room - 1].rstrip() + "…"
    return reason + tag


TEXT = st.text(st.sampled_from("ab :\n\t\u2028xslurmgpu[]…"), max_size=40)
FINDINGS = st.builds(Finding, check=st.sampled_from(["ecc.uncorrected", "ib.flap", "a", "slurmgpu:x"]),
                     severity=st.sampled_from(list(Severity)), message=TEXT,
                     gpu=st.none() | st.integers(0, 9), subject=st.none() | st.sampled_from(["", "mlx5_0/1"]))


@settings(max_examples=300, deadline=None)
@given(findings=st.lists(FINDINGS, max_size=5), strikes=st.integers(1, 4), text=TEXT,
       actor=st.none() | st.sampled_from(decision.TAGGED_ACTORS), user=st.none() | st.sampled_from(["bob", "b o"]))
def test_drain_reason_is_byte_identical_to_the_old_code(findings: list[Finding], strikes: int, text: str,
                                                        actor: str | None, user: str | None) -> None:
    assert drain_reason(findings) == _old_drain_reason(findings)
    assert drain_reason(text=f"internal error in prolog: {text}") == f"slurmgpu: internal error in prolog: {text}"
    assert drain_reason(text=text, one_line=True, actor=actor, user=user) == \
        _old_with_actor(_old_with_prefix(text), actor, user)
    bad = [f for f in findings if f.severity is not Severity.OK]
    for f in bad[:1]:
        old = _old_collector_reason(wire.encode_finding(f), strikes)
        assert drain_reason([f], strikes=strikes, one_line=True) == old


# ------------------------------------------------------------------ findings on the wire

ROUND_TRIP = [
    Finding("xid.recent", Severity.FAIL, "XID 79: GPU has fallen off the bus", gpu=3,
            data={"xid": 79, "action": "reset", "events": [{"t": 1.5, "msg": None}]}),
    Finding("nvml.query", Severity.UNKNOWN, "check could not run: NVMLError_Unknown"),
    Finding("ib.port_state", Severity.WARN, "port DOWN", subject="mlx5_0/1"),
    Finding("gpu.ecc", Severity.OK, "", gpu=0),
    Finding("pins.driver", Severity.OK, "not configured", not_applicable=True),
    Finding("c" * MAX_CHECK_NAME, Severity.FAIL, "m" * MAX_TEXT, gpu=MAX_GPUS - 1, subject="s" * MAX_SHORT),
    Finding("gpu.lost", Severity.FAIL, "ünïcode ✓ \n newline", gpu=None, data={"bytes": b"\x00\xff"}),
]


@pytest.mark.parametrize("finding", ROUND_TRIP, ids=lambda f: f.check[:20])
def test_finding_round_trips(finding: Finding) -> None:
    raw = wire.encode_finding(finding)
    assert raw == finding.to_json()  # the map on the wire today
    assert wire.decode_finding(msgpack.unpackb(msgpack.packb(raw, use_bin_type=True), raw=False)) == finding
    env = wire.Envelope(type=wire.REPORT, node="n1", seq=1,
                        body={"verdict": "FAIL", "findings": wire.encode_findings([finding, finding])})
    decoded = wire.decode(wire.encode(env))
    assert decoded.findings == (finding, finding)
    assert decoded.body["findings"] == [raw, raw]


def test_encoded_data_is_msgpack_safe() -> None:
    f = Finding("x", Severity.WARN, "m", data={"set": {1}, "tuple": (1, 2), 3: object.__name__, "o": Severity.OK})
    raw = wire.encode_finding(f)
    assert raw["data"] == {"set": [1], "tuple": [1, 2], "3": "object", "o": 0}
    msgpack.packb(raw)


def test_decode_is_as_lenient_as_the_head_side_was() -> None:
    """What validation let through still gets through: the collector reads it as it did
    (a missing or null message as none, an unknown severity as not OK, any case)."""
    f = wire.decode_finding({"check": "a", "severity": "fail", "message": None, "data": [1],
                             "not_applicable": 1})
    assert f == Finding("a", Severity.FAIL, "", not_applicable=True)
    assert wire.decode_finding({"check": "a", "severity": "Bogus"}).severity is Severity.UNKNOWN
    assert wire.decode_finding({"check": "", "severity": ""}).severity is Severity.UNKNOWN
    assert wire.decode_severity("ok") is Severity.OK and wire.decode_severity("WARN") is Severity.WARN


def _old_finding_error(f: Any, mtype: str) -> str | None:
    """slurmgpu/wire.py's finding check before issue 14: the error, or None."""
    if type(f) is not dict:
        return f"{mtype}: malformed finding"
    check, severity, gpu = f.get("check"), f.get("severity"), f.get("gpu")
    subject, message = f.get("subject"), f.get("message")
    if type(check) is not str or len(check) > MAX_CHECK_NAME or type(severity) is not str \
            or len(severity) > MAX_SEVERITY \
            or (subject is not None and not (isinstance(subject, str) and len(subject) <= MAX_SHORT)) \
            or (message is not None and not (isinstance(message, str) and len(message) <= MAX_TEXT)):
        return f"{mtype}: malformed finding"
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < MAX_GPUS):
        return f"{mtype}: finding GPU index out of range [0, {MAX_GPUS - 1}]"
    return None


MALFORMED = [
    "x", [], None, 1, {}, {"check": "a"}, {"severity": "OK"}, {"check": 1, "severity": "OK"},
    {"check": "a", "severity": 2}, {"check": "c" * (MAX_CHECK_NAME + 1), "severity": "OK"},
    {"check": "a", "severity": "S" * (MAX_SEVERITY + 1)},
    {"check": "a", "severity": "OK", "subject": 5}, {"check": "a", "severity": "OK", "subject": "s" * 257},
    {"check": "a", "severity": "OK", "message": b"bytes"},
    {"check": "a", "severity": "OK", "message": "m" * (MAX_TEXT + 1)},
    {"check": "a", "severity": "OK", "gpu": MAX_GPUS}, {"check": "a", "severity": "OK", "gpu": -1},
    {"check": "a", "severity": "OK", "gpu": "0"}, {"check": "a", "severity": "OK", "gpu": True},
    {"check": "a", "severity": "OK", "gpu": 1.0},
]


@pytest.mark.parametrize("raw", MALFORMED, ids=repr)
@pytest.mark.parametrize("mtype", [wire.REPORT, wire.EVENT])
def test_malformed_findings_are_refused_as_before(raw: Any, mtype: str) -> None:
    expected = _old_finding_error(raw, mtype)
    assert expected is not None
    with pytest.raises(WireError) as direct:
        wire.decode_finding(raw, mtype)
    assert str(direct.value) == expected
    body: dict[str, Any] = {"verdict": "FAIL", "findings": [wire.encode_finding(PIN), raw]}
    if mtype == wire.EVENT:
        body["kind"] = "xid"
    frame = wire.encode_unchecked(wire.Envelope(type=mtype, node="n1", seq=1, body=body))
    with pytest.raises(wire.BodyError) as framed:
        wire.decode(frame)
    assert str(framed.value) == expected and framed.value.envelope.body == body


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2, 2**11) | st.text(max_size=3),
                       lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner,
                                                                                  max_size=2), max_leaves=4)
RAW_FINDINGS = st.dictionaries(st.sampled_from(["check", "severity", "gpu", "subject", "message",
                                                "not_applicable", "data"]), JSONISH, max_size=7) | JSONISH


@settings(max_examples=500, deadline=None)
@given(raw=RAW_FINDINGS)
def test_decode_refuses_exactly_what_validation_refused(raw: Any) -> None:
    expected = _old_finding_error(raw, "report")
    try:
        f = wire.decode_finding(raw, "report")
    except WireError as exc:
        assert str(exc) == expected
    else:
        assert expected is None and f.check == raw["check"]


# ------------------------------------------------------------------ the policy over Finding


def _old_action(settings: AutomationSettings, finding: Mapping[str, Any], strikes: int = 1) -> str:
    """collector/policy.py's PolicyTable.action before issue 14 (over the wire's dicts)."""
    overrides = {(k.partition(":")[0].strip(), k.partition(":")[2].upper() or None): v
                 for k, v in settings.policy.items()}
    xid_actions = {"ignore": "none", "warn": "warn", "checkpoint": "checkpoint", "drain": "drain",
                   "reset": "drain", "reboot": "reboot"}

    def allowed(action: str) -> str:
        return "drain" if action == "reboot" and not settings.reboot_allowed else action

    check = str(finding.get("check", ""))
    severity = str(finding.get("severity", "OK")).upper()
    if severity == "OK" or finding.get("not_applicable"):
        return "none"
    for key in ((check, severity), (check, None)):
        if key in overrides:
            return allowed(overrides[key])
    data = finding.get("data") or {}
    if check == "gpu.lost" and severity == "FAIL":
        return "drain-now"
    if check == "xid.recent":
        if data.get("xid") in frozenset({79}):
            return "drain-now"
        return allowed(xid_actions.get(str(data.get("action")), "drain" if severity == "FAIL" else "warn"))
    if check == "gpu.recovery_action" and severity == "FAIL":
        return allowed(xid_actions.get(str(data.get("action")), "drain"))
    if check == "mem.row_remap" and "pending" in str(finding.get("message", "")):
        return "checkpoint" if strikes < 2 else "drain"
    if check == "thermal.throttle" and severity == "WARN":
        return "drain" if strikes >= settings.strikes else "warn"
    return "drain" if severity == "FAIL" else "warn"


POLICY_FINDINGS = st.builds(
    Finding, check=st.sampled_from(["gpu.lost", "xid.recent", "gpu.recovery_action", "mem.row_remap",
                                    "thermal.throttle", "ecc.uncorrected", "pins.driver"]),
    severity=st.sampled_from(list(Severity)), message=st.sampled_from(["row remap pending", "broken", ""]),
    not_applicable=st.booleans(),
    data=st.fixed_dictionaries({}, optional={"xid": st.sampled_from([13, 48, 79, 154]),
                                             "action": st.sampled_from([*XID_ACTIONS, "bogus"])}))
SETTINGS = st.builds(AutomationSettings, reboot_allowed=st.booleans(), strikes=st.integers(1, 3),
                     policy=st.sampled_from([{}, {"ecc.uncorrected": "drain-now", "thermal.throttle:WARN": "none"},
                                             {"xid.recent:fail": "reboot", "mem.row_remap": "warn"}]))


@settings(max_examples=400, deadline=None)
@given(settings_=SETTINGS, finding=POLICY_FINDINGS, strikes=st.integers(1, 4))
def test_policy_over_findings_decides_as_the_policy_over_dicts_did(settings_: AutomationSettings,
                                                                   finding: Finding, strikes: int) -> None:
    action = PolicyTable(settings_).action(finding, strikes)
    assert isinstance(action, Action)
    assert action == _old_action(settings_, wire.encode_finding(finding), strikes)


def test_policy_refuses_bad_settings_as_before() -> None:
    with pytest.raises(ValueError, match=r"\[automation\] policy 'x': unknown action 'explode'"):
        PolicyTable(AutomationSettings(policy={"x": "explode"}))
    with pytest.raises(ValueError, match=r"\[automation\] policy 'x:BAD': unknown severity 'BAD'"):
        PolicyTable(AutomationSettings(policy={"x:BAD": "warn"}))


# ------------------------------------------------------------------ node and head meet on the wire only


def _imports(path: Path) -> list[tuple[int, str]]:
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return _imports_in(path.read_text(encoding="utf-8"), package)


def _imports_in(source: str, package: str) -> list[tuple[int, str]]:
    """Every module ``source`` (a module of ``package``) imports, at any depth (function
    bodies included), as absolute names (``from slurmgpu import collector`` ->
    slurmgpu.collector; relative imports resolved), plus import_module/__import__ calls
    with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def _crossings(side: str, other: str) -> list[str]:
    files = sorted((PACKAGE / side).rglob("*.py"))
    assert files, side
    return [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
            for path in files for line, name in _imports(path)
            if name == f"slurmgpu.{other}" or name.startswith(f"slurmgpu.{other}.")]


@pytest.mark.parametrize(("side", "other"), [("agent", "collector"), ("collector", "agent")])
def test_node_and_head_do_not_import_each_other(side: str, other: str) -> None:
    assert _crossings(side, other) == []


def test_the_import_check_sees_lazy_and_indirect_imports() -> None:
    source = ("def f():\n    from slurmgpu.collector.policy import Automation\n"
              "def g():\n    from slurmgpu import collector\n"
              "def h():\n    import importlib\n    importlib.import_module('slurmgpu.collector.store')\n"
              "class C:\n    def m(self):\n        import slurmgpu.collector.metrics\n"
              "from ..collector import server\n")
    found = {name for _, name in _imports_in(source, "slurmgpu.agent")}
    assert {"slurmgpu.collector.policy", "slurmgpu.collector", "slurmgpu.collector.store",
            "slurmgpu.collector.metrics", "slurmgpu.collector.server"} <= found


def test_decision_is_pure() -> None:
    """Standard library and slurmgpu.result/facts/xid only: no I/O-bearing package, no
    side of the wire."""
    allowed = ("slurmgpu.result", "slurmgpu.facts", "slurmgpu.xid")
    names = {name for _, name in _imports(PACKAGE / "decision.py")}
    ours = {n for n in names if n.startswith("slurmgpu")}
    assert all(any(n == a or n.startswith(a + ".") for a in allowed) for n in ours), ours
    third_party = {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"slurmgpu", "__future__"}
    assert third_party == set()
