"""A static dashboard for a results tree (like `asv publish`): one self-contained HTML page with a
trend chart per case and machine, the red series first, changes and annotations marked, and links
to each night's report. plotly is imported here only, lazily.

Written by `amp_bench nightly TREE --dashboard PATH`. At fleet size the page draws the red series,
then series with changes, up to `max_charts`; every series is in the table underneath.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path

from amp_bench.errors import UserError


def _night_link(root: Path, run_id: str, page: Path) -> str | None:
    """The run's own report, when `amp_bench run` wrote one into the tree (RUN/report.html or
    reports/RUN.html), relative to the page; else the run directory."""
    return next((os.path.relpath(candidate, page.parent) for candidate in
                 (root / run_id / "report.html", root / "reports" / f"{run_id}.html", root / run_id)
                 if candidate.exists()), None)


def build_figures(result, max_charts: int = 60) -> list[tuple[str, dict, bool]]:
    """(title, plotly figure as a dict, red) per chart, red series first."""
    import plotly.graph_objects as go
    history = result.history
    states = {(s.case_id, s.fingerprint): s for s in history.states if s.metric == "step_time_ms"}
    changed = {(c.case_id, c.fingerprint) for c in history.changes if c.metric == "step_time_ms"}
    keys = sorted(states, key=lambda k: (not states[k].red, k not in changed, k[1], k[0]))[:max_charts]
    groups = dict(tuple(history.series.groupby(["case_id", "fingerprint"], sort=False)))
    out = []
    for key in keys:
        g, s = groups[key], states[key]
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=g["timestamp"].astype(str), y=g["step_time_ms"], mode="lines+markers",
                                 name="median step time (ms)", customdata=g["run_id"],
                                 hovertemplate="%{x}<br>%{y:.4g} ms<br>%{customdata}<extra></extra>",
                                 line=dict(color="#c0392b" if s.red else "#2c3e50")))
        fig.add_hline(y=s.accepted_level, line_dash="dot", line_color="#7f8c8d",
                      annotation_text="accepted level" + (f" ({s.accepted_note})" if s.accepted_note else ""))
        for c in history.changes:
            if (c.case_id, c.fingerprint, c.metric) != (*key, "step_time_ms"):
                continue
            when = g.loc[g["run_id"] == c.run_id, "timestamp"]
            if when.empty:
                continue
            colour = "#27ae60" if c.kind == "improvement" or c.accepted else "#c0392b"
            label = f"{c.kind} {c.ratio - 1:+.1%}" + (f" accepted: {c.note}" if c.accepted else "")
            fig.add_vline(x=str(when.iloc[0]), line_dash="dash", line_color=colour)
            fig.add_annotation(x=str(when.iloc[0]), y=1, yref="paper", text=html.escape(label), showarrow=False,
                               font=dict(size=10, color=colour), xanchor="left")
        title = f"{key[0]} @ {s.hostname or key[1]} ({key[1]})" + (
            f" - RED {s.ratio - 1:+.1%} since {s.since_date}" if s.red else "")
        fig.update_layout(title=title, height=300, margin=dict(l=50, r=20, t=40, b=30), showlegend=False,
                          template="plotly_white")
        out.append((title, json.loads(fig.to_json()), s.red))
    return out


def render(result, page: Path, max_charts: int = 60) -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UserError("the dashboard needs plotly (pip install plotly)") from None
    root = Path(result.root)
    figures = build_figures(result, max_charts)
    charts = "\n".join(
        f'<div class="chart{" red" if red else ""}" id="c{i}"></div>' for i, (_, _, red) in enumerate(figures))
    data = json.dumps([f for _, f, _ in figures])
    rows = []
    for s in result.history.states:
        if s.metric != "step_time_ms":
            continue
        link = _night_link(root, s.latest_run, page)
        night = f'<a href="{html.escape(link)}">{html.escape(s.latest_run)}</a>' if link else html.escape(s.latest_run)
        status = f'<b class="r">red {s.ratio - 1:+.1%} since {s.since_date}</b>' if s.red else "green"
        rows.append(f"<tr><td>{status}</td><td>{html.escape(s.hostname)} ({html.escape(s.fingerprint)})</td>"
                    f"<td>{html.escape(s.suite)}</td><td>{html.escape(s.case_id)}</td><td>{night}</td>"
                    f"<td>{s.latest_value:.4g}</td><td>{s.accepted_level:.4g}</td></tr>")
    changes = "".join(
        f"<tr><td>{c.date}</td><td>{html.escape(c.fingerprint)}</td><td>{html.escape(c.case_id)}</td><td>{c.metric}</td>"
        f"<td>{c.ratio - 1:+.1%}</td><td>{c.kind}</td><td>{html.escape(c.note) if c.accepted else ''}</td></tr>"
        for c in sorted(result.history.changes, key=lambda c: c.date, reverse=True)[:500])
    nights = sorted({(g.date, g.hostname, g.suite, g.tonight) for g in result.groups}, reverse=True)
    night_links = "".join(
        f'<li>{d} {html.escape(h)} {html.escape(s)}: '
        + (f'<a href="{html.escape(link)}">{html.escape(r)}</a>' if (link := _night_link(root, r, page))
           else html.escape(r))
        + "</li>" for d, h, s, r in nights)
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in result.history.warnings)
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>amp_bench dashboard: {html.escape(result.summary)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em}} .r{{color:#c0392b}}
table{{border-collapse:collapse;font-size:13px}}
td,th{{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left}} .chart{{border:1px solid #eee;margin:6px 0}}
.chart.red{{border-color:#c0392b}}</style>
<script>{get_plotlyjs()}</script></head><body>
<h1>amp_bench nightly: {html.escape(result.summary)}</h1>
<p>{html.escape(result.root)}: {len(result.groups)} machine/suite series groups, {result.red_cases} red series.
Charts: red series first, then series with changes ({len(figures)} shown).</p>
{f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else ""}
<h2>Tonight</h2><ul>{night_links}</ul>
<h2>Trends (median step time per night; dashed: changes, dotted: accepted level)</h2>{charts}
<h2>Every series (step time)</h2><table><tr><th>state</th><th>machine</th><th>suite</th><th>case</th>
<th>latest night</th><th>latest ms</th><th>accepted ms</th></tr>{"".join(rows)}</table>
<h2>Changes in the history</h2><table><tr><th>date</th><th>machine</th><th>case</th><th>metric</th><th>change</th>
<th>kind</th><th>annotation</th></tr>{changes}</table>
<script>const FIGS={data};FIGS.forEach((f,i)=>Plotly.newPlot('c'+i,f.data,f.layout,{{displaylogo:false}}));</script>
</body></html>
"""


def write_dashboard(result, path: str | Path, max_charts: int = 60) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(result, path, max_charts), encoding="utf-8")
    return path


__all__ = ["build_figures", "render", "write_dashboard"]
