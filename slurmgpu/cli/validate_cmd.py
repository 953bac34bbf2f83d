"""`slurmgpu validate` (active tests on this node) and `slurmgpu validate baseline`
(thresholds suggested from the fleet's stored results). docs/validation.md."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from slurmgpu.cli.common import (
    CliError,
    config_option,
    db_option,
    existing_db,
    json_option,
    load_settings,
)
from slurmgpu.errors import UsageError

JSON_SCHEMA = "slurmgpu.validate/1"
#: How long `--send` waits for the agent to spool the findings.
SEND_TIMEOUT_S = 10.0


@click.group(invoke_without_command=True)
@config_option
@click.option("--tier", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
              help="quick: about a minute; full: up to 15 minutes (budgets in [validate]).")
@click.option("--tests", metavar="LIST", help="Only these tests, e.g. gemm,nccl "
              "(gemm, hbm, pcie, p2p, nccl, dcgm, ib).")
@click.option("--gpus", metavar="LIST", help="Only these GPU indices, e.g. 0,2 or 0-3.")
@click.option("--node", metavar="NAME", help="Node name for host-targeted config (default: this host).")
@json_option("Print the verdict, findings and each test's duration as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also list OK and not-applicable findings.")
@click.option("--send", is_flag=True, help="Also hand the findings to this node's agent (its local "
              "socket), which sends them to the collector as a 'validation' event.")
@click.pass_context
def validate(ctx: click.Context, config_file: str | None, tier: str, tests: str | None, gpus: str | None,
             node: str | None, as_json: bool, show_all: bool, send: bool) -> int:
    """Run active tests on this node (GPU burn with silent-data-corruption screening,
    memory, PCIe, P2P/NVLink and NCCL bandwidth, DCGM diag, IB loopback): for idle
    nodes only, never from a prolog.

    Every test runs in its own process group under a hard timeout; a test that does not
    finish is a finding. Exit code: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN (a test could not
    judge the node, bad arguments or config, or slurmgpu itself broke).
    """
    if ctx.invoked_subcommand is not None:
        return 0
    from slurmgpu.cli.checkrun import parse_gpu_list, render_table
    from slurmgpu.engine import node_name
    from slurmgpu.validate.session import parse_tests

    try:
        selected = parse_tests(tests)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    scope = parse_gpu_list(gpus) if gpus is not None else None
    name = node or node_name()
    settings = load_settings(config_file, node=name).settings
    try:
        outcome = _run(settings, tier, selected, scope, name)
    except Exception as exc:  # a bug of ours: UNKNOWN, never Python's exit 1 (WARN, a pass)
        raise CliError(f"validate broke, no verdict: {type(exc).__name__}: {exc}") from exc
    if send:
        _send(settings, outcome.verdict)
    if as_json:
        click.echo(json.dumps(outcome_json(outcome, scope), indent=2))
    else:
        click.echo(render_table(outcome.verdict, show_all=show_all, duration_ms=outcome.duration_s * 1000))
    return outcome.verdict.severity.exit_code


def _run(settings: Any, tier: str, tests: list[str], scope: frozenset[int] | None, node: str) -> Any:
    from slurmgpu.validate.discover import gpus_of
    from slurmgpu.validate.platform import platform_for
    from slurmgpu.validate.session import run_tier

    gpus = gpus_of(settings, scope)
    return run_tier(settings.validate, tier, tests, gpus, platform_for(settings.validate), node, dict(os.environ))


def outcome_json(outcome: Any, scope: frozenset[int] | None) -> dict[str, Any]:
    verdict = outcome.verdict
    return {"schema": JSON_SCHEMA, "node": verdict.node, "verdict": verdict.severity.name,
            "exit_code": verdict.severity.exit_code, "tier": outcome.tier,
            "gpus": sorted(scope) if scope is not None else None,
            "findings": [f.to_json() for f in verdict.findings],
            "tests": [{"test": r.test, "result": r.severity, "duration_s": r.duration_s, "tool_s": r.tool_s}
                      for r in outcome.records],
            "duration_ms": round(outcome.duration_s * 1000, 2)}


def _send(settings: Any, verdict: Any) -> None:
    """Through the agent: it spools the event, so the collector gets it even when it is
    away now. No agent: one line on stderr, the verdict stands. A busy agent gets
    ``SEND_TIMEOUT_S`` (a hook's half second would lose minutes of tests)."""
    from slurmgpu.localproto import AgentUnavailable, ask, query_timeout, socket_path
    from slurmgpu.validate.report import validation_request

    path = socket_path(os.environ, settings.agent.socket)
    timeout = max(query_timeout(os.environ, settings.agent.query_timeout_s), SEND_TIMEOUT_S)
    try:
        reply = ask(path, validation_request(verdict), timeout)
    except AgentUnavailable as exc:
        click.echo(f"slurmgpu: warning: not sent: no agent at {path} ({exc})", err=True)
        return
    except Exception as exc:  # the sending is bookkeeping: it never changes the verdict
        click.echo(f"slurmgpu: warning: not sent: {type(exc).__name__}: {exc}", err=True)
        return
    if not reply.get("ok"):
        click.echo(f"slurmgpu: warning: not sent: the agent said {reply.get('error')!r}", err=True)


@validate.command("baseline")
@config_option
@db_option
@json_option("Print the suggestions as JSON.")
@click.option("--fraction", type=click.FloatRange(0, 0.9), default=0.1, show_default=True,
              help="Suggest each floor this fraction below the fleet median.")
def baseline(config_file: str | None, db: str | None, as_json: bool, fraction: float) -> None:
    """Suggest [validate] thresholds per GPU model from the fleet's stored results (each
    node's newest validation): the fleet median less --fraction."""
    from slurmgpu.collector.store.queries import latest_validations, snapshot
    from slurmgpu.validate.fleet import NodeResults, suggest

    found = existing_db(load_settings(config_file), db)
    with snapshot(found.path) as conn:
        results = [NodeResults(node, body.get("findings") or []) for node, _, _, body in latest_validations(conn)]
    rows = suggest(results, fraction)
    if not rows:
        raise CliError(f"no validation results in {found.path} (run `slurmgpu validate --send` on nodes)")
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    for model, lines in _by_model(rows).items():
        click.echo(f"# {model}: {lines[0].nodes} nodes\n[[hosts]]\nnodes = \"...\"  # the nodes with {model}")
        click.echo("[hosts.validate]")
        for r in lines:
            click.echo(f"{r.metric} = {r.suggested:g}  # median {r.median:g} {r.unit}, min {r.minimum:g}")
        click.echo()


def _by_model(rows: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in rows:
        out.setdefault(r.model, []).append(r)
    return out
