"""`slurmgpu collector`, `slurmgpu fleet`, `slurmgpu breaker` and `slurmgpu lemon`.

zmq and the collector are imported inside the commands, so `slurmgpu --help` stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from slurmgpu.agent.notify import notify as sd_notify
from slurmgpu.cli.common import (
    CliError,
    FleetDb,
    config_option,
    db_option,
    existing_db,
    fleet_db,
    json_option,
    load_settings,
)
from slurmgpu.config.schema import Settings

if TYPE_CHECKING:
    from slurmgpu.collector.policy import Automation
    from slurmgpu.collector.store import Store
    from slurmgpu.remediation.status import LadderStatus
    from slurmgpu.slurm import NodeState


def _automation(settings: Settings, *, store: Store, read_only: bool = False) -> Automation:
    """The collector's Automation as `slurmgpu breaker`, `lemon` and `fleet` see it: its
    state in ``store`` (the collector's database), its journal of Slurm calls in
    ``paths.state_dir`` (the collector builds its own: ``build_collector``)."""
    from slurmgpu.collector.policy import Automation
    from slurmgpu.slurm.factory import make_client

    try:
        return Automation(settings.automation, make_client(settings.slurm), settings.paths.state_dir,
                          store=store, read_only=read_only)
    except ValueError as exc:  # a bad [automation] policy entry, an automation.json not importable
        raise CliError(str(exc)) from None


def _slurm_client(settings: Settings) -> Any:
    """The Slurm client the collector polls for drained nodes (None: polling off)."""
    if settings.collector.slurm_poll_s <= 0:
        return None
    from slurmgpu.slurm.factory import make_client

    try:
        return make_client(dataclasses.replace(settings.slurm, retries=1))
    except Exception as exc:  # e.g. pyslurm asked for but unusable: the collector still runs
        click.echo(f"slurmgpu: warning: no Slurm client, drains not recorded: {exc}", err=True)
        return None


def _collector_args(settings: Settings, *, dry_run: bool = False) -> dict[str, Any]:
    """``build_collector``'s automation and Slurm arguments from the config: the automation
    only with ``[automation] enabled`` (``dry_run``: recording only), its state in
    ``paths.state_dir``."""
    args: dict[str, Any] = {"slurm_poll": _slurm_client(settings)}
    if settings.automation.enabled:
        from slurmgpu.slurm.factory import make_client

        auto = dataclasses.replace(settings.automation, dry_run=True) if dry_run else settings.automation
        args.update(automation=auto, slurm=make_client(settings.slurm), state_dir=settings.paths.state_dir,
                    remediation=settings.remediation)
    return args


# --------------------------------------------------------------------------- collector


@click.command("collector")
@config_option
@click.option("--bind", default=None, help="ZeroMQ endpoint to bind (collector.bind).")
@click.option("--events-port", type=int, default=None,
              help="Port for events and command results, 0 = none (collector.events_port).")
@click.option("--db", default=None, help="SQLite database (collector.db; $SLURMGPU_DB).")
@click.option("--keys-dir", default=None,
              help="CURVE keys and allow-list (collector.keys_dir; $SLURMGPU_KEYS_DIR).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--dry-run", is_flag=True,
              help="With [automation] enabled: record every decision, make no Slurm call.")
def collector(config_file: str | None, bind: str | None, events_port: int | None, db: str | None,
              keys_dir: str | None, log_level: str, dry_run: bool) -> None:
    """Run the fleet collector until SIGTERM/SIGINT (SIGHUP reloads the allow-list).

    With ``[automation] enabled = true`` it also drains and resumes nodes from their
    reports (``slurmgpu breaker`` shows and releases its circuit breaker)."""
    from slurmgpu import log
    from slurmgpu.collector.app import build_collector

    log.configure(log_level, json=True)
    full = load_settings(config_file, flags={"collector.bind": bind, "collector.events_port": events_port,
                                             "collector.db": db, "collector.keys_dir": keys_dir}).settings
    settings = full.collector
    if dry_run and not full.automation.enabled:
        click.echo("--dry-run has no effect: [automation] enabled is false", err=True)
    try:  # one store, one connection: the collector's and its automation's (build_collector)
        server = build_collector(settings, **_collector_args(full, dry_run=dry_run))
    except ValueError as exc:  # a bad [automation] policy entry, an unwritable state_dir,
        raise CliError(str(exc)) from None  # an automation.json not importable
    except OSError as exc:
        raise CliError(f"{exc.filename or settings.db}: {exc.strerror or exc}") from None
    _serve(server)


def _serve(server: Any) -> None:
    """Run the collector until SIGTERM/SIGINT, telling systemd."""
    stop = threading.Event()

    def _stop(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sd_notify("READY=1\nSTATUS=listening on " + server.endpoint)
    server.run(stop)
    sd_notify("STOPPING=1")


# --------------------------------------------------------------------------- fleet


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172800:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def _drained(settings: Settings) -> dict[str, NodeState] | None:
    """{node: its state} from Slurm, or None when Slurm can't be asked."""
    from slurmgpu.slurm.factory import make_client

    quick = dataclasses.replace(settings.slurm, retries=1)
    try:
        return {n.name: n for n in make_client(quick).nodes()}
    except Exception:  # no Slurm here, slurmctld down, pyslurm mismatch: the column says "?"
        return None


def _comes_back(settings: Settings, status: dict[str, Any] | None,
                states: dict[str, NodeState] | None) -> dict[str, str]:
    """{drained node: when it comes back} (docs/admin-guide.md, "Day to day")."""
    import os

    from slurmgpu.cli import outlook

    drained = [n for n in (states or {}).values() if n.drained]
    if not drained:
        return {}
    resumers = outlook.resumers(settings, status, os.environ)
    return {n.name: text for n in drained if (text := outlook.outlook(n, resumers)) is not None}


@click.command("fleet")
@config_option
@db_option
@json_option("JSON output.")
def fleet(config_file: str | None, db: str | None, as_json: bool) -> None:
    """Fleet health from the collector's database: one line per node."""
    from slurmgpu.collector.store import Store

    loaded = load_settings(config_file)
    settings = loaded.settings
    store = Store(existing_db(loaded, db).path)
    try:
        rows: list[dict[str, Any]] = [dict(r) for r in store.fleet()]
        pending = _pending_checkpoints(store)
        status = _automation_status(settings, store)
        ladders = _ladders(store)
    finally:
        store.close()
    drained = _drained(settings)
    breaker = _breaker_text(status) if isinstance(status, dict) else status
    back = _comes_back(settings, status if isinstance(status, dict) else None, drained)
    now = time.time()
    for r in rows:
        state = (drained or {}).get(r["node"])
        r["drained"] = None if drained is None else (state.drained if state is not None else None)
        r["last_seen_age_s"] = None if r["last_seen"] is None else round(now - r["last_seen"], 1)
        r["comes_back"] = back.get(r["node"])
        r["ladder"] = ladders[r["node"]].to_json() if r["node"] in ladders else None
    if as_json:
        click.echo(json.dumps({"nodes": rows, "pending_checkpoints": pending,
                               "automation": status if isinstance(status, dict) else
                               ({"error": status} if status else None)}, indent=2))
        return
    if rows:
        _fleet_table(rows, drained is None)
    else:
        click.echo("no nodes have reported yet")
    for node, text in sorted(back.items()):
        click.echo(f"{node}: {text}")
    for node, ladder in sorted(ladders.items()):
        click.echo(f"{node}: return to service: {ladder.text(now)}")
    if breaker:
        click.echo(breaker)
    for p in pending:
        jobs = ", ".join(f"{j['job_id']} ({j['state']}, deadline in {j['deadline'] - now:.0f}s)"
                         for j in p["jobs"]) or "-"
        click.echo(f"checkpointing: {p['node']} {p['action']} waits for job(s) {jobs}")


def _fleet_table(rows: list[dict[str, Any]], slurm_unknown: bool) -> None:
    width = max(16, *(len(r["node"]) for r in rows))
    click.echo(f"{'NODE':<{width}} {'VERDICT':<8} {'LAST SEEN':<10} {'REACHABLE':<9} "
               f"{'DRAINED?':<8} WORST FINDING")
    for r in rows:
        worst = "-"
        if r["worst_check"]:
            gpu = f" gpu{r['worst_gpu']}" if r["worst_gpu"] is not None else ""
            worst = f"{r['worst_severity']} {r['worst_check']}{gpu}: {r['worst_message'] or ''}"
        d = r["drained"]
        drained_text = "?" if slurm_unknown else ("-" if d is None else ("yes" if d else "no"))
        click.echo(f"{r['node']:<{width}} {r['verdict'] or '-':<8} {_age(r['last_seen_age_s']):<10} "
                   f"{'yes' if r['reachable'] else 'NO':<9} {drained_text:<8} {worst[:100]}")


def _pending_checkpoints(store: Any) -> list[dict[str, Any]]:
    """Nodes whose drain waits for their jobs' checkpoints, with those jobs."""
    requests = {c["id"]: c for c in store.checkpoints(active=True, limit=100_000)}
    out = []
    for p in store.pending_drains():
        jobs = [{"job_id": c["job_id"], "state": c["state"], "deadline": c["deadline"]}
                for c in (requests.get(i) for i in p["checkpoints"]) if c is not None]
        out.append({"node": p["node"], "action": p["action"], "since": p["since"],
                    "reason": p["reason"], "jobs": jobs})
    return out


def _automation_status(settings: Settings, store: Store) -> dict[str, Any] | str | None:
    """The automation's status (breaker, held, lemons) if the database holds its state; a
    message when that state is unreadable; None when there is no automation."""
    try:
        if store.automation_version() is None:
            return None
        return _automation(settings, store=store, read_only=True).status()
    except Exception as exc:  # unreadable state: say so, the fleet table still stands
        return f"automation: state unreadable ({type(exc).__name__}: {exc})"


def _ladders(store: Store) -> dict[str, LadderStatus]:
    """Each open remediation ladder's status (none where the database has no ladders)."""
    from slurmgpu.collector.store.remediation import load_ladders
    from slurmgpu.remediation.ladder import from_json
    from slurmgpu.remediation.status import ladder_status

    try:
        kept = load_ladders(store.db)
    except Exception:  # (a database before schema 14, or unreadable: no ladder to show)
        return {}
    out = {}
    for node, data in kept.items():
        with contextlib.suppress(ValueError):
            out[node] = ladder_status(from_json(data))
    return out


def ladders_of(config_file: str | None) -> dict[str, LadderStatus]:
    """The open ladders' status from the fleet database the config names (`slurmgpu
    nodes`); none when it is not here."""
    from slurmgpu.collector.store import Store

    try:
        found = fleet_db(load_settings(config_file), None)
        if not found.exists():
            return {}
        store = Store(found.path)
    except Exception:  # (no database here: nothing to show)
        return {}
    try:
        return _ladders(store)
    finally:
        store.close()


def automation_status_of(config_file: str | None) -> dict[str, Any] | None:
    """The automation's status from the fleet database the config names, if it is here
    and readable (`slurmgpu nodes` runs anywhere: no database, no automation knowledge)."""
    from slurmgpu.collector.store import Store

    try:
        loaded = load_settings(config_file)
        found = fleet_db(loaded, None)
        if not found.exists():
            return None
        store = Store(found.path)
    except Exception:  # an unreadable database: the outlook says what it can without it
        return None
    try:
        status = _automation_status(loaded.settings, store)
    finally:
        store.close()
    return status if isinstance(status, dict) else None


def _breaker_text(status: dict[str, Any]) -> str:
    if status["breaker_open"]:
        state = (f"OPEN since {_age(time.time() - status['since']) if status['since'] else '?'} "
                 f"(opened on: {status['why']})")
        if status["held"]:
            state += f"; {len(status['held'])} drain(s) held"
    else:
        state = "closed"
    lemons = ", ".join(sorted(status["lemons"])) or "none"
    dry = " (dry run)" if status.get("dry_run") else ""
    return f"automation{dry}: breaker {state}; {_drained_now(status)}; lemons: {lemons}"


def _drained_now(status: dict[str, Any]) -> str:
    """``now 3 of 4 nodes drained (automation: gpu-n1, gpu-n2; prolog: gpu-n3)``."""
    drained: dict[str, str] = status.get("drained_now") or {}
    by: dict[str, list[str]] = {}
    for node, who in sorted(drained.items()):
        by.setdefault(who, []).append(node)
    who_text = "; ".join(f"{who}: {', '.join(nodes)}" for who, nodes in sorted(by.items()))
    return f"now {len(drained)} of {status.get('fleet', '?')} nodes drained" + (f" ({who_text})" if by else "")


# --------------------------------------------------------------------------- breaker


@click.group("breaker")
def breaker() -> None:
    """The automation's circuit breaker (state in the collector's database)."""


_JSON = json_option("JSON output.")


# `slurmgpu breaker` exit statuses (besides 3: bad config, unreadable database).
EXIT_NO_STATE = 4
_EXIT_HELP = """
    \b
    Exit status:
      0  the state was read (the breaker may be open or closed: see the output)
      3  bad config, or a database that cannot be read or written
      4  no breaker state in the database found (wrong config, or no collector
         with [automation] enabled has run with it yet)
    """


def _open_store(found: FleetDb) -> Store:
    """The database (exit 3 when it cannot be opened: unreadable, damaged, too new; a
    StoreError, a SlurmGpuError, says so itself)."""
    from slurmgpu.collector.store import Store

    try:
        return Store(found.path)
    except (OSError, sqlite3.Error) as exc:
        raise CliError(f"{found.path}: {exc}") from None


def _no_state(found: FleetDb, settings: Settings) -> str:
    """Exit 4's line: the database found, where its path came from, and an automation.json
    of an older slurmgpu that the collector has not imported yet."""
    from slurmgpu.collector.policy import legacy_state_file
    from slurmgpu.config import load as config_load

    source = found.source
    if source == "the built-in default":
        source += f" (no {config_load.DEFAULT_PATH})"
    text = (f"no breaker state in {found.path} (is the collector running with [automation] "
            f"enabled?); the database from {source}")
    legacy = legacy_state_file(settings.paths.state_dir)
    if legacy.is_file():
        text += f"; {legacy} is not imported yet (the collector imports it at its next start)"
    return text


@contextlib.contextmanager
def _breaker_state(config_file: str | None, db: str | None) -> Iterator[tuple[Automation, dict[str, Any]]]:
    """The collector's automation state, found the way the collector finds it: its
    database (--db > $SLURMGPU_DB > [collector] db of the config). No database there, or
    one that holds no automation state, is never "closed": one error line naming the
    database and where its path came from, exit ``EXIT_NO_STATE``."""
    loaded = load_settings(config_file)
    settings = loaded.settings
    found = fleet_db(loaded, db)
    store = _open_store(found) if found.exists() else None
    if store is None or store.automation_version() is None:
        if store is not None:
            store.close()
        raise CliError(_no_state(found, settings), exit_code=EXIT_NO_STATE)
    with contextlib.closing(store):
        yield _automation(settings, store=store, read_only=True), {"db": found.path,
                                                                     "config": loaded.config.path}


def _operator() -> str:
    """Who runs the command (the sudo caller, not root), for the decisions' record."""
    import getpass
    import os

    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except Exception:  # no user name for this uid
        return "operator"


def _forecast_lines(forecast: dict[str, Any]) -> list[str]:
    lines = [f"would trip again: {'YES' if forecast['would_trip'] else 'no'}"]
    for rule in forecast["rules"]:
        table, _, key = rule["setting"].partition(".")
        mark = "trips again" if rule["trips_again"] else "ok"
        lines.append(f"  {rule['rule']} ({mark}; [{table}] {key}): {rule['text']}")
    return lines


def _show(status: dict[str, Any], where: dict[str, Any], forecast: dict[str, Any]) -> None:
    click.echo(_breaker_text(status))
    for held in status["held"]:
        click.echo(f"  held: {held['node']} {held.get('action', '')}: {held.get('reason', '')}")
    for rel in status["released"]:
        click.echo(f"  released by {rel.get('released_by', '?')}, not carried out yet: {rel['node']} "
                   f"{rel.get('action', '')}: {rel.get('reason', '')}")
    for node, lemon in sorted(status["lemons"].items()):
        click.echo(f"  lemon: {node}: {lemon.get('why', '')}")
    if status["breaker_open"] or status["held"] or status["released"]:
        click.echo("if released:" if status["breaker_open"] or status["held"] else "after the released drains:")
        for line in _forecast_lines(forecast):
            click.echo(f"  {line}")
    click.echo(f"state: {where['db']} (config: {where['config'] or 'built-in defaults'})")


@breaker.command("status", epilog=_EXIT_HELP)
@config_option
@db_option
@_JSON
def breaker_status(config_file: str | None, db: str | None, as_json: bool) -> None:
    """Show the breaker (open/closed, why), held drains, lemon nodes, and whether
    releasing it now would trip it again (and which setting decides).

    The state is in the collector's database, found as the collector finds it: --db,
    else $SLURMGPU_DB, else [collector] db of the config (--config, else
    $SLURMGPU_CONFIG, else /etc/slurmgpu/slurmgpu.toml, else the built-in defaults).
    The output names the database read."""
    with _breaker_state(config_file, db) as (auto, where):
        status, forecast = auto.status(), auto.forecast()
    if as_json:
        click.echo(json.dumps(dict(status, **where, forecast=forecast), indent=2, sort_keys=True))
        return
    _show(status, where, forecast)


@breaker.command("release", epilog=_EXIT_HELP)
@config_option
@db_option
@_JSON
def breaker_release(config_file: str | None, db: str | None, as_json: bool) -> None:
    """Close the breaker and let the drains it holds now proceed, once.

    The collector carries them out at its next loop turn whatever the breaker says by
    then (their decisions record who released them); jobs on those nodes that were
    already asked to checkpoint are not asked again. The output says whether the next
    drain (or the drained nodes' next reports, for a storm) would trip the breaker
    again, and which [automation] setting decides. The database is found as for
    `slurmgpu breaker status`; the release is one transaction in it, which the running
    collector sees at its next loop turn."""
    with _breaker_state(config_file, db) as (auto, where):
        by = _operator()
        try:
            released = auto.release(by=by)
        except sqlite3.Error as exc:  # e.g. locked past the busy timeout
            raise CliError(f"{auto.store.where}: {exc}") from None
        status, forecast = auto.status(), auto.forecast()
    if as_json:
        click.echo(json.dumps(dict(status, **where, released_by=by, released_now=released,
                                   forecast=forecast), indent=2, sort_keys=True))
        return
    if released:
        click.echo(f"released by {by}: {len(released)} held drain(s) proceed once "
                   "(the collector carries them out at its next loop turn):")
        for rel in released:
            click.echo(f"  {rel['node']} {rel.get('action', '')}: {rel.get('reason', '')}")
    else:
        click.echo(f"released by {by}: no drain was held")
    for line in _forecast_lines(forecast):
        click.echo(line)
    click.echo(_breaker_text(status))
    click.echo(f"state: {where['db']} (config: {where['config'] or 'built-in defaults'})")


# --------------------------------------------------------------------------- lemon


@click.group("lemon")
def lemon() -> None:
    """Lemon nodes: drained too often, kept drained until an operator clears them."""


def _lemon_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"node": node, "since": info.get("since"), "why": info.get("why")}
            for node, info in sorted(status["lemons"].items())]


