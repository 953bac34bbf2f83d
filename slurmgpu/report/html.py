"""The report model -> one self-contained HTML page.

No network, no JavaScript: inline CSS (phone-friendly, print-friendly) and inline SVG
charts drawn here. Every string that came from the database goes through ``e()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from slurmgpu.report import SECTIONS, TITLES
from slurmgpu.report import sections as shared
from slurmgpu.report.render_util import axis, day, duration, hours, num, pct, per, tick, when
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

COLORS = {"healthy": "#2e9d57", "degraded": "#e0a100", "drained": "#c8453c",
          "unreachable": "#8c8c8c"}
ACCENT = "#3b6fb6"
WARN = "#e0a100"
BAD = "#c8453c"

CSS = """
:root{--fg:#1d232b;--muted:#5f6b7a;--line:#dde3ea;--bg:#fff;--panel:#f6f8fa;
--ok:#2e9d57;--warn:#e0a100;--bad:#c8453c;--grey:#8c8c8c;--accent:#3b6fb6}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:1100px;margin:0 auto;padding:12px 16px 40px}
header{border-bottom:3px solid var(--accent);margin-bottom:8px}
h1{font-size:1.5em;margin:.4em 0 .1em}
h2{font-size:1.2em;margin:0 0 .5em;padding-bottom:.2em;border-bottom:1px solid var(--line)}
h3{font-size:1em;margin:1em 0 .4em}
.meta{color:var(--muted);font-size:.9em;margin:0 0 .6em}
nav{font-size:.85em;margin:.4em 0 1em}
nav a{display:inline-block;margin:0 .6em .3em 0;color:var(--accent);text-decoration:none}
section{margin:1.6em 0;padding:0}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px}
.card{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:8px 12px}
.card b{display:block;font-size:1.45em;line-height:1.2}
.card span{color:var(--muted);font-size:.82em}
.card.bad b{color:var(--bad)} .card.warn b{color:#9a6d00} .card.ok b{color:var(--ok)}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;margin:.3em 0 .8em}
table{border-collapse:collapse;min-width:100%;font-size:.88em}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top;
white-space:nowrap}
td.wrap{white-space:normal;min-width:16em}
th{background:var(--panel);font-weight:600}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
tr.off td{background:#fdecea}
.tag{display:inline-block;padding:0 6px;border-radius:9px;font-size:.8em;color:#fff;background:var(--grey)}
.tag.automation{background:var(--accent)} .tag.hook{background:#6a51a3} .tag.operator{background:#1f7a7a}
.tag.outside{background:var(--grey)} .tag.slurmgpu{background:#b0b0b0;color:#222}
.tag.FAIL,.tag.bad{background:var(--bad)} .tag.WARN{background:var(--warn);color:#222}
.empty{color:var(--muted);font-style:italic}
.legend{font-size:.82em;color:var(--muted);margin:.2em 0}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;border-radius:2px}
svg{max-width:100%;height:auto;display:block}
svg text{font:11px sans-serif;fill:#333}
.spark{display:inline-block;vertical-align:middle}
footer{color:var(--muted);font-size:.8em;border-top:1px solid var(--line);padding-top:.6em}
@media (max-width:600px){body{font-size:14px}main{padding:8px}.card b{font-size:1.2em}}
@media print{nav{display:none}main{max-width:none;padding:0}section{break-inside:avoid-page}
.scroll{overflow:visible}table{font-size:9pt}th,td{white-space:normal}
tr.off td{background:#eee}a{color:inherit;text-decoration:none}}
"""


def e(value: Any) -> str:
    """Escape any value for HTML text or attributes."""
    return escape("" if value is None else str(value), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Sequence[int] = (),
           wrap: Sequence[int] = (), row_class: Callable[[int], str] | None = None) -> str:
    """Cells are escaped unless they are ``_Raw``."""
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(f'<th class="n">{e(h)}</th>' if i in numeric else f"<th>{e(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cls = row_class(r) if row_class else ""
        cells = []
        for i, cell in enumerate(row):
            text = cell.html if isinstance(cell, _Raw) else e(cell)
            klass = "n" if i in numeric else ("wrap" if i in wrap else "")
            cells.append(f'<td class="{klass}">{text}</td>' if klass else f"<td>{text}</td>")
        body.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>" if cls
                    else "<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>'
            + "".join(body) + "</tbody></table></div>")


class _Raw:
    """Pre-escaped HTML for a table cell."""

    def __init__(self, html: str) -> None:
        self.html = html


def _tag(text: str, cls: str) -> _Raw:
    return _Raw(f'<span class="tag {e(cls)}">{e(text)}</span>')


# --------------------------------------------------------------------------- charts


def _no_data(text: str) -> str:
    return f'<p class="empty">{e(text)}</p>'


def hbars(items: Sequence[tuple[str, float, str]], *, color: str = ACCENT, title: str = "",
          empty: str = "no data in the window") -> str:
    """Horizontal bars: (label, value, value text) per row; ``empty`` when there is none."""
    if not items:
        return _no_data(empty)
    top = max((v for _, v, _ in items), default=0) or 1
    row_h, label_w, bar_w, text_w = 20, 170, 300, 80
    width = label_w + bar_w + text_w
    height = row_h * len(items) + 4
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" role="img" '
             f'aria-label="{e(title)}"><title>{e(title)}</title>']
    for i, (label, value, text) in enumerate(items):
        y = i * row_h + 2
        w = max(1.0, bar_w * value / top) if value > 0 else 0
        short = label if len(label) <= 26 else label[:25] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{e(short)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row_h - 6}" '
                     f'rx="2" fill="{color}"><title>{e(label)}: {e(text)}</title></rect>'
                     f'<text x="{label_w + w + 5:.1f}" y="{y + 13}">{e(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def vbars(items: Sequence[tuple[str, float, str]], *, color: str = ACCENT, title: str = "",
          empty: str = "no data in the window") -> str:
    """Vertical bars (a histogram): (label, value, value text) per bar; ``empty`` when
    there is none."""
    if not items:
        return _no_data(empty)
    top = max((v for _, v, _ in items), default=0) or 1
    bar, gap, plot_h, base = 34, 10, 120, 150
    width = max(200, len(items) * (bar + gap) + gap)
    parts = [f'<svg viewBox="0 0 {width} {base + 22}" width="{width}" role="img" '
             f'aria-label="{e(title)}"><title>{e(title)}</title>'
             f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#bbb"/>']
    for i, (label, value, text) in enumerate(items):
        x = gap + i * (bar + gap)
        h = max(1.0, plot_h * value / top) if value > 0 else 0
        parts.append(f'<rect x="{x}" y="{base - h:.1f}" width="{bar}" height="{h:.1f}" rx="2" '
                     f'fill="{color}"><title>{e(label)}: {e(text)}</title></rect>'
                     f'<text x="{x + bar / 2}" y="{base - h - 4:.1f}" text-anchor="middle">'
                     f'{e(text)}</text>'
                     f'<text x="{x + bar / 2}" y="{base + 15}" text-anchor="middle">{e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked(series: Sequence[dict[str, Any]], bucket_s: float) -> str:
    """Per bucket, the node-hours that were not healthy (degraded, unreachable, drained)
    stacked; healthy, the rest, would flatten everything else and is in the tooltip. The
    value axis is scaled to the data (``render_util.axis``: node-hours, -minutes or
    -seconds); a window with nothing to draw says so instead."""
    order = ("degraded", "unreachable", "drained")
    if not series or not any(b[f"{c}_h"] for b in series for c in (*order, "healthy")):
        return _no_data("no node-hours observed in the window")
    totals = [sum(b[f"{c}_h"] for c in order) for b in series]
    if not any(totals):
        return _no_data("no unavailable node-hours in the window")
    top, scale, unit = axis(max(totals))
    n = len(series)
    left, plot_h, base = 56, 140, 166
    step = max(8.0, min(40.0, 700 / n))
    bar = step * 0.8
    width = int(left + n * step + 10)
    title = f"unavailable node-hours per {per(bucket_s)}"
    parts = [f'<svg viewBox="0 0 {width} {base + 24}" width="{width}" role="img" '
             f'aria-label="{e(title)}"><title>{e(title)}</title>',
             f'<text x="{left - 4}" y="10" text-anchor="end">{e(unit)}</text>',
             f'<line x1="{left}" y1="{base - plot_h}" x2="{width}" y2="{base - plot_h}" '
             'stroke="#eee"/>',
             f'<line x1="{left}" y1="{base}" x2="{width}" y2="{base}" stroke="#bbb"/>',
             f'<text x="{left - 4}" y="{base - plot_h + 4}" text-anchor="end">'
             f'{e(tick(top / scale))}</text>',
             f'<text x="{left - 4}" y="{base}" text-anchor="end">0</text>']
    every = max(1, int(n / 12 + 0.999))
    for i, b in enumerate(series):
        x = left + i * step + (step - bar) / 2
        y = float(base)
        tip = ", ".join(f"{c} {hours(b[f'{c}_h'])}" for c in ("healthy", *order))
        for c in order:
            h = plot_h * b[f"{c}_h"] / top
            if h <= 0:
                continue
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS[c]}"><title>{e(when(b["start"]))}: {e(tip)}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{base + 15}" text-anchor="middle">'
                         f'{e(day(b["start"], bucket_s))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def sparkline(points: Sequence[Sequence[float]], *, label: str = "", width: int = 140,
              height: int = 28) -> str:
    """A polyline of (ts, value) points, scaled to the box."""
    if len(points) < 2:
        return ""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    sx = (width - 4) / ((x1 - x0) or 1)
    sy = (height - 4) / ((y1 - y0) or 1)
    coords = " ".join(f"{2 + (x - x0) * sx:.1f},{height - 2 - (y - y0) * sy:.1f}" for x, y in zip(xs, ys, strict=True))
    return (f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
            f'<title>{e(label)} {e(num(int(ys[0])))} \u2192 {e(num(int(ys[-1])))}</title>'
            f'<polyline points="{coords}" fill="none" stroke="{BAD}" stroke-width="1.5"/></svg>')


# --------------------------------------------------------------------------- sections


def _cards(items: Sequence[tuple[str, str, str]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card {e(cls)}"><b>{e(value)}</b><span>{e(label)}</span></div>'
        for value, label, cls in items) + "</div>"


renders = Renderers()


@renders("summary")
def _summary(m: dict[str, Any]) -> str:
    s = m["summary"]
    avail = s["availability_pct"]
    avail_cls = "" if avail is None else ("ok" if avail >= 95 else ("warn" if avail >= 85 else "bad"))

    def bad(v: int | None) -> str:
        return "warn" if v is None else "bad" if v else "ok"

    return _cards([
        (num(s["nodes"]), "nodes", ""),
        (pct(avail), "fleet availability (healthy node-hours)", avail_cls),
        (num(s["drains"]), "drains started", "warn" if s["drains"] else "ok"),
        (num(s["drained_at_end"]), "drained at window end", "warn" if s["drained_at_end"] else "ok"),
        (num(s["new_failures"]), f"new failures on {s['failing_nodes']} nodes",
         "warn" if s["new_failures"] else "ok"),
        (num(s["xids"]), f"XIDs on {s['xid_nodes']} nodes", "warn" if s["xids"] else "ok"),
        (num(s["gpus_ecc_rising"]), "GPUs with rising ECC/remaps", "warn" if s["gpus_ecc_rising"] else "ok"),
        (num(s["jobs_checkpointed"]), "jobs checkpointed", ""),
        (num(s["jobs_requeued"]), "jobs requeued", ""),
        (num(s["jobs_prolog_blocked"]), "jobs blocked by the prolog", ""),
        (shared.off_pin_count(s["nodes_off_pin"]), "nodes off their version pins", bad(s["nodes_off_pin"])),
        (num(s["lemons"]), "lemon nodes", bad(s["lemons"])),
        (num(s["due_for_service"]), "nodes due for service", bad(s["due_for_service"])),
    ])


@renders("availability")
def _availability(m: dict[str, Any]) -> str:
    a = m["availability"]
    cats = ("healthy", "degraded", "drained", "unreachable")
    legend = '<p class="legend">' + "".join(
        f'<i style="background:{COLORS[c]}"></i>{e(c)}' for c in ("degraded", "unreachable",
                                                                  "drained")) + "</p>"
    rows = [[h["name"], h["nodes"], h["node_hours"], *(h[f"{c}_h"] for c in cats),
             pct(h["availability_pct"])] for h in a["host_sets"]]
    f = a["fleet"]
    rows.append([_Raw("<b>fleet</b>"), f["nodes"], f["node_hours"], *(f[f"{c}_h"] for c in cats),
                 pct(f["availability_pct"])])
    out = [f"<h3>Unavailable node-hours per {e(per(a['bucket_s']))}</h3>", legend,
           stacked(a["series"], a["bucket_s"]), "<h3>Per host set</h3>",
           _table(["host set", "nodes", "node-hours", "healthy", "degraded", "drained",
                   "unreachable", "available"],
                  [[r[0], r[1], *(hours(v) for v in r[2:7]), r[7]] for r in rows],
                  numeric=range(1, 8))]
    if a["worst_nodes"]:
        out += ["<h3>Least available nodes</h3>",
                _table(["node", "degraded", "drained", "unreachable", "healthy"],
                       [[w["node"], hours(w["degraded_h"]), hours(w["drained_h"]),
                         hours(w["unreachable_h"]), hours(w["healthy_h"])]
                        for w in a["worst_nodes"]],
                       numeric=range(1, 5))]
    return "".join(out)


@renders("drains")
def _drains(m: dict[str, Any]) -> str:
    d = m["drains"]
    by = ", ".join(f"{k}: {v}" for k, v in sorted(d["by"].items())) or "none"
    rows = [[r["node"], when(r["start"]) + ("" if r["started_in_window"] else " (before window)"),
             "still drained" if r["still_drained"] else when(r["end"]), duration(r["duration_s"]),
             _tag(r["drained_by"], r["by"]), r["reason"] or "", "yes" if r["resumed"] else "no"]
            for r in d["drains"]]
    more = f'<p class="meta">{d["truncated"]} older drains left out</p>' if d["truncated"] else ""
    return (f'<p class="meta">{d["count"]} drains started in the window on {d["nodes"]} nodes '
            f"({e(by)}); {d['ongoing_at_end']} still drained at the window's end.</p>"
            + _table(["node", "start", "end", "duration", "who", "reason", "resumed"], rows,
                     wrap=(5,)) + more)


@renders("failures")
def _failures(m: dict[str, Any]) -> str:
    f = m["failures"]
    bars = hbars([(f"{r['check_id']} {r['severity']}", r["count"], num(r["count"]))
                  for r in f["by_check"][:10]], color=BAD, title="findings by check",
                 empty="no FAIL or WARN findings in the window")
    if not f["by_check"]:  # the chart said so
        return f'<p class="meta">{f["total"]} findings on {f["nodes"]} nodes.</p>' + bars
    return (f'<p class="meta">{f["total"]} findings ({f["fail"]} FAIL, {f["warn"]} WARN) on '
            f'{f["nodes"]} nodes.</p>' + bars
            + _table(["check", "severity", "findings", "nodes"],
                     [[r["check_id"], _tag(r["severity"], r["severity"]), r["count"], r["nodes"]]
                      for r in f["by_check"]], numeric=(2, 3))
            + ("<h3>Nodes with the most findings</h3>" if f["top_nodes"] else "")
            + (_table(["node", "findings", "FAIL", "checks"],
                      [[t["node"], t["count"], t["fail"],
                        ", ".join(f"{c['check_id']} \u00d7{c['count']}" for c in t["checks"])]
                       for t in f["top_nodes"]], numeric=(1, 2), wrap=(3,))
               if f["top_nodes"] else ""))


@renders("xids")
def _xids(m: dict[str, Any]) -> str:
    x = m["xids"]
    bars = vbars([(f"XID {c['xid']}", c["count"], num(c["count"])) for c in x["codes"][:20]],
                 color=WARN, title="XID events by code", empty="no XID events in the window")
    head = f'<p class="meta">{x["total"]} XID events on {x["nodes"]} nodes.</p>' + bars
    if not x["codes"]:  # the chart said so
        return head
    return head + _table(["XID", "meaning (NVIDIA)", "category", "slurmgpu action", "events",
                          "nodes", "GPUs", "top nodes"],
                         [[c["xid"], c["meaning"], c["category"], c["action"] or "-", c["count"],
                           c["nodes"], c["gpus"],
                           ", ".join(f"{t['node']} ({t['count']})" for t in c["top_nodes"][:5])]
                          for c in x["codes"]], numeric=(0, 4, 5, 6), wrap=(1, 7))


@renders("ecc-trends")
def _ecc_trends(m: dict[str, Any]) -> str:
    c = m["ecc-trends"]
    rows = [[g["node"], g["gpu"], g["serial"] or "-", g["model"] or "-",
             *(num(g["rise"][k]) for k in ("ecc_corrected", "ecc_uncorrected", "remap_corrected",
                                           "remap_uncorrected")),
             ", ".join(k for k in ("remap_pending", "remap_failure") if g[k]) or "-",
             _Raw(sparkline(g["series"], label=g["series_counter"]))]
            for g in c["gpus"]]
    more = f'<p class="meta">{c["truncated"]} more GPUs left out</p>' if c["truncated"] else ""
    flags = _table(["node", "GPU", "serial", "model", "flag", "since"],
                   [[f["node"], f["gpu"], f["serial"] or "-", f["model"] or "-",
                     _tag("remap failure" if f["remap_failure"] else "remap pending",
                          "bad" if f["remap_failure"] else "WARN"), when(f["since"])]
                    for f in c["remap_flags"]], numeric=(1,))
    return (f'<p class="meta">{c["gpus_rising"]} GPUs whose ECC or row-remap counters rose in the '
            "window (rise = value at the window's end minus the value at its start).</p>"
            + _table(["node", "GPU", "serial", "model", "ECC corr +", "ECC uncorr +",
                      "remap corr +", "remap uncorr +", "flags", "trend"], rows,
                     numeric=(1, 4, 5, 6, 7)) + more
            + "<h3>Row-remap pending / failed at the window's end</h3>" + flags)


@renders("throttling")
def _throttling(m: dict[str, Any]) -> str:
    t = m["throttling"]
    out = [f'<p class="meta">Fleet: HW slowdown in {pct(t["hw_slowdown_pct"])} of '
           f'{num(t["reports"])} reports, SW thermal in {pct(t["sw_thermal_pct"])}; '
           f'{t["nodes_throttled"]} of {t["nodes_sampled"]} sampled nodes throttled at all.</p>']
    for key, label, col, color in (("leaders_hw", "HW slowdown leaders", "hw_slowdown", BAD),
                                   ("leaders_sw", "SW thermal leaders", "sw_thermal", WARN)):
        rows = t[key]
        out.append(f"<h3>{e(label)}</h3>")
        out.append(hbars([(r["node"], r[f"{col}_pct"], pct(r[f"{col}_pct"])) for r in rows],
                         color=color, title=label, empty="no node throttled in the window"))
        if rows:
            out.append(_table(["node", "share", "throttled reports", "reports"],
                              [[r["node"], pct(r[f"{col}_pct"]), r[f"{col}_reports"],
                                r["reports"]] for r in rows], numeric=(1, 2, 3)))
    return "".join(out)


@renders("ib")
def _ib(m: dict[str, Any]) -> str:
    b = m["ib"]
    more = f'<p class="meta">{b["truncated"]} more ports left out</p>' if b["truncated"] else ""
    return (f'<p class="meta">{b["ports_rising"]} ports with rising error counters, '
            f'{b["ports_flapping"]} with link-flap findings.</p>'
            + _table(["node", "port", "counters risen", "flap findings", "state", "rate Gb/s"],
                     [[p["node"], p["port"] or "-",
                       ", ".join(f"{k} +{v:,}" for k, v in sorted(p["rise"].items())) or "-",
                       p["flap_findings"], p["state"] or "-", num(p["rate_gbps"], 0)]
                      for p in b["ports"]], numeric=(3, 5), wrap=(2,)) + more)


@renders("pin-drift")
def _pin_drift(m: dict[str, Any]) -> str:
    p = m["pin-drift"]
    out = [f'<p class="meta">{shared.off_pin_count(p["nodes_off_pin"])} nodes off their [pins] '
           f"({e(', '.join(p['off_pin_nodes']) or 'none')}). Judged {e(p['judged'])}. "
           "Versions at the window's end.</p>"]
    if p["by_nodes"]:
        out.append(_table(["off-pin node", "check", "severity", "message (the node's own check)"],
                          shared.pin_finding_rows(p["by_nodes"]), row_class=lambda i: "off"))
    for name, f in p["fields"].items():
        versions = f["versions"]
        out.append(f'<h3>{e(name)} <span class="meta">({e(f["pin_key"])}; '
                   f'{f["not_reported"]} nodes not reported)</span></h3>')
        out.append(_table(["version", "nodes", "off-pin nodes"],
                          [[v["version"], v["nodes"], v["off_pin"]] for v in versions],
                          numeric=(1, 2),
                          row_class=_off_rows(versions)))
        if f["off_pin"]:
            out.append(_table(["off-pin node", "version", "pins"],
                              [[o["node"], o["version"], ", ".join(o["pins"])] for o in f["off_pin"]],
                              row_class=lambda i: "off"))
    return "".join(out)


def _off_rows(versions: Sequence[dict[str, Any]]) -> Callable[[int], str]:
    return lambda i: "off" if versions[i]["off_pin"] else ""


@renders("service")
def _service(m: dict[str, Any]) -> str:
    s = m["service"]
    err = (f'<p class="meta">automation state unreadable: {e(s["lemons_error"])}</p>'
           if s["lemons_error"] else "")
    return ("<h3>Due for service</h3>"
            + _table(["node", "lemon", "why"],
                     [[d["node"], "yes" if d["lemon"] else "", "; ".join(d["reasons"])]
                      for d in s["due"]], wrap=(2,))
            + "<h3>Lemon nodes</h3>" + err
            + _table(["node", "since", "why"],
                     [[x["node"], when(x["since"]), x["why"] or ""] for x in s["lemons"]],
                     wrap=(2,)))


@renders("jobs")
def _jobs(m: dict[str, Any]) -> str:
    j = m["jobs"]
    pb, ck, rq, ack = j["prolog_blocked"], j["checkpoints"], j["requeued"], j["ack"]
    rows = [
        ["jobs blocked by the prolog", num(pb["jobs"]), f"{pb['events']} events on {pb['nodes']} nodes"],
        ["jobs asked to checkpoint", num(ck["jobs"]),
         f"{ck['requests']} requests; " + ", ".join(f"{k} {v}" for k, v in ck["by_action"].items())],
        ["jobs requeued", num(rq["jobs"]),
         f"{rq['prolog_jobs']} refused by the prolog (Slurm requeues them), "
         f"{rq['checkpoint_jobs']} requeued after a checkpoint ({rq['events']} requeue events)"],
        ["checkpoint acks", num(ack["count"]),
         f"median {num(ack['p50_s'])} s, max {num(ack['max_s'])} s"],
        ["requests never acked", num(ack["no_ack"]), f"{ack['open']} still open"],
    ]
    return _table(["", "count", "detail"], rows, numeric=(1,), wrap=(2,))


@renders("mtbf")
def _mtbf(m: dict[str, Any]) -> str:
    return ('<p class="meta">Node-hours observed in the window divided by the failures '
            "counted; n/a when there was none.</p>"
            + _table(MTBF_HEADERS, mtbf_rows(m), numeric=range(1, 7)))


@renders("verdict_quality")
def _verdict_quality(m: dict[str, Any]) -> str:
    q = m["verdict_quality"]
    if q["source"] is None:
        return f'<p class="meta">{e(NO_OUTCOMES)}</p>'
    return ('<p class="meta">What the drains started in the window turned out to be. Precision: '
            "the share of the judged drains (confirmed, transient, cleared by validation) that "
            "were right; not judged without one.</p>"
            + _table(VERDICT_HEADERS, verdict_rows(q["checks"]), numeric=range(1, 7))
            + "<h3>By GPU model</h3>"
            + _table(VERDICT_HEADERS, verdict_rows(q["by_gpu_model"]), numeric=range(1, 7)))


@renders("return-to-service")
def _return_to_service(m: dict[str, Any]) -> str:
    r = m["return-to-service"]
    if r["source"] is None:
        return f'<p class="meta">{e(NO_OUTCOMES)}</p>'
    return ('<p class="meta">From drain to return (or to the repair hand-off), per step, of the '
            f"drains resolved in the window. Validations run: {e(validation_runs(r['validations']))}.</p>"
            + _table(RETURN_HEADERS, return_rows(r["steps"]), numeric=range(1, 5)))


_RENDER = renders.complete()


def render(model: dict[str, Any]) -> str:
    w = model["window"]
    nav = "".join(f'<a href="#{s}">{e(TITLES[s])}</a>' for s in SECTIONS)
    sections = "".join(f'<section id="{s}"><h2>{e(TITLES[s])}</h2>{_RENDER[s](model)}</section>\n'
                       for s in SECTIONS)
    src = model.get("source") or {}
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Fleet health {e(w['from'])} \u2013 {e(w['to'])}</title>"
        f"<style>{CSS}</style></head><body><main>"
        "<header><h1>Fleet health report</h1>"
        f'<p class="meta">Window {e(when(w["from_ts"]))} → {e(when(w["to_ts"]))} '
        f'({e(duration(w["seconds"]))}) · generated {e(model["generated_at"])}'
        + (f' · {e(src.get("db"))}' if src.get("db") else "")
        + f"</p></header><nav>{nav}</nav>\n{sections}"
        f'<footer>slurmgpu report · {e(model["schema"])} · all times UTC</footer>'
        "</main></body></html>\n")
