"""The report's "GPUs compared" section: per model and batch, a table with GPUs as rows and precision
modes as columns (samples/s, speedup over fp32 on that GPU, samples/s per watt, MFU, samples per $
with a price file), the same as a grouped bar chart, and with --reference GPU a table of each GPU's
samples/s over that GPU's. Modes a GPU lacks are drawn as labelled crosses, never as zero bars; GPUs a run
predicted (labelled "(predicted)") are hatched bars and "predicted: ~..." cells.
The figures are analysis/gpus.py's; this only draws them."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from amp_bench import modes
from amp_bench.analysis.gpus import pivot_cells, reference_view
from amp_bench.store.flags import is_true

TITLE = "GPUs compared"
ABSENT = ("Only one GPU (or CPU) in these results: run the suite on several (`run --executor slurm "
          "--slurm-partition a100,h100`, docs/cluster.md) or merge run directories from several machines.")


def table(data) -> pd.DataFrame:
    """The long table (one row per case, GPU and mode), or empty with fewer than two GPUs."""
    if not data.has_benchmarks:
        return pd.DataFrame()
    out = data.gpus
    return out if out["gpu"].nunique() >= 2 else out.iloc[0:0]


def figure(long: pd.DataFrame):
    """samples/s per GPU and mode, one row of bars per case; crosses where a mode did not run."""
    if long.empty:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    cases = list(dict.fromkeys(long["case"]))
    fig = make_subplots(rows=len(cases), cols=1, subplot_titles=cases, vertical_spacing=0.25 / max(1, len(cases)))
    shown = set()
    colours = modes.colours()
    order = modes.order()
    for row, case in enumerate(cases, start=1):
        part = long[long["case"] == case]
        gpus = list(dict.fromkeys(part["gpu"]))
        for mode in sorted(part["precision"].unique(), key=lambda m: order.index(m) if m in order else 99):
            rows = part[part["precision"] == mode].set_index("gpu").reindex(gpus)
            measured = rows["throughput"].notna()
            predicted = [is_true(v) for v in rows.loc[measured, "predicted"]]  # hatched: never read as measured
            fig.add_trace(go.Bar(
                x=[g for g, m in zip(gpus, measured, strict=True) if m], y=rows.loc[measured, "throughput"], name=mode,
                offsetgroup=mode, legendgroup=mode, showlegend=mode not in shown,
                marker=dict(color=colours.get(mode), pattern=dict(shape=["/" if p else "" for p in predicted]),
                            opacity=[0.55 if p else 1.0 for p in predicted]),
                hovertext=[f"{mode} on {g}: {t:,.1f} samples/s" + (" (predicted, not measured)" if p else "")
                           for (g, t), p in zip(rows.loc[measured, "throughput"].items(), predicted, strict=True)],
                hoverinfo="text"), row=row, col=1)
            shown.add(mode)
            missing = rows[~measured & rows["status"].notna()]
            if not missing.empty:  # a mode this GPU lacks: a labelled, hatched slot, never a zero bar
                height = float(part["throughput"].max() or 1.0) * 0.06
                fig.add_trace(go.Bar(
                    x=list(missing.index), y=[height] * len(missing), offsetgroup=mode, legendgroup="not supported",
                    name="not supported / not measured", showlegend="missing" not in shown,
                    text=["not supported" if s == "unsupported" else str(s) for s in missing["status"]],
                    textposition="outside", cliponaxis=False,
                    marker=dict(color="rgba(0,0,0,0)", line=dict(color="black", width=1.5), pattern=dict(shape="x")),
                    hovertext=[f"{mode} on {g}: {s} ({r})" for g, s, r in zip(missing.index, missing["status"],
                                                                           missing["reason"], strict=True)],
                    hoverinfo="text"), row=row, col=1)
                shown.add("missing")
        fig.update_yaxes(title_text="samples / s", row=row, col=1)
    fig.update_layout(barmode="group", template="plotly_white", height=max(380, 330 * len(cases) + 80),
                      title="GPUs compared: samples/s per mode (crosses: the GPU cannot run that mode; hatched: "
                            "predicted, not measured)",
                      legend_title_text="", margin=dict(t=80, r=20))
    return fig


def _prices_note(long: pd.DataFrame, data) -> str:
    if not data.prices:
        return ("No price file: pass `report --prices prices.yaml` (GPU name or partition: price per GPU-hour) "
                "for samples per dollar.")
    unpriced = sorted(set(long.loc[long["price_per_gpu_hour"].isna(), "gpu"]))
    return "Samples per $ = samples/s x 3600 / (price per GPU-hour x GPUs)." + (
        f" No price for: {'; '.join(unpriced)}." if unpriced else "")


def section_html(long: pd.DataFrame, data, html_table) -> str:
    if long.empty:
        return ""
    parts = ["<p class='note'>Per model and batch: each GPU's own speedup over "
             f"{html.escape(modes.reference())} (measured in the same run), samples/s per watt from NVML energy, "
             "MFU against that GPU's dense peak. " + html.escape(_prices_note(long, data)) + "</p>"]
    for case, grid in pivot_cells(long).items():
        parts += [f"<h3>{html.escape(case)}</h3>", html_table(grid, lambda c, r: "text" if c != "GPU" else "")]
    if data.reference:
        view = reference_view(long, data.reference)
        parts += [f"<h3>Against {html.escape(view['reference'].iloc[0])}</h3>", html_table(_reference_grid(view))]
    return "\n".join(parts)


def _reference_grid(view: pd.DataFrame) -> pd.DataFrame:
    def cell(r) -> str:
        return f"{r['vs_reference']:.2f}x" if np.isfinite(r["vs_reference"]) else (r["note"] or "-")
    view = view.assign(cell=view.apply(cell, axis=1))
    grid = view.pivot_table(index=["case", "gpu"], columns="precision", values="cell", aggfunc="first", sort=False)
    grid = grid.reindex(columns=[m for m in modes.order() if m in grid.columns]).astype(object)
    return grid.where(grid.notna(), "not run").reset_index().rename(columns={"gpu": "GPU"})


def markdown(long: pd.DataFrame, data, markdown_table) -> list[str]:
    if long.empty:
        return []
    lines = ["## GPUs compared", "", _prices_note(long, data), ""]
    for case, grid in pivot_cells(long).items():
        lines += [f"### {case}", "", markdown_table(grid), ""]
    if data.reference:
        view = reference_view(long, data.reference)
        lines += [f"### Against {view['reference'].iloc[0]}", "", markdown_table(_reference_grid(view)), ""]
    return lines