@contextlib.contextmanager
def _lemon_automation(config_file: str | None, db: str | None) -> Iterator[Automation | None]:
    """The automation's state in the collector's database, found as for `slurmgpu breaker`;
    None when there is no database (no lemons; nothing is created)."""
    loaded = load_settings(config_file)
    found = fleet_db(loaded, db)
    if not found.exists():
        yield None
        return
    with contextlib.closing(_open_store(found)) as store:
        yield _automation(loaded.settings, store=store, read_only=True)


@lemon.command("list")
@config_option
@db_option
@_JSON
def lemon_list(config_file: str | None, db: str | None, as_json: bool) -> None:
    """List lemon nodes: node, since when, why."""
    with _lemon_automation(config_file, db) as auto:
        rows = _lemon_rows(auto.status()) if auto is not None else []
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no lemon nodes")
        return
    now = time.time()
    for row in rows:
        since = _age(now - row["since"]) if row["since"] else "?"
        click.echo(f"{row['node']}  since {since}  {row['why'] or ''}")


@lemon.command("clear")
@click.argument("node")
@config_option
@db_option
@_JSON
def lemon_clear(node: str, config_file: str | None, db: str | None, as_json: bool) -> None:
    """Forget that NODE is a lemon (it was repaired): its drain history starts afresh.

    Exit 1, state unchanged, when NODE is not a lemon. The node stays drained: resume it
    with `slurmgpu resume NODE` once it is back in shape. The change is one transaction
    in the collector's database (found as for `slurmgpu breaker`)."""
    with _lemon_automation(config_file, db) as auto:
        info = auto.status()["lemons"].get(node) if auto is not None else None
        if auto is None or info is None:
            raise CliError(f"{node} is not a lemon", exit_code=1)
        try:
            auto.clear_lemon(node)
        except sqlite3.Error as exc:  # e.g. locked past the busy timeout
            raise CliError(f"{auto.store.where}: {exc}") from None
    if as_json:
        click.echo(json.dumps({"node": node, "cleared": True, "since": info.get("since"),
                               "why": info.get("why")}, indent=2, sort_keys=True))
    else:
        click.echo(f"{node}: lemon cleared")
