"""A tier run: the selected tests one after another, each under ``min(its timeout, what
is left of the tier's budget)``, every outcome a finding (a hang, a missing tool, a tool
that failed or printed nonsense, our own crash), so `validate` always ends with a verdict
within the budget plus the time to kill a process group."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurmgpu.config.schema import ValidateSettings
from slurmgpu.result import Finding, Severity, Verdict
from slurmgpu.validate.catalog import TESTS
from slurmgpu.validate.context import Context, Gpu, Hung, NotApplicable, ToolFailed
from slurmgpu.validate.parsers import ParseError
from slurmgpu.validate.platform import Platform

TIERS = ("quick", "full")
#: Below this much budget left, a test is not started.
MIN_LEFT_S = 0.5
_HANG = {"warn": Severity.WARN, "fail": Severity.FAIL, "unknown": Severity.UNKNOWN}


@dataclass(frozen=True)
class TestRecord:
    test: str
    severity: str
    duration_s: float
    tool_s: float  # time inside the tools' processes


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    tier: str
    records: tuple[TestRecord, ...]
    duration_s: float


def parse_tests(text: str | None) -> list[str]:
    """"gemm,nccl" -> those tests in catalog order; None: all. ValueError names a bad one."""
    if text is None:
        return list(TESTS)
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TESTS]
    if unknown or not wanted:
        raise ValueError(f"--tests: unknown test {', '.join(unknown) or repr(text)} (tests: {', '.join(TESTS)})")
    return [t for t in TESTS if t in wanted]


def _outcome(check: str, ctx: Context, timeout_s: float, settings: ValidateSettings) -> list[Finding]:
    try:
        return TESTS[check.split(".", 1)[1]](ctx)
    except NotApplicable as exc:
        return [Finding(check, Severity.OK, f"not applicable: {exc}", not_applicable=True)]
    except Hung as exc:
        return [Finding(check, _HANG[settings.hang_severity], f"{check} did not finish in {timeout_s:.0f} s "
                        f"(killed: {exc})"[:1000], data={"timeout_s": round(timeout_s, 3), "hang": True})]
    except (ToolFailed, ParseError) as exc:
        return [Finding(check, Severity.UNKNOWN, f"{check} could not judge the node: {exc}"[:1000])]
    except Exception as exc:  # a bug of ours: UNKNOWN, never a verdict on the node
        return [Finding(check, Severity.UNKNOWN, f"{check} broke: {type(exc).__name__}: {exc}"[:1000])]


def _record(test: str, findings: list[Finding], started: float, ctx: Context) -> TestRecord:
    severity = max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)
    name = "N/A" if findings and all(f.not_applicable for f in findings) else severity.name
    return TestRecord(test, name, round(time.monotonic() - started, 3),
                      round(sum(r.duration_s for r in ctx.runs), 3))


def run_tier(settings: ValidateSettings, tier: str, tests: Sequence[str], gpus: list[Gpu],
             platform: Platform, node: str, env: Mapping[str, str]) -> Outcome:
    started = time.monotonic()
    budget_end = started + float(getattr(settings, f"{tier}_budget_s"))
    per_test = float(getattr(settings, f"{tier}_test_timeout_s"))
    findings: list[Finding] = []
    records = []
    for test in tests:
        now = time.monotonic()
        left = budget_end - now
        if left < MIN_LEFT_S:
            findings.append(Finding(f"validate.{test}", Severity.UNKNOWN, f"validate.{test} not run: the "
                                    f"{tier} tier's budget of {budget_end - started:.0f} s was spent"))
            records.append(TestRecord(test, "UNKNOWN", 0.0, 0.0))
            continue
        timeout = min(per_test, left)
        ctx = Context(settings, tier, gpus, platform, now + timeout, env)
        found = _outcome(f"validate.{test}", ctx, timeout, settings)
        findings += found
        records.append(_record(test, found, now, ctx))
    findings += _nothing_ran(tier, records, findings)
    elapsed = time.monotonic() - started
    return Outcome(Verdict(node, tuple(findings), elapsed * 1000), tier, tuple(records), elapsed)


def _nothing_ran(tier: str, records: list[TestRecord], findings: list[Finding]) -> list[Finding]:
    """A run in which no test applied validated nothing: UNKNOWN, never a pass (a node
    returned to service must have been measured)."""
    if not records or any(r.severity != "N/A" for r in records):
        return []
    why = "; ".join(f"{f.check}: {f.message.removeprefix('not applicable: ')}" for f in findings)
    return [Finding(f"validate.{tier}", Severity.UNKNOWN,
                    f"no {tier} test could run on this node, nothing was validated ({why})"[:1000])]
