"""The report model -> Markdown (chat, email): the same content as tables and lists,
charts as text bars."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slurmgpu.report import SECTIONS, TITLES
from slurmgpu.report import sections as shared
from slurmgpu.report.render_util import duration, hours, num, pct, per, when
from slurmgpu.report.sections import (
    MTBF_HEADERS,
    NO_OUTCOMES,
    RETURN_HEADERS,
    VERDICT_HEADERS,
    Renderers,
    mtbf_rows,
    return_rows,
    validation_runs,
    verdict_rows,
)

BAR_WIDTH = 20


# Text from nodes (drain reasons, versions, messages) ends up in the mail body: no raw
# HTML (a <script>, an <img onerror>) and no link or code syntax ([x](javascript:...)),
# with Markdown's backslash escapes, never HTML entities: a plain-text mail shows the
# text as written ("-> reboot", not "-&gt; reboot"), a "<" only with a backslash.
_MARKUP = str.maketrans({"<": "\\<", "[": "\\[", "]": "\\]", "`": "\\`"})


def cell(value: Any) -> str:
    """A table cell (or inline text from a node): no newlines, pipes, HTML or links."""
    text = "-" if value is None or value == "" else str(value)
    text = " ".join(text.split()).replace("\\", "\\\\").replace("|", "\\|")
    return text.translate(_MARKUP)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def bars(items: Sequence[tuple[str, float, str]]) -> str:
    """Text bars in a code block: ``label  ██████ text``."""
    if not items:
        return ""
    top = max(v for _, v, _ in items) or 1
    width = min(30, max(len(label) for label, _, _ in items))
    lines = []
    for label, value, text in items:
        label, text = label.replace("`", "'"), text.replace("`", "'")  # cannot end the code block
        n = round(BAR_WIDTH * value / top) if value > 0 else 0
        lines.append(f"{label[:width]:<{width}}  {'█' * max(n, 1 if value > 0 else 0):<{BAR_WIDTH}} {text}")
    return "```\n" + "\n".join(lines) + "\n```\n"


renders = Renderers()


@renders("summary")
def _summary(m: dict[str, Any]) -> str:
    s = m["summary"]
    items = [
        ("nodes", num(s["nodes"])),
        ("fleet availability (healthy node-hours)", pct(s["availability_pct"])),
        ("drains started", num(s["drains"])),
        ("drained at window end", num(s["drained_at_end"])),
        ("new failures (FAIL/WARN findings)", f"{num(s['new_failures'])} on {s['failing_nodes']} nodes"),
        ("XID events", f"{num(s['xids'])} on {s['xid_nodes']} nodes"),
        ("GPUs with rising ECC / remaps", num(s["gpus_ecc_rising"])),
        ("jobs checkpointed / requeued / blocked by the prolog",
         f"{s['jobs_checkpointed']} / {s['jobs_requeued']} / {s['jobs_prolog_blocked']}"),
        ("nodes off their version pins", shared.off_pin_count(s["nodes_off_pin"])),
        ("lemon nodes", num(s["lemons"])),
        ("nodes due for service", num(s["due_for_service"])),
    ]
    return "".join(f"- **{label}**: {cell(value)}\n" for label, value in items)


@renders("availability")
def _availability(m: dict[str, Any]) -> str:
    a = m["availability"]
    cats = ("healthy", "degraded", "drained", "unreachable")
    rows = [[h["name"], h["nodes"], hours(h["node_hours"]), *(hours(h[f"{c}_h"]) for c in cats),
             pct(h["availability_pct"])] for h in a["host_sets"]]
    f = a["fleet"]
    rows.append(["**fleet**", f["nodes"], hours(f["node_hours"]),
                 *(hours(f[f"{c}_h"]) for c in cats), pct(f["availability_pct"])])
    series = []
    for b in a["series"]:
        observed = sum(b[f"{c}_h"] for c in cats)
        share = 100 * b["healthy_h"] / observed if observed > 0 else 0.0
        series.append((when(b["start"]), share,
                       f"{pct(share)} healthy" if observed > 0 else "no node observed"))
    chart = bars(series) if any(b[f"{c}_h"] for b in a["series"] for c in cats) \
        else "_no node-hours observed in the window_\n"
    return (table(["host set", "nodes", "node-hours", "healthy", "degraded", "drained",
                   "unreachable", "available"], rows)
            + f"\nHealthy share per {per(a['bucket_s'])}:\n\n" + chart)


@renders("drains")
def _drains(m: dict[str, Any]) -> str:
    d = m["drains"]
    by = ", ".join(f"{k}: {v}" for k, v in sorted(d["by"].items())) or "none"
    return (f"{d['count']} drains started on {d['nodes']} nodes ({by}); "
            f"{d['ongoing_at_end']} still drained at the window's end.\n\n"
            + table(["node", "start", "end", "duration", "who", "reason", "resumed"],
                    [[r["node"], when(r["start"]) + ("" if r["started_in_window"] else " (before)"),
                      "still drained" if r["still_drained"] else when(r["end"]),
                      duration(r["duration_s"]), r["drained_by"], r["reason"],
                      "yes" if r["resumed"] else "no"] for r in d["drains"]]))


@renders("failures")
def _failures(m: dict[str, Any]) -> str:
    f = m["failures"]
    return (f"{f['total']} findings ({f['fail']} FAIL, {f['warn']} WARN) on {f['nodes']} nodes.\n\n"
            + table(["check", "severity", "findings", "nodes"],
                    [[r["check_id"], r["severity"], r["count"], r["nodes"]] for r in f["by_check"]])
            + ("\nNodes with the most findings:\n\n" + table(
                ["node", "findings", "FAIL", "checks"],
                [[t["node"], t["count"], t["fail"],
                  ", ".join(f"{c['check_id']} x{c['count']}" for c in t["checks"])]
                 for t in f["top_nodes"]]) if f["top_nodes"] else ""))


@renders("xids")
def _xids(m: dict[str, Any]) -> str:
    x = m["xids"]
    return (f"{x['total']} XID events on {x['nodes']} nodes.\n\n"
            + table(["XID", "meaning (NVIDIA)", "action", "events", "nodes", "top nodes"],
                    [[c["xid"], c["meaning"], c["action"], c["count"], c["nodes"],
                      ", ".join(f"{t['node']} ({t['count']})" for t in c["top_nodes"][:5])]
                     for c in x["codes"]])
            + bars([(f"XID {c['xid']}", c["count"], str(c["count"])) for c in x["codes"][:15]]))


@renders("ecc-trends")
def _ecc_trends(m: dict[str, Any]) -> str:
    c = m["ecc-trends"]
    return (f"{c['gpus_rising']} GPUs whose ECC or row-remap counters rose in the window.\n\n"
            + table(["node", "GPU", "serial", "ECC corr +", "ECC uncorr +", "remap corr +",
                     "remap uncorr +", "flags"],
                    [[g["node"], g["gpu"], g["serial"], *(g["rise"][k] for k in (
                        "ecc_corrected", "ecc_uncorrected", "remap_corrected", "remap_uncorrected")),
                      ", ".join(k for k in ("remap_pending", "remap_failure") if g[k])]
                     for g in c["gpus"]])
            + "\nRow-remap pending / failed at the window's end:\n\n"
            + table(["node", "GPU", "serial", "flag", "since"],
                    [[f["node"], f["gpu"], f["serial"],
                      "remap failure" if f["remap_failure"] else "remap pending", when(f["since"])]
                     for f in c["remap_flags"]]))


@renders("throttling")
def _throttling(m: dict[str, Any]) -> str:
    t = m["throttling"]
    out = (f"Fleet: HW slowdown in {pct(t['hw_slowdown_pct'])} of {num(t['reports'])} reports, "
           f"SW thermal in {pct(t['sw_thermal_pct'])}; {t['nodes_throttled']} of "
           f"{t['nodes_sampled']} sampled nodes throttled at all.\n")
    for key, label, col in (("leaders_hw", "HW slowdown leaders", "hw_slowdown"),
                            ("leaders_sw", "SW thermal leaders", "sw_thermal")):
        out += f"\n{label}:\n\n" + (bars([(r["node"], r[f"{col}_pct"], pct(r[f"{col}_pct"]))
                                          for r in t[key]]) or "_none_\n")
    return out


@renders("ib")
def _ib(m: dict[str, Any]) -> str:
    b = m["ib"]
    return (f"{b['ports_rising']} ports with rising error counters, {b['ports_flapping']} with "
            "link-flap findings.\n\n"
            + table(["node", "port", "counters risen", "flap findings", "state"],
                    [[p["node"], p["port"],
                      ", ".join(f"{k} +{v}" for k, v in sorted(p["rise"].items())),
                      p["flap_findings"], p["state"]] for p in b["ports"]]))


@renders("pin-drift")
def _pin_drift(m: dict[str, Any]) -> str:
    p = m["pin-drift"]
    out = (f"{shared.off_pin_count(p['nodes_off_pin'])} nodes off their [pins] "
           f"({cell(', '.join(p['off_pin_nodes']) or 'none')}; versions: **OFF-PIN**). "
           f"Judged {p['judged']}.\n")  # (slurmgpu's own words: not escaped)
    if p["by_nodes"]:
        out += "\n" + table(["off-pin node", "check", "severity", "message (the node's own check)"],
                            shared.pin_finding_rows(p["by_nodes"]))
    for name, f in p["fields"].items():
        out += f"\n**{name}** ({f['pin_key']}; {f['not_reported']} nodes not reported)\n\n"
        out += table(["version", "nodes", "off-pin nodes"],
                     [[(f"**{v['version']}** OFF-PIN" if v["off_pin"] else v["version"]),
                       v["nodes"], v["off_pin"]] for v in f["versions"]])
        if f["off_pin"]:
            out += "\n" + "".join(f"- OFF-PIN {cell(o['node'])}: {cell(o['version'])} "
                                  f"(pins: {cell(', '.join(o['pins']))})\n" for o in f["off_pin"])
    return out


@renders("service")
def _service(m: dict[str, Any]) -> str:
    s = m["service"]
    due = "".join(f"- {cell(d['node'])}{' (lemon)' if d['lemon'] else ''}: "
                  f"{cell('; '.join(d['reasons']))}\n" for d in s["due"]) or "_none_\n"
    lemons = "".join(f"- {cell(x['node'])} since {when(x['since'])}: {cell(x['why'])}\n"
                     for x in s["lemons"]) or "_none_\n"
    err = f"\n_automation state unreadable: {cell(s['lemons_error'])}_\n" if s["lemons_error"] else ""
    return f"Due for service:\n\n{due}\nLemon nodes:\n\n{lemons}{err}"


@renders("jobs")
def _jobs(m: dict[str, Any]) -> str:
    j = m["jobs"]
    pb, ck, rq, ack = j["prolog_blocked"], j["checkpoints"], j["requeued"], j["ack"]
    return table(["", "count", "detail"], [
        ["jobs blocked by the prolog", pb["jobs"], f"{pb['events']} events on {pb['nodes']} nodes"],
        ["jobs asked to checkpoint", ck["jobs"], f"{ck['requests']} requests"],
        ["jobs requeued", rq["jobs"],
         f"{rq['prolog_jobs']} refused by the prolog (Slurm requeues them), "
         f"{rq['checkpoint_jobs']} requeued after a checkpoint ({rq['events']} requeue events)"],
        ["checkpoint acks", ack["count"], f"median {num(ack['p50_s'])} s, max {num(ack['max_s'])} s"],
        ["requests never acked", ack["no_ack"], f"{ack['open']} still open"],
    ])


@renders("mtbf")
def _mtbf(m: dict[str, Any]) -> str:
    return table(MTBF_HEADERS, mtbf_rows(m))


@renders("verdict_quality")
def _verdict_quality(m: dict[str, Any]) -> str:
    q = m["verdict_quality"]
    if q["source"] is None:
        return f"_{NO_OUTCOMES}_\n"
    return (table(VERDICT_HEADERS, verdict_rows(q["checks"])) + "\nBy GPU model:\n\n"
            + table(VERDICT_HEADERS, verdict_rows(q["by_gpu_model"])))


@renders("return-to-service")
def _return_to_service(m: dict[str, Any]) -> str:
    r = m["return-to-service"]
    if r["source"] is None:
        return f"_{NO_OUTCOMES}_\n"
    return (table(RETURN_HEADERS, return_rows(r["steps"]))
            + f"\nValidations run: {cell(validation_runs(r['validations']))}\n")


_RENDER = renders.complete()


def render(model: dict[str, Any]) -> str:
    w = model["window"]
    head = (f"# Fleet health report\n\nWindow {when(w['from_ts'])} → {when(w['to_ts'])} "
            f"({duration(w['seconds'])}), generated {model['generated_at']} (UTC).\n")
    return head + "".join(f"\n## {TITLES[s]}\n\n{_RENDER[s](model)}" for s in SECTIONS)
