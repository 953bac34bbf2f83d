"""xid.recent: XIDs reported by the caller (agent event stream, kernel log, --xid)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, problem, unknown
from slurmgpu.result import Finding, Severity


@check("xid.recent", severity=Severity.FAIL, reads=("xids",),
       summary="recent XIDs judged by the XID policy table (data/xid_catalog.toml + [xid] overrides)")
def xid_recent(ctx: CheckContext) -> Iterator[Finding]:
    if ctx.facts.kernel_log_error:
        yield unknown(f"kernel log not read: {ctx.facts.kernel_log_error}")
    scope = ctx.scope
    seen: Counter[tuple[int | None, int, str | None]] = Counter()
    messages: dict[tuple[int | None, int, str | None], str | None] = {}
    for e in ctx.facts.xids:
        if scope is None or e.gpu is None or e.gpu in scope:
            matched = ctx.xid_policy.rule(e.xid, e.message).matched  # events differ by variant
            key = (e.gpu, e.xid, matched)
            seen[key] += 1
            messages[key] = messages.get(key) or e.message
    for key, count in sorted(seen.items(), key=lambda kv: (kv[0][0] or -1, kv[0][1], kv[0][2] or "")):
        gpu, code, _ = key
        rule = ctx.xid_policy.rule(code, messages[key])
        times = f" x{count}" if count > 1 else ""
        yield problem(rule.severity, f"XID {code}{times}: {rule.name} -> {rule.action}", gpu=gpu,
                      xid=code, count=count, action=rule.action, origin=rule.origin,
                      nvidia=rule.nvidia, text=messages[key])
